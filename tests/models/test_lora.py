"""LoRA on the Llama family (`[model] lora_rank`, `lora_alpha`, `lora_targets`): a run moves
only the adapters, which alone hold optimizer state; the export merges them, and transformers
then gives the trained model's logits and greedy tokens; bad settings are named."""

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.config import LlamaConfig
from podkit.errors import ConfigError
from podkit.models.gpt import generate
from podkit.models.llama import build_llama, is_lora

TARGETS = ["q", "k_proj", "v", "o", "gate", "up", "down"]  # transformers' names taken too


def keyed(tree):
    return {tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_a_lora_run_moves_only_the_adapters_and_its_merged_export_is_the_model(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = LlamaConfig(layers=2, heads=4, kv_heads=2, embed=32, mlp=48, vocab_chunk=0,
                         sample_tokens=0, lora_rank=4, lora_alpha=8.0, lora_targets=TARGETS)
    with pk.FSDP().scope():
        model = build_llama(config, {"vocab_size": 128, "seq_len": 32})
        model.compile(optimizer=pk.optimizers.AdamW(1e-2),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    tokens = np.random.default_rng(0).integers(0, 128, (32, 17)).astype("int32")
    model.build((16,), dtype="int32")
    before = keyed(model.state.params)
    adapters = {p for p in before if is_lora(p)}
    assert len(adapters) == 2 * 7  # A and B of each target (stacked layers)
    assert len(model.trainable_weights) == len(adapters)
    history = model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=8, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    after = keyed(model.state.params)
    for path, value in before.items():
        moved = not np.array_equal(value, after[path])
        assert moved == (path in adapters), path  # B starts at zero: both A and B move
    # Adam's two moments for the adapters alone (plus its counters)
    moments = sum(leaf.size for leaf in jax.tree.leaves(model.state.opt_state)
                  if getattr(leaf, "ndim", 0) > 0)
    assert moments == 2 * sum(before[p].size for p in adapters)

    pk.models.save_hf(model, tmp_path / "merged")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in back.named_parameters())
    with torch.no_grad():
        theirs = back(torch.tensor(tokens[:2, :16], dtype=torch.long)).logits.numpy()
    ours = model.predict(tokens[:2, :16], verbose=0)
    assert float(np.abs(ours - theirs).max()) < 1e-4
    prompt = [int(t) for t in tokens[0, :4]]
    with torch.no_grad():
        greedy = back.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                               pad_token_id=0)[0, 4:].tolist()
    assert generate(model, prompt, 12, top_k=1) == greedy  # generation runs the adapters


@pytest.mark.parametrize("changes,match", [
    ({"lora_targets": ["qq"]}, r"lora_targets holds 'qq'; the projections are q, k, v"),
    ({"lora_targets": []}, r"lora_targets is empty"),
    ({"lora_rank": -1}, r"lora_rank = -1; an int >= 0"),
    ({"lora_alpha": 0.0}, r"lora_alpha = 0.0; it must be > 0"),
])
def test_bad_lora_settings_are_named(changes, match):
    config = LlamaConfig(layers=1, heads=2, embed=16, mlp=24, lora_rank=2)
    for key, value in changes.items():
        setattr(config, key, value)
    with pytest.raises(ConfigError, match=match):
        build_llama(config, {"vocab_size": 64, "seq_len": 8})
