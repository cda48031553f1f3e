"""A Hugging Face config.json to podkit's model config, key by key, and back.

Every key of config.json is one of: read (it sizes or switches podkit's model: hidden_size,
rope_theta, scale_attn_weights, ...), refused when its value asks for what podkit's model
does not compute (a ConfigError naming the key, its value and what podkit has), or known to
say nothing about the logits the weights give (`IRRELEVANT`, each with its reason: token
ids, the storage dtype, transformers' own switches). A key in none of these (a newer
transformers', another family's) is warned about by name: podkit never drops a setting
without a word. tests/hf/test_config_flips.py changes every key of each family's config.json
and checks that the logits stay transformers' or the key is refused by name.
"""

from __future__ import annotations

import warnings
from typing import Any

from podkit.config import GPTConfig, LlamaConfig
from podkit.errors import ConfigError

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
FAMILIES = (*LLAMA_FAMILY, "gpt2")

_IDS = "a token id for generation and padding, not part of the forward pass (an export keeps it)"
# Keys that do not change the logits of a checkpoint's weights, and why.
IRRELEVANT = {
    "architectures": "the class transformers builds; model_type names the family",
    "model_type": "read first: it picks the family",
    "transformers_version": "the version that wrote the file",
    "dtype": "the weights' storage dtype: podkit keeps float32 master weights (an export "
             "writes this dtype by default)",
    "torch_dtype": "transformers 4's name of dtype",
    "bos_token_id": _IDS, "eos_token_id": _IDS, "pad_token_id": _IDS, "sep_token_id": _IDS,
    "decoder_start_token_id": _IDS,
    "use_cache": "transformers' KV-cache switch for its generate()",
    "initializer_range": "the standard deviation of a random init; the weights come from the "
                         "files",
    "_name_or_path": "where transformers loaded it from",
    "return_dict": "transformers' output type", "output_attentions": "transformers' outputs",
    "output_hidden_states": "transformers' outputs", "torchscript": "a tracing switch",
    "id2label": "labels of a classification head", "label2id": "labels of a classification head",
    "problem_type": "a classification head's loss", "finetuning_task": "a note",
    "task_specific_params": "generation presets of transformers' pipelines",
    "tokenizer_class": "the tokenizer's class (tokenizer.json is read as it is)",
    "prefix": "a pipeline's text prefix", "is_decoder": "an encoder-decoder switch",
    "chunk_size_feed_forward": "how transformers chunks the MLP over time: the same values",
}
GPT2_IRRELEVANT = {
    "summary_type": "GPT2DoubleHeadsModel's classifier, not the language model",
    "summary_use_proj": "GPT2DoubleHeadsModel's classifier",
    "summary_activation": "GPT2DoubleHeadsModel's classifier",
    "summary_proj_to_labels": "GPT2DoubleHeadsModel's classifier",
    "summary_first_dropout": "GPT2DoubleHeadsModel's classifier",
    "n_ctx": "transformers 2's copy of n_positions, not read by transformers",
    "reorder_and_upcast_attn": "podkit's attention scores and softmax are float32 already "
                               "(transformers applies it in its eager attention only)",
}
LLAMA_IRRELEVANT = {
    "pretraining_tp": "how Meta split the matmuls in pretraining; transformers 5 computes the "
                      "same product whatever it says",
}


class _Keys:
    """config.json's dict, recording which keys the mapping read."""

    def __init__(self, hf: dict) -> None:
        self.hf, self.read = hf, set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.hf.get(key)
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return key in self.hf

    def refuse_unless(self, key: str, ok: Any, default: Any, why: str) -> Any:
        """The key's value (its default when absent); a ConfigError naming it unless
        `ok(value)`."""
        value = self.get(key, default)
        if not ok(value):
            raise ConfigError(f"config.json's {key} = {value!r}: {why}")
        return value

    def unread(self, irrelevant: dict) -> list[str]:
        return sorted(set(self.hf) - self.read - set(irrelevant) - set(IRRELEVANT))


def _warn_unread(keys: _Keys, irrelevant: dict, family: str) -> None:
    unread = keys.unread(irrelevant)
    if unread:
        warnings.warn(f"podkit: config.json's {', '.join(unread)} ({family}): keys podkit does "
                      "not read. If they change the model, podkit's logits are not "
                      "transformers' (podkit reads the keys docs/llm.md lists).", stacklevel=3)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# transformers' max_position_embeddings when config.json leaves it out, by family.
_CONTEXTS = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768}


def _rope(keys: _Keys) -> dict:
    """RoPE's settings wherever the config keeps them: transformers 5's `rope_parameters`, or
    the older `rope_theta` and `rope_scaling`."""
    params = dict(keys.get("rope_parameters") or {})
    scaling = dict(keys.get("rope_scaling") or {})
    theta = params.get("rope_theta", keys.get("rope_theta", 10000.0))
    out = {"theta": theta,
           **{k: v for k, v in {**scaling, **params}.items() if k != "rope_theta"}}
    out["type"] = out.get("rope_type", out.get("type", "default")) or "default"
    return out


def _sliding_layers(keys: _Keys, kind: str) -> tuple[int | None, list[int]]:
    """(the window, the layers transformers gives it), as transformers 5 decides: Mistral
    every layer when sliding_window is set (4096 when the key is absent); Qwen2/3 the
    layers `layer_types` marks "sliding_attention" (by default those from
    max_window_layers on), only with use_sliding_window."""
    layers = keys.get("num_hidden_layers")
    keys.read.add("sliding_window")
    window = keys.hf["sliding_window"] if "sliding_window" in keys.hf else 4096
    if kind == "mistral":
        return window, list(range(layers)) if window is not None else []
    if kind not in ("qwen2", "qwen3"):
        return None, []
    if not keys.get("use_sliding_window", False):
        window = None
    first = keys.get("max_window_layers", 28)
    types = keys.get("layer_types")
    if types is None:
        types = ["sliding_attention" if window is not None and i >= first
                 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or any(
            t not in ("full_attention", "sliding_attention") for t in types):
        raise ConfigError(f"config.json's layer_types = {types!r}: podkit reads one of "
                          f"'full_attention' / 'sliding_attention' per layer ({layers}).")
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if window is None and sliding:  # transformers fails on it too
        raise ConfigError(f"config.json's layer_types = {types!r} marks layers {sliding} "
                          "sliding_attention, but there is no window (sliding_window = "
                          f"{keys.hf.get('sliding_window')!r}, use_sliding_window = "
                          f"{keys.hf.get('use_sliding_window')!r}).")
    return window, sliding if window is not None else []


def model_config(hf: dict) -> tuple[Any, int, int]:
    """(podkit model config, vocabulary size, context length) of a config.json's dict; a
    ConfigError naming the key for what podkit's model does not compute."""
    keys = _Keys(hf)
    kind = keys.get("model_type")
    if kind not in FAMILIES:
        raise ConfigError(f"config.json's model_type = {kind!r}: podkit reads "
                          f"{', '.join(FAMILIES)} (architectures {hf.get('architectures')}).")
    if kind == "gpt2":
        return _gpt2_config(keys)
    keys.refuse_unless("hidden_act", lambda v: v == "silu", "silu",
                       "podkit's Llama MLP is SwiGLU (silu).")
    keys.refuse_unless("mlp_bias", lambda v: v is False, False,
                       "podkit's Llama MLP has no biases.")
    bias = keys.get("attention_bias", False)
    if bias is not False:
        raise ConfigError(f"config.json's attention_bias = {bias!r}: podkit's Llama has "
                          "biases on q, k, v only and only as Qwen2 (model_type qwen2), none "
                          "on o_proj.")
    keys.refuse_unless("attention_dropout", lambda v: v == 0, 0.0,
                       "podkit's Llama family has no attention dropout (set it to 0.0 to "
                       "train without it).")
    rope = _rope(keys)
    if rope["type"] not in ("default", "llama3"):
        raise ConfigError(f"config.json's rope_type = {rope['type']!r}: podkit has 'default' "
                          "and 'llama3' (Llama 3.1's scaling).")
    heads = keys.get("num_attention_heads")
    embed = keys.get("hidden_size")
    layers = keys.get("num_hidden_layers")
    for key, value in (("num_attention_heads", heads), ("hidden_size", embed),
                       ("num_hidden_layers", layers),
                       ("intermediate_size", keys.get("intermediate_size")),
                       ("vocab_size", keys.get("vocab_size"))):
        if not _positive_int(value):
            raise ConfigError(f"config.json's {key} = {value!r}: a positive integer.")
    head_dim = keys.get("head_dim") or embed // heads
    if not _positive_int(head_dim) or ("head_dim" not in hf and embed % heads):
        raise ConfigError(f"config.json's hidden_size = {embed} does not split into "
                          f"num_attention_heads = {heads}; give head_dim.")
    kv_heads = keys.get("num_key_value_heads") or heads
    if not _positive_int(kv_heads) or heads % kv_heads:
        raise ConfigError(f"config.json's num_key_value_heads = {kv_heads!r} does not divide "
                          f"num_attention_heads = {heads}.")
    # transformers' own default where config.json leaves it out (5.15's classes)
    seq_len = int(keys.get("max_position_embeddings", _CONTEXTS.get(kind, 2048)))
    window, sliding = _sliding_layers(keys, kind)
    if sliding and window < seq_len:
        raise ConfigError(f"config.json's sliding_window = {window} (below the context of "
                          f"{seq_len}, on layers {sliding}): podkit's attention has no "
                          "sliding window.")
    scaling = {}
    if rope["type"] == "llama3":
        wanted = ("factor", "low_freq_factor", "high_freq_factor",
                  "original_max_position_embeddings")
        missing = [k for k in wanted if k not in rope]
        if missing:
            raise ConfigError(f"config.json's llama3 RoPE scaling lacks {', '.join(missing)} "
                              f"(it has {sorted(rope)}); llama3 scaling needs all of "
                              f"{', '.join(wanted)}.")
        scaling = dict(rope_scaling="llama3", rope_factor=float(rope["factor"]),
                       rope_low_freq_factor=float(rope["low_freq_factor"]),
                       rope_high_freq_factor=float(rope["high_freq_factor"]),
                       rope_original_context=int(rope["original_max_position_embeddings"]))
    config = LlamaConfig(
        layers=layers, heads=heads, kv_heads=kv_heads,
        head_dim=0 if head_dim * heads == embed and "head_dim" not in hf else head_dim,
        embed=embed, mlp=keys.get("intermediate_size"), rope_theta=float(rope["theta"]),
        norm_eps=float(keys.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(keys.get("tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2", qk_norm=kind == "qwen3", context=seq_len, **scaling)
    _warn_unread(keys, LLAMA_IRRELEVANT, kind)
    return config, int(keys.get("vocab_size")), seq_len


def _gpt2_config(keys: _Keys) -> tuple[GPTConfig, int, int]:
    keys.refuse_unless("activation_function", lambda v: v in ("gelu_new", "gelu_pytorch_tanh"),
                       "gelu_new", "podkit's GPT uses the tanh approximation of GELU "
                       "(GPT-2's gelu_new).")
    keys.refuse_unless("layer_norm_epsilon", lambda v: abs(float(v) - 1e-5) <= 1e-12, 1e-5,
                       "podkit's GPT normalizes with 1e-5 (GPT-2's).")
    keys.refuse_unless("add_cross_attention", lambda v: v is False, False,
                       "podkit's GPT has no cross-attention (an encoder-decoder's).")
    # Training-time rates (transformers' GPT2Config defaults 0.1 each): podkit's GPT drops
    # out the embeddings and the residual branches at one rate, the probabilities at another.
    resid, embd = keys.get("resid_pdrop", 0.1), keys.get("embd_pdrop", 0.1)
    if resid != embd:
        raise ConfigError(f"config.json's embd_pdrop = {embd} and resid_pdrop = {resid}: "
                          "podkit's GPT has one dropout rate for both (model.dropout).")
    embed, heads, layers = keys.get("n_embd"), keys.get("n_head"), keys.get("n_layer")
    for key, value in (("n_embd", embed), ("n_head", heads), ("n_layer", layers),
                       ("n_positions", keys.get("n_positions")),
                       ("vocab_size", keys.get("vocab_size"))):
        if not _positive_int(value):
            raise ConfigError(f"config.json's {key} = {value!r}: a positive integer.")
    if embed % heads:
        raise ConfigError(f"config.json's n_embd = {embed} does not split into n_head = "
                          f"{heads} heads.")
    context = keys.get("n_positions")
    config = GPTConfig(layers=layers, heads=heads, embed=embed,
                       mlp=keys.get("n_inner") or 4 * embed, context=context,
                       dropout=float(resid), attn_dropout=float(keys.get("attn_pdrop", 0.1)),
                       scale_attn=bool(keys.get("scale_attn_weights", True)),
                       scale_attn_by_layer=bool(keys.get("scale_attn_by_inverse_layer_idx",
                                                         False)))
    keys.get("tie_word_embeddings")  # read by hf.load_weights (the head is wte or lm_head)
    _warn_unread(keys, GPT2_IRRELEVANT, "gpt2")
    return config, int(keys.get("vocab_size")), int(context)


def known_keys(kind: str) -> dict[str, str]:
    """The keys of `kind`'s config.json that podkit knows say nothing about the logits."""
    return {**IRRELEVANT, **(GPT2_IRRELEVANT if kind == "gpt2" else LLAMA_IRRELEVANT)}


# -- out ------------------------------------------------------------------------------------------
def hf_config(config: Any, vocab: int, seq_len: int, dtype: str = "float32",
              model_type: str | None = None, special: dict | None = None) -> dict:
    """config.json for transformers of a podkit model config: the Llama family as llama
    (qwen2 with q/k/v biases, qwen3 with q/k norm, or `model_type` when it came from one),
    the GPT as gpt2 with its own output layer (tie_word_embeddings false). `seq_len`: the
    context it records (max_position_embeddings; the GPT's is its position table's rows)."""
    special = {k: v for k, v in (special or {}).items() if v is not None}
    if isinstance(config, GPTConfig):
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "vocab_size": vocab, "n_embd": config.embed, "n_layer": config.layers,
                "n_head": config.heads, "n_inner": config.mlp, "n_positions": seq_len,
                "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                "scale_attn_weights": config.scale_attn,
                "scale_attn_by_inverse_layer_idx": config.scale_attn_by_layer,
                "resid_pdrop": config.dropout, "embd_pdrop": config.dropout,
                "attn_pdrop": config.attn_dropout, "tie_word_embeddings": False,
                "dtype": dtype,
                # GPT2Config's own defaults are GPT-2's 50256, past a smaller vocabulary.
                "bos_token_id": None, "eos_token_id": None, **special}
    from podkit.models.llama import head_dim_of, kv_heads_of

    kind = model_type or ("qwen3" if config.qk_norm else "qwen2" if config.qkv_bias
                          else "llama")
    wants = {"qwen3": config.qk_norm and not config.qkv_bias, "qwen2": config.qkv_bias
             and not config.qk_norm, "llama": not config.qk_norm and not config.qkv_bias,
             "mistral": not config.qk_norm and not config.qkv_bias}
    if not wants.get(kind, False):
        raise ConfigError(f"a model with qkv_bias = {config.qkv_bias} and qk_norm = "
                          f"{config.qk_norm} is not a {kind} model for transformers.")
    classes = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    scaling = None
    if config.rope_scaling == "llama3":
        scaling = {"rope_type": "llama3", "factor": config.rope_factor,
                   "low_freq_factor": config.rope_low_freq_factor,
                   "high_freq_factor": config.rope_high_freq_factor,
                   "original_max_position_embeddings": config.rope_original_context}
    out = {"architectures": [classes[kind]], "model_type": kind, "vocab_size": vocab,
           "hidden_size": config.embed, "intermediate_size": config.mlp,
           "num_hidden_layers": config.layers, "num_attention_heads": config.heads,
           "num_key_value_heads": kv_heads_of(config), "head_dim": head_dim_of(config),
           "max_position_embeddings": seq_len, "rms_norm_eps": config.norm_eps,
           "rope_theta": config.rope_theta, "rope_scaling": scaling, "hidden_act": "silu",
           "tie_word_embeddings": config.tie_embeddings, "attention_dropout": 0.0,
           "dtype": dtype, **special}
    if kind in ("llama", "qwen3"):
        out["attention_bias"] = False
    if kind in ("mistral", "qwen2", "qwen3"):
        out.update(sliding_window=None, use_sliding_window=False)
    return out

