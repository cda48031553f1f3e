"""podkit on a real TPU chip: skipped where JAX sees no TPU (CI, this project's CPU machines).

Run on a TPU host in ONE pytest process (one program at a time can hold the chip):

    python -m pytest -q -m tpu tests/test_tpu.py

Each test builds what it needs on `jax.devices("tpu")`; the session's virtual CPU devices
(tests/conftest.py) are not used here.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk

ROOT = Path(__file__).resolve().parents[1]


def _tpus():
    try:
        return jax.devices("tpu")
    except RuntimeError:
        return []


pytestmark = [pytest.mark.tpu,
              pytest.mark.skipif(not _tpus(), reason="no TPU: these tests run on a TPU host")]


def _scope(kind="dp"):
    """A strategy over the chip(s) (one chip: every axis of size 1 still goes through the same
    sharding and shard_map code as a pod)."""
    mesh = {"dp": {"data": -1}, "fsdp": {"fsdp": -1}, "tp": {"data": -1, "model": 1}}[kind]
    rules = {"dp": pk.DataParallel, "fsdp": pk.FSDP,
             "tp": lambda: pk.TensorParallel(model=1)}[kind]
    strategy = rules()
    assert dict(strategy.mesh.shape) == {k: (len(_tpus()) if v == -1 else v)
                                         for k, v in mesh.items()}
    return strategy


def _tiny_gpt(**over):
    from podkit.config import GPTConfig

    base = dict(layers=2, heads=4, embed=256, mlp=1024, precision="mixed_bfloat16",
                sample_tokens=0)
    return GPTConfig(**{**base, **over})


def _tokens(n, t, vocab, seed=0):
    rng = np.random.default_rng(seed)
    # A learnable sequence: each token is the previous one plus one (mod vocab).
    start = rng.integers(0, vocab, (n, 1))
    x = (start + np.arange(t + 1)) % vocab
    return x[:, :-1].astype(np.int32), x[:, 1:].astype(np.int32)


def test_the_default_backend_is_the_tpu():
    assert jax.devices()[0].platform == "tpu"
    assert pk.DataParallel().mesh.devices.flat[0].platform == "tpu"


def test_splash_attention_equals_xla_attention_on_the_chip():
    from podkit.kernels.attention import dot_product_attention

    for b, t, h, d in [(2, 1024, 12, 64), (1, 2048, 4, 128), (4, 512, 8, 64)]:
        keys = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(key, (b, t, h, d), jnp.bfloat16) for key in keys)

        def loss(q, k, v, impl):
            out = dot_product_attention(q, k, v, causal=True, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) ** 2), out

        (ls, outs), gs = jax.jit(jax.value_and_grad(lambda *a: loss(*a, "splash"),
                                                    argnums=(0, 1, 2), has_aux=True))(q, k, v)
        (lx, outx), gx = jax.jit(jax.value_and_grad(lambda *a: loss(*a, "xla"),
                                                    argnums=(0, 1, 2), has_aux=True))(q, k, v)
        np.testing.assert_allclose(np.asarray(outs, np.float32), np.asarray(outx, np.float32),
                                   atol=3e-2, rtol=3e-2)
        for a, c in zip(gs, gx, strict=True):
            a, c = np.asarray(a, np.float32), np.asarray(c, np.float32)
            assert np.abs(a - c).max() <= 0.05 * np.abs(c).max() + 1e-2, (b, t, h, d)


def test_splash_keeps_packed_examples_apart_on_the_chip():
    """Packed sequences (segment ids) with grouped-query heads: the compiled splash kernel
    equals XLA's attention under the segment mask, forward and gradients."""
    from podkit.kernels.attention import dot_product_attention

    b, t = 2, 1024
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (b, t, 8, 128), jnp.bfloat16)
    k, v = (jax.random.normal(key, (b, t, 2, 128), jnp.bfloat16) for key in keys[1:])
    ids = np.zeros((b, t), np.int32)
    ids[0, :300], ids[0, 300:700], ids[0, 700:1000] = 1, 2, 3  # then 24 padding tokens
    ids[1, :512], ids[1, 512:] = 1, 2
    ids = jnp.asarray(ids)

    def loss(q, k, v, impl):
        out = dot_product_attention(q, k, v, causal=True, segment_ids=ids, implementation=impl)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    grad = lambda impl: jax.jit(jax.value_and_grad(lambda *a: loss(*a, impl), argnums=(0, 1, 2),
                                                   has_aux=True))(q, k, v)
    (_, outs), gs = grad("splash")
    (_, outx), gx = grad("xla")
    np.testing.assert_allclose(np.asarray(outs, np.float32), np.asarray(outx, np.float32),
                               atol=3e-2, rtol=3e-2)
    for a, c in zip(gs, gx, strict=True):
        a, c = np.asarray(a, np.float32), np.asarray(c, np.float32)
        assert np.abs(a - c).max() <= 0.05 * np.abs(c).max() + 1e-2


def test_the_seed_example_learns_on_the_chip(digits):
    (x, y), (xv, yv) = digits
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Dense(128, activation="relu"),
                               pk.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=8)
    history = model.fit(x, y, batch_size=32, epochs=20, validation_data=(xv, yv), verbose=0)
    # next(iter(...)), never .pop(): devices() is the mesh's own cached set, and popping it
    # empties every later sharding's device_set on that mesh
    assert next(iter(model.state.params["layers"][0]["kernel"].devices())).platform == "tpu"
    assert history.history["val_accuracy"][-1] >= 0.95


def test_staged_images_are_laid_out_for_the_row_gather_and_learn():
    """The chip's default layout of bf16[n, 32, 32, 3] puts the rows minor; staged arrays get
    the layout XLA picks for gathering rows (rows outermost) and the step compiles for it,
    with no copy of the whole array in the program."""
    import ml_dtypes

    from podkit.train.feeds import staging

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 256).astype(np.int32)
    x = rng.standard_normal((256, 32, 32, 3)).astype(np.float32)
    x[..., 0] += np.where(y == 1, 1.0, -1.0)[:, None, None]  # the class is channel 0's sign
    x = x.astype(ml_dtypes.bfloat16)
    sharding = pk.DataParallel().replicated()
    default = jax.device_put(x, sharding).format.layout
    fmt = staging.gather_format(x.shape, x.dtype, sharding, 32)
    assert fmt is not None and fmt.layout.major_to_minor[0] == 0, (default, fmt)
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Conv2D(8, 3, activation="relu"),
                               pk.layers.GlobalAveragePooling2D(), pk.layers.Dense(2)])
        model.compile(optimizer="adam", steps_per_execution=4, metrics=["accuracy"],
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=32, epochs=15, verbose=0)
    assert history.history["accuracy"][-1] >= 0.8


@pytest.mark.parametrize("kind", ["dp", "fsdp", "tp"])
def test_a_bf16_gpt_learns_under_every_strategy(kind):
    from podkit.models.gpt import build_gpt

    x, y = _tokens(256, 256, 512)
    with _scope(kind).scope():
        model = build_gpt(_tiny_gpt(), {"vocab_size": 512, "seq_len": 256})
        model.compile(optimizer=pk.optimizers.AdamW(learning_rate=3e-3),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=4)
    history = model.fit(x, y, batch_size=16, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    # evaluate and predict on the chip agree with what fit reported.
    results = model.evaluate(x[:64], y[:64], batch_size=16, verbose=0, return_dict=True)
    assert results["loss"] < losses[0]
    logits = model.predict(x[:16], batch_size=16, verbose=0)
    assert logits.shape == (16, 256, 512) and np.isfinite(logits).all()
    assert (logits.argmax(-1) == y[:16]).mean() > 0.5


def test_a_checkpoint_of_tpu_state_restores_onto_the_chip(tmp_path):
    from podkit.models.gpt import build_gpt

    x, y = _tokens(64, 128, 256)

    def make():
        with pk.FSDP().scope():
            model = build_gpt(_tiny_gpt(), {"vocab_size": 256, "seq_len": 128})
            model.compile(optimizer=pk.optimizers.AdamW(learning_rate=1e-3),
                          loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    whole = make()  # two epochs without a break
    whole.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    first = make()  # one epoch, saved from TPU arrays ...
    first.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              checkpoint=tmp_path / "ckpt")
    second = make()  # ... restored onto the chip, then the second epoch
    second.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False,
               checkpoint=tmp_path / "ckpt")
    assert int(second.state.step) == int(whole.state.step) == 8
    for u, v in zip(jax.tree.leaves(whole.state.params), jax.tree.leaves(second.state.params),
                    strict=True):
        platforms = {d.platform for d in v.sharding.device_set}
        assert platforms == {"tpu"}, v.sharding
        np.testing.assert_allclose(np.asarray(u, np.float32), np.asarray(v, np.float32),
                                   rtol=1e-5, atol=1e-6)


def test_a_pk_data_pipeline_feeds_the_chip():
    x, y = _tokens(512, 128, 256)
    ds = (pk.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=0)
          .map(lambda a, b: (a, b), num_parallel_calls=pk.data.AUTOTUNE)
          .batch(32, drop_remainder=True).prefetch(pk.data.AUTOTUNE))
    from podkit.models.gpt import build_gpt

    with pk.DataParallel().scope():
        model = build_gpt(_tiny_gpt(layers=1), {"vocab_size": 256, "seq_len": 128})
        model.compile(optimizer=pk.optimizers.AdamW(learning_rate=3e-3),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=4)
    history = model.fit(ds, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert 0.0 <= history.history["input_wait"][-1] <= 1.0


def test_the_cli_trains_gpt_124m_for_a_few_steps(tmp_path):
    # The chip is held by this process: the CLI runs in-process (podkit.cli.main), as a
    # subprocess could not open it.
    from podkit import cli

    code = cli.main(["train", str(ROOT / "configs" / "gpt_124m.toml"),
                     "--set", f"run.dir={tmp_path}", "--set", "train.steps=20",
                     "--set", "train.steps_per_execution=10", "--set", "train.log_every=10",
                     "--set", "model.sample_tokens=8", "--set", "data.max_bytes=3000000"])
    assert code in (0, None)
    final = next(tmp_path.rglob("final.json"))
    assert final.exists()


def test_the_tfrecord_config_trains_on_the_chip_from_worker_fed_jpegs(tmp_path):
    """configs/resnet50_tfrecord.toml, small: JPEGs in TFRecord shards decoded in pk.data's
    worker processes; its batches of 4 x 32 bfloat16 128x128 images (12.6 MB a group) are
    stacked on the chip (train/feeds/placement.py)."""
    import json

    from podkit import cli

    code = cli.main(["train", str(ROOT / "configs" / "resnet50_tfrecord.toml"),
                     "--set", f"run.dir={tmp_path}", "--set", "data.generate=256",
                     "--set", "data.batch_size=32", "--set", "data.image_size=128",
                     "--set", "model.depth=18", "--set", "model.width=16",
                     "--set", "data.validation_fraction=0", "--set", "train.steps=16",
                     "--set", "train.log_every=4"])
    assert code in (0, None)
    final = json.loads(next(tmp_path.rglob("final.json")).read_text())
    assert np.isfinite(final["loss"]), final


def test_a_keras_file_of_a_model_trained_on_the_chip_loads_back_equal(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 12)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.Input((12,)), pk.layers.Dense(16, activation="relu"),
                               pk.layers.BatchNormalization(), pk.layers.Dense(2)])
        model.compile(optimizer="adam",
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    model.save(tmp_path / "m.keras")
    back = pk.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(back.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-5)


def _gpt_124m(tmp_path, *extra):
    from podkit import cli

    return cli.main(["train", str(ROOT / "configs" / "gpt_124m.toml"),
                     "--set", f"run.dir={tmp_path}", "--set", "model.sample_tokens=0",
                     "--set", "data.max_bytes=3000000", *extra])


def test_telemetry_of_gpt_124m_on_the_chip(tmp_path):
    """MFU from podkit's FLOP count agrees with the matmul FLOPs of the model worked out by
    hand; memory comes from the chip; a profile of chosen steps is written."""
    import json

    code = _gpt_124m(tmp_path, "--set", "train.steps=60", "--set", "train.log_every=10",
                     "--profile-steps", "31:40")
    assert code in (0, None)
    run = tmp_path / "gpt_124m"
    points = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    points = [p for p in points if "mfu" in p]
    last = points[-1]
    # The vocabulary the tokenizer learned from these 3 MB (under the config's 32,768).
    table = json.loads((run / "shardings.json").read_text())
    (V,) = [row["shape"][1] for row in table if row["path"] == "head" and row["kind"] == "param"]
    L, E, T = 12, 768, 1024
    # Matmul FLOPs per token: per layer qkv + output + MLP (24 E^2) and causal attention
    # (2 products of T x E, halved), the LM head (2 E V); backward twice the forward.
    per_token = 3 * (L * (24 * E * E + 2 * T * E) + 2 * E * V)
    peak = 197e12
    expected = last["tokens_per_s"] * per_token / peak
    assert last["mfu"] == pytest.approx(expected, rel=0.03), (last["mfu"], expected)
    assert last["mfu"] > 0.40  # the bench's 6N count says ~61% (it counts the embedding)
    assert 0 < last["memory_in_use_gib"] <= last["memory_limit_gib"] < 16.5
    assert last["memory_peak_gib"] >= last["memory_in_use_gib"]
    assert last["device_idle"] < 0.2 and last["goodput"] > 0
    traces = list((run / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    print(f"TELEMETRY {json.dumps(last)}")


def test_a_step_too_big_for_the_chip_fails_before_the_first_step(tmp_path, capsys):
    code = _gpt_124m(tmp_path, "--set", "data.batch_size=128", "--set", "train.microbatches=1",
                     "--set", "train.steps=10")
    message = capsys.readouterr().err
    assert code == 2, message
    assert "does not fit in device memory" in message and "FSDP" in message
    assert "GiB" in message or "G " in message
    assert not list(tmp_path.rglob("step_*"))  # nothing ran, nothing was saved
    print(f"OOM {message[:800]}")
