"""Hugging Face model directories in: config.json to a podkit model config, safetensors weights
to podkit's parameters, streamed to their shardings.

    model = pk.models.from_hf("Llama-3.2-1B/")      # config.json + model.safetensors(.index.json)
    model.tokenizer                                  # tokenizer.json's, when the directory has one

Families (config.json's `model_type`): llama, mistral, qwen2, qwen3 (podkit.models.llama) and
gpt2 (podkit.models.gpt). An architecture or option podkit lacks is a ConfigError naming it.

Layouts. transformers keeps a linear layer's weight as (out, in); podkit keeps (in, out) with
heads as their own dims: q_proj (heads * head_dim, embed) is podkit's q (embed, heads,
head_dim), o_proj (embed, heads * head_dim) its o (heads, head_dim, embed). RoPE needs no
permutation: podkit rotates halves as transformers does. GPT-2's Conv1D weights are already
(in, out); its fused c_attn (embed, 3 * embed) is podkit's qkv (3, embed, heads, head_dim).

Streaming. Each parameter is made by `jax.make_array_from_callback` on its sharding: a device's
shard reads only its rows of the memory-mapped files (podkit.interop.safetensors_files), one
layer's tensor at a time, so a checkpoint never sits in host memory whole, let alone twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from podkit.config import GPTConfig, LlamaConfig
from podkit.errors import ConfigError, InputError
from podkit.interop.safetensors_files import SafetensorsDir
from podkit.models.llama import is_lora, merge_lora

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
FAMILIES = (*LLAMA_FAMILY, "gpt2")
# The vocabulary's axis of podkit's token table (rows, embed) and output layer (embed, rows):
# padded to model.vocab_multiple in podkit, the vocabulary alone in a Hugging Face file.
VOCAB_AXIS = {("tokens",): 0, ("head",): 1}

# A transform from transformers' tensor (numpy) to podkit's layout, given the model's sizes.
Transform = Callable[[np.ndarray, dict], np.ndarray]


def read_config(directory: str | os.PathLike) -> dict:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise InputError(f"{directory} has no config.json: not a Hugging Face model directory "
                         "(save_pretrained writes config.json beside the weights).")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not JSON ({e}).") from None


def _rope(hf: dict) -> dict:
    """RoPE's settings wherever the config keeps them: transformers 5's `rope_parameters`, or
    the older `rope_theta` and `rope_scaling`."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    out = {"theta": params.get("rope_theta", hf.get("rope_theta", 10000.0)),
           **{k: v for k, v in {**scaling, **params}.items() if k != "rope_theta"}}
    out["type"] = out.get("rope_type", out.get("type", "default")) or "default"
    return out


def model_config(hf: dict) -> tuple[Any, int, int]:
    """(podkit model config, vocabulary size, context length) of a config.json's dict."""
    kind = hf.get("model_type")
    if kind not in FAMILIES:
        raise ConfigError(f"config.json's model_type = {kind!r}: podkit reads "
                          f"{', '.join(FAMILIES)} (architectures {hf.get('architectures')}).")
    if kind == "gpt2":
        return _gpt2_config(hf)
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"config.json's hidden_act = {act!r}: podkit's Llama MLP is SwiGLU "
                          "(silu).")
    if kind == "llama" and (hf.get("attention_bias") or hf.get("mlp_bias")):
        raise ConfigError("config.json's attention_bias / mlp_bias = true: podkit's Llama has "
                          "biases on q, k, v only (qwen2's), none on o_proj or the MLP.")
    rope = _rope(hf)
    if rope["type"] not in ("default", "llama3"):
        raise ConfigError(f"config.json's rope type {rope['type']!r}: podkit has 'default' and "
                          "'llama3' (Llama 3.1's scaling).")
    heads = hf["num_attention_heads"]
    embed = hf["hidden_size"]
    head_dim = hf.get("head_dim") or embed // heads
    seq_len = int(hf.get("max_position_embeddings", 2048))
    window = hf.get("sliding_window")
    if window and (kind != "qwen2" or hf.get("use_sliding_window")) and window < seq_len:
        raise ConfigError(f"config.json's sliding_window = {window} (below the context of "
                          f"{seq_len}): podkit's attention has no sliding window.")
    scaling = {}
    if rope["type"] == "llama3":
        scaling = dict(rope_scaling="llama3", rope_factor=float(rope["factor"]),
                       rope_low_freq_factor=float(rope["low_freq_factor"]),
                       rope_high_freq_factor=float(rope["high_freq_factor"]),
                       rope_original_context=int(rope["original_max_position_embeddings"]))
    config = LlamaConfig(
        layers=hf["num_hidden_layers"], heads=heads,
        kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=0 if head_dim * heads == embed and "head_dim" not in hf else head_dim,
        embed=embed, mlp=hf["intermediate_size"], rope_theta=float(rope["theta"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=kind == "qwen3", **scaling)
    return config, int(hf["vocab_size"]), seq_len


def _gpt2_config(hf: dict) -> tuple[GPTConfig, int, int]:
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConfigError(f"config.json's activation_function = {act!r}: podkit's GPT uses the "
                          "tanh approximation of GELU (GPT-2's gelu_new).")
    if abs(float(hf.get("layer_norm_epsilon", 1e-5)) - 1e-5) > 1e-12:
        raise ConfigError(f"config.json's layer_norm_epsilon = {hf['layer_norm_epsilon']}: "
                          "podkit's GPT normalizes with 1e-5 (GPT-2's).")
    embed = hf["n_embd"]
    config = GPTConfig(layers=hf["n_layer"], heads=hf["n_head"], embed=embed,
                       mlp=hf.get("n_inner") or 4 * embed)
    return config, int(hf["vocab_size"]), int(hf["n_positions"])


# -- weight names and layouts ---------------------------------------------------------------------
# Each tensor's layouts as a pair: (transformers' -> podkit's, podkit's -> transformers').
Layouts = tuple[Transform, Transform]

_SAME: Layouts = (lambda a, s: a, lambda a, s: a)
_T: Layouts = (lambda a, s: a.T, lambda a, s: a.T)
# (heads * head_dim, embed) <-> (embed, heads, head_dim): q/k/v projections
_HEADS_IN = {n: (lambda a, s, n=n: a.T.reshape(a.shape[1], s[n], s["head_dim"]),
                 lambda a, s: a.reshape(a.shape[0], -1).T) for n in ("heads", "kv_heads")}
_HEADS_BIAS = {n: (lambda a, s, n=n: a.reshape(s[n], s["head_dim"]),
                   lambda a, s: a.reshape(-1)) for n in ("heads", "kv_heads")}
# (embed, heads * head_dim) <-> (heads, head_dim, embed): the attention's output projection
_HEADS_OUT: Layouts = (lambda a, s: a.T.reshape(s["heads"], s["head_dim"], a.shape[0]),
                       lambda a, s: a.reshape(-1, a.shape[-1]).T)
# GPT-2's Conv1D weights are (in, out) already: c_attn (embed, 3 * embed) <-> (3, embed,
# heads, head_dim); its bias (3 * embed) <-> (3, heads, head_dim); c_proj (embed, embed) <->
# (heads, head_dim, embed).
_QKV_IN: Layouts = (
    lambda a, s: a.reshape(a.shape[0], 3, s["heads"], s["head_dim"]).transpose(1, 0, 2, 3),
    lambda a, s: a.transpose(1, 0, 2, 3).reshape(a.shape[1], -1))
_QKV_BIAS: Layouts = (lambda a, s: a.reshape(3, s["heads"], s["head_dim"]),
                      lambda a, s: a.reshape(-1))
_OUT_IN: Layouts = (lambda a, s: a.reshape(s["heads"], s["head_dim"], a.shape[1]),
                    lambda a, s: a.reshape(-1, a.shape[-1]))


def llama_names(c: LlamaConfig) -> tuple[dict, dict]:
    """({podkit path: (hf name, layouts)} for the top level, the same for one block with
    `{i}` for the layer) of a Llama-family model."""
    top = {("tokens",): ("model.embed_tokens.weight", _SAME),
           ("norm", "scale"): ("model.norm.weight", _SAME)}
    if not c.tie_embeddings:
        top[("head",)] = ("lm_head.weight", _T)
    p = "model.layers.{i}."
    block = {("attn_norm", "scale"): (p + "input_layernorm.weight", _SAME),
             ("mlp_norm", "scale"): (p + "post_attention_layernorm.weight", _SAME),
             ("attn", "q"): (p + "self_attn.q_proj.weight", _HEADS_IN["heads"]),
             ("attn", "k"): (p + "self_attn.k_proj.weight", _HEADS_IN["kv_heads"]),
             ("attn", "v"): (p + "self_attn.v_proj.weight", _HEADS_IN["kv_heads"]),
             ("attn", "o"): (p + "self_attn.o_proj.weight", _HEADS_OUT),
             ("mlp", "gate"): (p + "mlp.gate_proj.weight", _T),
             ("mlp", "up"): (p + "mlp.up_proj.weight", _T),
             ("mlp", "down"): (p + "mlp.down_proj.weight", _T)}
    if c.qkv_bias:
        for x, n in (("q", "heads"), ("k", "kv_heads"), ("v", "kv_heads")):
            block[("attn", f"{x}_bias")] = (p + f"self_attn.{x}_proj.bias", _HEADS_BIAS[n])
    if c.qk_norm:
        for x in ("q", "k"):
            block[("attn", f"{x}_norm", "scale")] = (p + f"self_attn.{x}_norm.weight", _SAME)
    return top, block


def gpt2_names(c: GPTConfig, tied: bool = True) -> tuple[dict, dict]:
    """As llama_names, for podkit's GPT as transformers' GPT-2. `tied`: the checkpoint's
    output layer is its token table (GPT-2's own); podkit's GPT has a head of its own, which
    it writes as lm_head (tie_word_embeddings false)."""
    top = {("tokens",): ("transformer.wte.weight", _SAME),
           ("positions",): ("transformer.wpe.weight", _SAME),
           ("norm", "scale"): ("transformer.ln_f.weight", _SAME),
           ("norm", "bias"): ("transformer.ln_f.bias", _SAME),
           ("head",): ("transformer.wte.weight" if tied else "lm_head.weight", _T)}
    p = "transformer.h.{i}."
    block = {("norm1", "scale"): (p + "ln_1.weight", _SAME),
             ("norm1", "bias"): (p + "ln_1.bias", _SAME),
             ("norm2", "scale"): (p + "ln_2.weight", _SAME),
             ("norm2", "bias"): (p + "ln_2.bias", _SAME),
             ("attn", "qkv"): (p + "attn.c_attn.weight", _QKV_IN),
             ("attn", "qkv_bias"): (p + "attn.c_attn.bias", _QKV_BIAS),
             ("attn", "out"): (p + "attn.c_proj.weight", _OUT_IN),
             ("attn", "out_bias"): (p + "attn.c_proj.bias", _SAME),
             ("mlp", "up"): (p + "mlp.c_fc.weight", _SAME),
             ("mlp", "up_bias"): (p + "mlp.c_fc.bias", _SAME),
             ("mlp", "down"): (p + "mlp.c_proj.weight", _SAME),
             ("mlp", "down_bias"): (p + "mlp.c_proj.bias", _SAME)}
    return top, block


def sizes(config: Any) -> dict:
    if isinstance(config, LlamaConfig):
        from podkit.models.llama import head_dim_of, kv_heads_of

        return {"heads": config.heads, "kv_heads": kv_heads_of(config),
                "head_dim": head_dim_of(config)}
    return {"heads": config.heads, "head_dim": config.embed // config.heads}


def names_of(config: Any, tied: bool = True) -> tuple[dict, dict]:
    return llama_names(config) if isinstance(config, LlamaConfig) else gpt2_names(config, tied)


def _get(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def load_params(abstract: dict, config: Any, tensors: SafetensorsDir, scanned: bool,
                tied: bool = True) -> dict:
    """The model's parameter tree (abstract: a pure dict of ShapeDtypeStructs with shardings)
    with every leaf made from the files, on its sharding. A tensor missing from the files, or
    of another shape than the config says, is an InputError naming it."""
    top, block = names_of(config, tied)
    s = sizes(config)
    out = jax.tree.map(lambda a: None, abstract)
    leaves = [(path, name, fns[0], None) for path, (name, fns) in top.items()]
    if scanned:
        leaves += [(("blocks", *path), name, fns[0], "stacked")
                   for path, (name, fns) in block.items()]
    else:
        leaves += [(("blocks", i, *path), name.replace("{i}", str(i)), fns[0], None)
                   for i in range(config.layers) for path, (name, fns) in block.items()]
    expected = {path for path, *_ in leaves}
    # LoRA's adapters are podkit's own (None here: load_weights keeps the model's).
    have = {path for path in (tuple(p.key if hasattr(p, "key") else p.idx for p in kp)
                              for kp, _ in jax.tree_util.tree_flatten_with_path(abstract)[0])
            if not is_lora(path)}
    if have != expected:
        raise ConfigError(f"podkit's model and the checkpoint's names differ: only podkit's "
                          f"{sorted(have - expected)[:4]}, only mapped "
                          f"{sorted(expected - have)[:4]}.")
    for path, name, fn, kind in leaves:
        target = _get(abstract, path)
        if kind == "stacked":
            first = name.replace("{i}", "0")
            _check_shape(first, _layout_shape(fn, tensors.shape(first), s), target.shape[1:])
            value = _stacked_array(target, lambda i, name=name, fn=fn: fn(
                tensors.read(name.replace("{i}", str(i))), s))
        else:
            whole = lambda name=name, fn=fn: fn(tensors.read(name), s)
            shape = _layout_shape(fn, tensors.shape(name), s)
            if path == ("positions",) and shape[0] > target.shape[0]:  # GPT-2's n_positions
                whole = lambda w=whole, n=target.shape[0]: w()[:n]
                shape = (target.shape[0], *shape[1:])
            axis = VOCAB_AXIS.get(path)
            if axis is not None and shape[axis] < target.shape[axis]:
                # podkit's table padded to model.vocab_multiple: zero rows, no token's
                pad = [(0, 0)] * len(shape)
                pad[axis] = (0, target.shape[axis] - shape[axis])
                whole = lambda w=whole, pad=tuple(pad): np.pad(w(), pad)
                shape = tuple(target.shape)
            _check_shape(name, shape, target.shape)
            value = _array(target, whole)
        _set(out, path, value)
    return out


def _layout_shape(fn: Transform, shape: tuple, s: dict) -> tuple:
    """The shape a layout transform gives a tensor of `shape`, nothing read or computed."""
    return tuple(jax.eval_shape(lambda a: fn(a, s),
                                jax.ShapeDtypeStruct(tuple(shape), np.float32)).shape)


def _check_shape(name: str, got: tuple, want: tuple) -> None:
    if tuple(got) != tuple(want):
        raise InputError(f"the checkpoint's {name} is {tuple(got)} in podkit's layout; the "
                         f"model from config.json needs {tuple(want)}.")


def _array(target: Any, whole: Callable[[], np.ndarray]) -> jax.Array:
    dtype = target.dtype
    made: list[np.ndarray] = []  # the tensor in podkit's layout, made once for all shards

    def shard(index: tuple) -> np.ndarray:
        if not made:
            made.append(whole())
        return np.asarray(made[0][index], dtype)

    return jax.make_array_from_callback(target.shape, target.sharding, shard)


def _stacked_array(target: Any, layer: Callable[[int], np.ndarray]) -> jax.Array:
    dtype = target.dtype
    made: dict[int, np.ndarray] = {}  # each layer's tensor, made once for all shards

    def shard(index: tuple) -> np.ndarray:
        first, rest = index[0], index[1:]
        ids = range(target.shape[0])[first]
        for i in ids:
            if i not in made:
                made[i] = layer(i)
        return np.stack([np.asarray(made[i][rest], dtype) for i in ids])

    return jax.make_array_from_callback(target.shape, target.sharding, shard)


def is_directory(path: Any) -> bool:
    """Whether `path` is a Hugging Face model directory (config.json, no podkit config.toml)."""
    where = Path(os.fspath(path))
    return (where / "config.json").is_file() and not (where / "config.toml").is_file()


# [model] keys that say how to run a model, not what it is: they apply over config.json's.
RUNTIME_KEYS = ("attention", "precision", "remat", "scan_layers", "vocab_chunk",
                "sample_tokens", "dropout", "lora_rank", "lora_alpha", "lora_targets")


def run_config(config: Any, directory: str | os.PathLike) -> tuple[Any, int]:
    """A `podkit train` config started from a Hugging Face directory: (the config, the
    model's vocabulary size). `[model]` becomes config.json's architecture, with the
    section's runtime keys (RUNTIME_KEYS) kept; `[data]`'s text (`files`) is read with the
    directory's tokenizer.json instead of a BPE trained anew, whose ids the embeddings would
    not mean; the loss takes logits (train.from_logits), as these models emit."""
    import dataclasses

    model, vocab, context = model_config(read_config(directory))
    user = config.model
    kept = {k: getattr(user, k) for k in RUNTIME_KEYS
            if getattr(user, "name", None) == model.name and hasattr(model, k)}
    model = dataclasses.replace(model, **kept, init_from=os.fspath(directory))
    d = config.data
    if getattr(d, "name", None) not in ("text", "instructions") or not getattr(d, "files", ""):
        raise ConfigError(f"init_from {directory} (a Hugging Face model) trains on your text: "
                          "[data] name = \"text\" (documents) or \"instructions\" (chats, "
                          "prompt/completion pairs) with files = \"...\" (read with the "
                          "model's tokenizer; the built-in corpus has a tokenizer of its own).")
    tokenizer = Path(directory) / "tokenizer.json"
    if d.tokenizer in ("train", ""):  # instruction data: the tokenizer's chat template too
        if not tokenizer.is_file():
            raise ConfigError(f"{directory} has no tokenizer.json: set data.tokenizer to the "
                              "tokenizer the model was trained with (a tokenizer.json).")
        d = dataclasses.replace(d, tokenizer=str(tokenizer))
    if d.seq_len > context:
        raise ConfigError(f"data.seq_len = {d.seq_len} is past the model's context of "
                          f"{context} (config.json); use {context} or less.")
    # These models end in logits: the loss takes them so (no [train] key needed).
    train = dataclasses.replace(config.train, from_logits=True)
    return dataclasses.replace(config, model=model, data=d, train=train), vocab


def load_weights(model: Any, directory: str | os.PathLike) -> None:
    """A built Llama-family or GPT pk.Model's parameters replaced by a Hugging Face
    directory's, streamed to their shardings (the model's config must be the directory's:
    every tensor's name and shape is checked)."""
    hf = read_config(directory)
    config = model.model_config
    state = model.state
    params = load_params(jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state.params),
        config, SafetensorsDir(directory), config.scan_layers,
        tied=bool(hf.get("tie_word_embeddings", True)))
    # The checkpoint's weights; LoRA's adapters (not in it) as the model made them.
    params = jax.tree.map(lambda new, old: old if new is None else new, params, state.params,
                          is_leaf=lambda v: v is None)
    model.state = state.replace(params=params)


def load_tokenizer(directory: str | os.PathLike) -> Any:
    """tokenizer.json's tokenizers.Tokenizer, or None when the directory has none."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def from_hf(directory: str | os.PathLike, seq_len: int | None = None, seed: int = 0) -> Any:
    """A pk.Model (uncompiled, built) of a Hugging Face model directory: the architecture from
    config.json, the weights from its safetensors files on the current strategy's shardings,
    `model.tokenizer` from tokenizer.json (None without one). `seq_len`: the context the
    model takes (default: config.json's max_position_embeddings / n_positions)."""
    hf = read_config(directory)
    config, vocab, context = model_config(hf)
    seq_len = context if seq_len is None else int(seq_len)
    if seq_len < 1 or (isinstance(config, GPTConfig) and seq_len > context):
        raise ConfigError(f"seq_len = {seq_len}: it must be >= 1 (and at most the "
                          f"{context} positions GPT-2's table holds).")
    tensors = SafetensorsDir(directory)
    if isinstance(config, LlamaConfig):
        from podkit.models.llama import build_llama as build
    else:
        from podkit.models.gpt import build_gpt as build
    del tensors  # (opened first: a directory without weights fails before any compile)
    model = build(config, {"vocab_size": vocab, "seq_len": seq_len}, seed=seed)
    model.build((seq_len,), dtype=np.int32)
    load_weights(model, directory)
    model.tokenizer = load_tokenizer(directory)
    model.hf_config = hf
    return model


# -- out ------------------------------------------------------------------------------------------
def hf_config(config: Any, vocab: int, seq_len: int, dtype: str = "float32",
              model_type: str | None = None, special: dict | None = None) -> dict:
    """config.json for transformers of a podkit model config: the Llama family as llama
    (qwen2 with q/k/v biases, qwen3 with q/k norm, or `model_type` when it came from one),
    the GPT as gpt2 with its own output layer (tie_word_embeddings false)."""
    special = {k: v for k, v in (special or {}).items() if v is not None}
    if isinstance(config, GPTConfig):
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "vocab_size": vocab, "n_embd": config.embed, "n_layer": config.layers,
                "n_head": config.heads, "n_inner": config.mlp, "n_positions": seq_len,
                "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "tie_word_embeddings": False, "dtype": dtype,
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


def _tensors(model: Any, config: Any, dtype: Any) -> list[tuple[str, tuple, Any, Any]]:
    """(name, shape, dtype, make) of every tensor of the checkpoint, in transformers' layout;
    `make()` gathers one tensor (one layer's) to this host when it is written."""
    from podkit import agree

    top, block = names_of(config, tied=False)
    s = sizes(config)
    # LoRA's adapters merged into the weights they adapt: transformers' model, as trained.
    params = merge_lora(model.state.params, getattr(model.module(), "lora_scale", None))
    out = []

    def entry(name: str, fns: Layouts, leaf: Callable[[], jax.Array], shape: tuple) -> None:
        out.append((name, _layout_shape(fns[1], shape, s), dtype,
                    lambda: fns[1](np.asarray(agree.gather(leaf())).astype(dtype), s)))

    vocab = model.module().vocab_size
    for path, (name, fns) in top.items():
        leaf = _get(params, path)
        axis = VOCAB_AXIS.get(path)
        if axis is not None and leaf.shape[axis] != vocab:  # the padding is podkit's own
            leaf = jax.lax.slice_in_dim(leaf, 0, vocab, axis=axis)
        entry(name, fns, lambda leaf=leaf: leaf, leaf.shape)
    for i in range(config.layers):
        for path, (name, fns) in block.items():
            if config.scan_layers:
                stacked = _get(params["blocks"], path)
                leaf, shape = (lambda a=stacked, i=i: a[i]), stacked.shape[1:]
            else:
                one = _get(params["blocks"][i], path)
                leaf, shape = (lambda a=one: a), one.shape
            entry(name.replace("{i}", str(i)), fns, leaf, shape)
    return out


def exported_params(model: Any) -> int:
    """The parameters save_hf writes: LoRA's adapters are merged, not counted; the token
    table's padding is cut."""
    vocab, total = model.module().vocab_size, 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(model.state.params)[0]:
        key = tuple(getattr(k, "key", k) for k in path)
        if is_lora(key):
            continue
        axis = VOCAB_AXIS.get(key)
        total += leaf.size if axis is None else leaf.size // leaf.shape[axis] * vocab
    return total


def save_hf(model: Any, directory: str | os.PathLike, tokenizer: Any = None,
            eos_token: str | None = None, dtype: str = "float32",
            max_shard_bytes: int | None = None, chat_template: str | None = None,
            bos_token: str | None = None) -> str:
    """Write a Llama-family or GPT pk.Model as a Hugging Face directory that transformers'
    `AutoModelForCausalLM.from_pretrained` loads with the same logits: config.json,
    model.safetensors (sharded with an index past 5 GB), generation_config.json, and with a
    `tokenizer` (a tokenizers.Tokenizer) tokenizer.json and tokenizer_config.json.
    `eos_token`: the end-of-text token's text (its id goes into the configs);
    `chat_template` (a Jinja source) and `bos_token` go into tokenizer_config.json. `dtype`:
    "float32" (the master weights, exactly) or "bfloat16". Every process calls it (the
    weights are gathered from all); the lead process writes. Returns the directory."""
    from podkit import paths
    from podkit.cluster import is_lead_process
    from podkit.interop.safetensors_files import SHARD_BYTES, write_checkpoint

    config = getattr(model, "model_config", None)
    if not isinstance(config, LlamaConfig | GPTConfig):
        raise ConfigError("save_hf writes podkit's Llama-family and GPT models (built by "
                          "pk.models.from_hf, from a config or a run); this model is "
                          f"{getattr(model, 'name', type(model).__name__)!r}.")
    if dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"dtype = {dtype!r}; use 'float32' or 'bfloat16'.")
    module = model.module()
    source = getattr(model, "hf_config", None) or {}
    special = {}
    if tokenizer is not None and eos_token is not None:
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise ConfigError(f"eos_token {eos_token!r} is not in the tokenizer's vocabulary.")
        bos = tokenizer.token_to_id(bos_token) if bos_token else None
        special = {"bos_token_id": eos if bos is None else bos, "eos_token_id": eos}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in source and key not in special:
            special[key] = source[key]
    kind = source.get("model_type") if isinstance(config, LlamaConfig) else None
    hf = hf_config(config, module.vocab_size, module.seq_len, dtype, kind, special)
    np_dtype = np.dtype(np.float32) if dtype == "float32" else np.dtype(
        jax.numpy.bfloat16)
    tensors = _tensors(model, config, np_dtype)
    lead = is_lead_process()
    directory = os.fspath(directory)
    if not lead:  # the gathers are collective: every process takes part in each
        for *_, make in tensors:
            make()
        return directory
    with paths.staged(directory) as local:
        local = Path(local)
        local.mkdir(parents=True, exist_ok=True)
        write_checkpoint(local, tensors, max_shard_bytes or SHARD_BYTES)
        (local / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        generation = {"_from_model_config": True, **{k: v for k, v in special.items()
                                                      if k != "pad_token_id"}}
        (local / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if tokenizer is not None:
            tokenizer.save(str(local / "tokenizer.json"))
            tok_config = {"tokenizer_class": "PreTrainedTokenizerFast",
                          "model_max_length": module.seq_len}
            if eos_token is not None:
                tok_config.update(eos_token=eos_token, bos_token=bos_token or eos_token)
            if chat_template:
                tok_config["chat_template"] = chat_template
            (local / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return directory
