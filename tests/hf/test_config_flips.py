"""Every key of each family's config.json, changed one at a time, against transformers: the
same weights (a tiny random model saved by transformers) under the changed config.json give
transformers' logits in podkit, or podkit refuses the key by name; where transformers itself
cannot load the weights under it (a missing or mismatched tensor), podkit refuses too. Never
a silent default: a key podkit would drop without computing what it says fails here."""

import json
import os
import warnings

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError, InputError
from podkit.models import hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hf_in import VOCAB, hf_model  # noqa: E402

# Families (test_hf_in's models) and what each exercises.
CASES = {"llama": "llama_gqa_rope_scaling", "mistral": "mistral", "qwen2": "qwen2_bias_tied",
         "qwen3": "qwen3_qk_norm_head_dim", "gpt2": "gpt2"}
# Keys not flipped, each for its reason (they are podkit's hf_config.IRRELEVANT too).
NOT_FLIPPED = {
    "model_type": "picks the family (another one is refused: test_hf_in's falcon case)",
    "architectures": "picks transformers' class, not a computation",
    "transformers_version": "the writer's version",
    "dtype": "transformers would load the weights in it (bfloat16 logits); podkit keeps "
             "float32 master weights and an export writes the source's dtype",
    "torch_dtype": "as dtype",
}
# A changed value where the type alone does not give one (None, strings, lists).
ALTERNATIVES = {
    "pad_token_id": 0, "bos_token_id": 3, "eos_token_id": 4, "sliding_window": 16,
    "n_inner": 128, "summary_activation": "tanh", "summary_type": "last",
    "hidden_act": "gelu", "activation_function": "relu", "rope_type": "linear",
    "layer_types": ["sliding_attention", "sliding_attention"],
}


def flips(config: dict) -> list[tuple[str, dict]]:
    """(the key's name, config.json with that key changed) for every key: a bool negated, a
    number changed by more than rounding (x2 + 0.5 for floats), other values from
    ALTERNATIVES; a dict's keys one at a time ("rope_parameters.rope_theta")."""
    out = []
    for key, value in config.items():
        if key in NOT_FLIPPED:
            continue
        if isinstance(value, dict):
            for sub, inner in value.items():
                out.append((f"{key}.{sub}", {**config, key: {**value, sub: _flip(sub, inner)}}))
        else:
            out.append((key, {**config, key: _flip(key, value)}))
    return out


def _flip(key, value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value * 2 + 0.5
    if key not in ALTERNATIVES:
        raise AssertionError(f"no changed value for {key} = {value!r}: add one to "
                             "ALTERNATIVES (or a reason to NOT_FLIPPED)")
    return ALTERNATIVES[key]


def transformers_logits(folder, tokens):
    """transformers' logits under folder's config.json, or None when it cannot load the
    weights under it (refused, or a tensor missing or of another shape)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                folder, output_loading_info=True)
    except Exception:
        return None
    if info["missing_keys"] or info["mismatched_keys"]:
        return None
    try:
        with torch.no_grad():  # no KV cache: the logits alone
            return model.eval()(torch.tensor(tokens), use_cache=False).logits.float().numpy()
    except Exception:
        return None


def podkit_reads(config: dict) -> tuple:
    """What podkit's from_hf takes from a config.json: the model config, vocabulary,
    context and (GPT-2) whether the output layer is the token table."""
    model, vocab, context = hf_config.model_config(config)
    return model, vocab, context, config.get("tie_word_embeddings", True)


@pytest.mark.parametrize("family", list(CASES))
def test_every_config_key_is_computed_or_refused_by_name(family, tmp_path, capsys):
    hf = hf_model(CASES[family], sharpen=8.0)
    base = tmp_path / "base"
    hf.save_pretrained(base)
    config = json.loads((base / "config.json").read_text())
    # every key is one podkit reads, refuses or knows to be irrelevant: none unknown
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reads = podkit_reads(config)
    assert set(NOT_FLIPPED) & set(config) <= set(hf_config.known_keys(config["model_type"]))
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 24)).astype(np.int32)
    with pk.DataParallel().scope():
        ours_base = pk.models.from_hf(base).predict(tokens, verbose=0)
    np.testing.assert_allclose(ours_base, transformers_logits(base, tokens), atol=2e-5)

    failures, table = [], []
    for i, (key, changed) in enumerate(flips(config)):
        folder = tmp_path / f"flip{i}"
        folder.mkdir()
        for name in os.listdir(base):
            if name != "config.json":
                os.symlink(base / name, folder / name)
        (folder / "config.json").write_text(json.dumps(changed))
        theirs = transformers_logits(folder, tokens)
        name = key.rpartition(".")[2]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # an unread key's warning fails it
                now = podkit_reads(changed)
            if now == reads:
                ours = ours_base  # podkit's model is the base one: its logits are
            else:
                with pk.DataParallel().scope():
                    ours = pk.models.from_hf(folder).predict(tokens, verbose=0)
        except (ConfigError, InputError) as e:
            named = name in str(e)
            table.append((key, "refused" if named else f"contradicts the files: {e}"))
            if theirs is not None and not (isinstance(e, ConfigError) and named):
                failures.append(f"{key}: transformers computes it, podkit raised without "
                                f"naming it: {e}")
            continue
        if theirs is None:
            failures.append(f"{key}: transformers cannot load the weights under it, podkit "
                            "did without a word")
            continue
        moved = float(np.abs(theirs - ours_base).max())
        table.append((key, f"computed (logits moved {moved:.2g})"))
        if not np.allclose(ours, theirs, atol=2e-5, rtol=1e-5):
            failures.append(f"{key}: podkit's logits differ from transformers' by "
                            f"{float(np.abs(ours - theirs).max()):.3g}")
    with capsys.disabled():
        print(f"\n{family}: " + "; ".join(f"{k}: {v}" for k, v in table))
    assert not failures, "\n".join(failures)
