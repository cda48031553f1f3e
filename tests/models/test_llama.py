"""podkit.models.llama: the Llama family's decoder by its config keys, trained by fit(), under
the strategies (its logical axes), scanned or not, remat, and its ConfigErrors. (That its
logits are transformers' own is tests/hf/test_hf_in.py.)"""

import dataclasses

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.config import LlamaConfig
from podkit.models import build_model
from podkit.models.llama import Llama, inverse_frequencies

SMALL = LlamaConfig(layers=2, heads=4, kv_heads=2, embed=32, mlp=48, sample_tokens=0,
                    vocab_chunk=24)
VOCAB, SEQ = 50, 16


def one_device():
    return pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1])


def tokens(rows, seed=0):
    x = np.random.default_rng(seed).integers(0, VOCAB, (rows, SEQ + 1)).astype(np.int32)
    return x[:, :-1], x[:, 1:]


def llama(config=SMALL, strategy=None, seed=3):
    with (strategy or one_device()).scope():
        model = build_model(config, {"vocab_size": VOCAB, "seq_len": SEQ}, seed=seed)
        model.compile(optimizer=pk.optimizers.Adam(3e-3),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


def test_it_learns_a_repeated_sequence_through_fit():
    # One sequence, over and over: a decoder that trains memorizes it.
    x, y = tokens(1)
    x, y = np.repeat(x, 160, 0), np.repeat(y, 160, 0)  # 20 steps of 8 an epoch
    model = llama()
    model.compile(optimizer=pk.optimizers.Adam(3e-3), steps_per_execution=20,
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    assert history.history["loss"][-1] < 0.1 * history.history["loss"][0]
    assert history.history["accuracy"][-1] == 1.0
    assert model.predict(x[:1], verbose=0).shape == (1, SEQ, VOCAB)


@pytest.mark.parametrize("remat", ["none", "minimal"])
def test_scanned_and_separate_blocks_compute_alike_under_remat(remat):
    # The same weights (separate blocks are the stacked ones' slices), the same logits, and
    # the same first two updates: remat changes what the backward pass recomputes, not what
    # it computes ("minimal" keeps the projections the block names, MaxText's preset).
    x, y = tokens(4)
    losses = {}
    for scan in (True, False):
        model = llama(dataclasses.replace(SMALL, scan_layers=scan, remat=remat))
        model.compile(optimizer=pk.optimizers.Adam(3e-3), steps_per_execution=2,
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        logits = model.predict(x, verbose=0)
        losses[scan] = (logits, model.fit(np.tile(x, (2, 1)), np.tile(y, (2, 1)),
                                          batch_size=4, epochs=1, verbose=0,
                                          shuffle=False).history["loss"],
                        model.predict(x, verbose=0))
    for ours, theirs in zip(losses[True], losses[False], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_tensor_parallel_and_fsdp_split_what_their_rules_name():
    tp = llama(strategy=pk.TensorParallel(model=2))
    tp.build((SEQ,), dtype=np.int32)
    blocks = tp.state.params["blocks"]
    spec = lambda a: tuple(a.sharding.spec)
    assert spec(blocks["attn"]["q"]) == (None, None, "model")  # (layers, embed, heads, kv)
    assert spec(blocks["mlp"]["gate"]) == (None, None, "model")
    assert spec(blocks["mlp"]["down"]) == (None, "model")
    assert spec(blocks["attn"]["k"]) == ()  # kv_heads: no built-in rule splits them
    fsdp = llama(strategy=pk.FSDP())
    fsdp.build((SEQ,), dtype=np.int32)
    assert spec(fsdp.state.params["blocks"]["attn"]["q"]) == (None, "fsdp")
    x, y = tokens(8)
    ref = llama()
    ref.build((SEQ,), dtype=np.int32)
    for model in (tp, fsdp):  # the same seed: the same weights, whatever the layout
        np.testing.assert_allclose(model.predict(x, verbose=0), ref.predict(x, verbose=0),
                                   rtol=1e-5, atol=1e-5)


def test_llama3_rope_scaling_slows_only_the_long_wavelengths():
    base = inverse_frequencies(dataclasses.replace(SMALL, head_dim=64, rope_theta=500000.0))
    scaled = inverse_frequencies(dataclasses.replace(
        SMALL, head_dim=64, rope_theta=500000.0, rope_scaling="llama3",
        rope_original_context=1024))
    wavelength = 2 * np.pi / base
    assert np.array_equal(scaled[wavelength < 1024 / 4], base[wavelength < 1024 / 4])
    np.testing.assert_allclose(scaled[wavelength > 1024], base[wavelength > 1024] / 8)
    between = (wavelength >= 1024 / 4) & (wavelength <= 1024)
    assert between.any()
    assert np.all((scaled[between] < base[between]) & (scaled[between] > base[between] / 8))


@pytest.mark.parametrize("changes,pattern", [
    ({"kv_heads": 3}, r"model.kv_heads = 3 does not divide model.heads = 4"),
    ({"embed": 30}, r"model.embed = 30 is not divisible by model.heads = 4"),
    ({"head_dim": 7}, r"RoPE rotates pairs of dims"),
    ({"rope_scaling": "llama3", "rope_low_freq_factor": 4.0}, r"rope_high_freq_factor > "
                                                                r"rope_low_freq_factor"),
    ({"remat": "everything"}, r"remat = 'everything'; valid: none, full"),
    ({"mlp": 0}, r"model.mlp = 0; it must be >= 1"),
])
def test_bad_sizes_are_config_errors_naming_the_key(changes, pattern):
    with pytest.raises(pk.ConfigError, match=pattern):
        build_model(dataclasses.replace(SMALL, **changes), {"vocab_size": VOCAB, "seq_len": SEQ})


def test_a_config_file_names_it_and_its_keys_are_checked(tmp_path):
    from podkit import config as config_lib

    path = tmp_path / "llama.toml"
    path.write_text('[model]\nname = "llama"\nkv_heads = 1\nrope_scaling = "llama3"\n'
                    '[data]\nname = "text"\n')
    assert config_lib.load(path).model == LlamaConfig(kv_heads=1, rope_scaling="llama3")
    path.write_text('[model]\nname = "llama"\nrope_scaling = "yarn"\n')
    with pytest.raises(pk.ConfigError, match="rope_scaling"):
        config_lib.load(path)
    path.write_text('[model]\nname = "llama"\nkv_head = 1\n')
    with pytest.raises(pk.ConfigError, match="kv_head"):
        config_lib.load(path)


def test_a_sequence_past_the_context_is_refused():
    model = llama()
    model.build((SEQ,), dtype=np.int32)
    with pytest.raises(pk.InputError, match="longer than the model's context of 16"):
        model.predict(np.zeros((1, SEQ + 1), np.int32), verbose=0)
    assert isinstance(model.module(), Llama)
