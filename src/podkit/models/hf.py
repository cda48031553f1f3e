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

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
FAMILIES = (*LLAMA_FAMILY, "gpt2")

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
def _t(a: np.ndarray, s: dict) -> np.ndarray:
    return a.T


def _heads_in(n: str) -> Transform:
    """(n_heads * head_dim, embed) -> (embed, n_heads, head_dim)."""
    return lambda a, s: a.T.reshape(a.shape[1], s[n], s["head_dim"])


def _heads_bias(n: str) -> Transform:
    return lambda a, s: a.reshape(s[n], s["head_dim"])


def _heads_out(a: np.ndarray, s: dict) -> np.ndarray:
    """(embed, heads * head_dim) -> (heads, head_dim, embed)."""
    return a.T.reshape(s["heads"], s["head_dim"], a.shape[0])


def _same(a: np.ndarray, s: dict) -> np.ndarray:
    return a


def llama_names(c: LlamaConfig) -> tuple[dict, dict]:
    """({podkit path: (hf name, transform)} for the top level, the same for one block with
    `{i}` for the layer) of a Llama-family model."""
    top = {("tokens",): ("model.embed_tokens.weight", _same),
           ("norm", "scale"): ("model.norm.weight", _same)}
    if not c.tie_embeddings:
        top[("head",)] = ("lm_head.weight", _t)
    p = "model.layers.{i}."
    block = {("attn_norm", "scale"): (p + "input_layernorm.weight", _same),
             ("mlp_norm", "scale"): (p + "post_attention_layernorm.weight", _same),
             ("attn", "q"): (p + "self_attn.q_proj.weight", _heads_in("heads")),
             ("attn", "k"): (p + "self_attn.k_proj.weight", _heads_in("kv_heads")),
             ("attn", "v"): (p + "self_attn.v_proj.weight", _heads_in("kv_heads")),
             ("attn", "o"): (p + "self_attn.o_proj.weight", _heads_out),
             ("mlp", "gate"): (p + "mlp.gate_proj.weight", _t),
             ("mlp", "up"): (p + "mlp.up_proj.weight", _t),
             ("mlp", "down"): (p + "mlp.down_proj.weight", _t)}
    if c.qkv_bias:
        for x, n in (("q", "heads"), ("k", "kv_heads"), ("v", "kv_heads")):
            block[("attn", f"{x}_bias")] = (p + f"self_attn.{x}_proj.bias", _heads_bias(n))
    if c.qk_norm:
        for x in ("q", "k"):
            block[("attn", f"{x}_norm", "scale")] = (p + f"self_attn.{x}_norm.weight", _same)
    return top, block


def _qkv_in(a: np.ndarray, s: dict) -> np.ndarray:
    """GPT-2's c_attn (embed, 3 * embed) -> (3, embed, heads, head_dim)."""
    return a.reshape(a.shape[0], 3, s["heads"], s["head_dim"]).transpose(1, 0, 2, 3)


def gpt2_names(c: GPTConfig) -> tuple[dict, dict]:
    top = {("tokens",): ("transformer.wte.weight", _same),
           ("positions",): ("transformer.wpe.weight", _same),
           ("norm", "scale"): ("transformer.ln_f.weight", _same),
           ("norm", "bias"): ("transformer.ln_f.bias", _same),
           # GPT-2 ties its output layer to the token table; podkit's GPT has its own head.
           ("head",): ("transformer.wte.weight", _t)}
    p = "transformer.h.{i}."
    block = {("norm1", "scale"): (p + "ln_1.weight", _same),
             ("norm1", "bias"): (p + "ln_1.bias", _same),
             ("norm2", "scale"): (p + "ln_2.weight", _same),
             ("norm2", "bias"): (p + "ln_2.bias", _same),
             ("attn", "qkv"): (p + "attn.c_attn.weight", _qkv_in),
             ("attn", "qkv_bias"): (p + "attn.c_attn.bias",
                                    lambda a, s: a.reshape(3, s["heads"], s["head_dim"])),
             ("attn", "out"): (p + "attn.c_proj.weight",
                               lambda a, s: a.reshape(s["heads"], s["head_dim"], a.shape[1])),
             ("attn", "out_bias"): (p + "attn.c_proj.bias", _same),
             ("mlp", "up"): (p + "mlp.c_fc.weight", _same),
             ("mlp", "up_bias"): (p + "mlp.c_fc.bias", _same),
             ("mlp", "down"): (p + "mlp.c_proj.weight", _same),
             ("mlp", "down_bias"): (p + "mlp.c_proj.bias", _same)}
    return top, block


def sizes(config: Any) -> dict:
    if isinstance(config, LlamaConfig):
        from podkit.models.llama import head_dim_of, kv_heads_of

        return {"heads": config.heads, "kv_heads": kv_heads_of(config),
                "head_dim": head_dim_of(config)}
    return {"heads": config.heads, "head_dim": config.embed // config.heads}


def names_of(config: Any) -> tuple[dict, dict]:
    return llama_names(config) if isinstance(config, LlamaConfig) else gpt2_names(config)


def _get(tree: dict, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def load_params(abstract: dict, config: Any, tensors: SafetensorsDir, scanned: bool) -> dict:
    """The model's parameter tree (abstract: a pure dict of ShapeDtypeStructs with shardings)
    with every leaf made from the files, on its sharding. A tensor missing from the files, or
    of another shape than the config says, is an InputError naming it."""
    top, block = names_of(config)
    s = sizes(config)
    out = jax.tree.map(lambda a: None, abstract)
    leaves = [(path, name, fn, None) for path, (name, fn) in top.items()]
    blocks = abstract["blocks"]
    layers = range(config.layers)
    if scanned:
        leaves += [(("blocks", *path), name, fn, "stacked") for path, (name, fn) in block.items()]
    else:
        leaves += [(("blocks", i, *path), name.replace("{i}", str(i)), fn, None)
                   for i in layers for path, (name, fn) in block.items()]
    expected = {path for path, *_ in leaves}
    have = {tuple(p.key if hasattr(p, "key") else p.idx for p in kp)
            for kp, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    if have != expected:
        raise ConfigError(f"podkit's model and the checkpoint's names differ: only podkit's "
                          f"{sorted(have - expected)[:4]}, only mapped "
                          f"{sorted(expected - have)[:4]}.")
    del blocks
    for path, name, fn, kind in leaves:
        target = _get(abstract, path)
        if kind == "stacked":
            def layer(i: int, name: str = name, fn: Transform = fn) -> np.ndarray:
                return fn(tensors.read(name.replace("{i}", str(i))), s)
            _check_shape(name.replace("{i}", "0"), layer(0).shape, target.shape[1:])
            value = _stacked_array(target, layer)
        else:
            whole = lambda name=name, fn=fn: fn(tensors.read(name), s)
            shape = whole().shape
            if path == ("positions",) and shape[0] > target.shape[0]:  # GPT-2's n_positions
                whole = lambda w=whole, n=target.shape[0]: w()[:n]
                shape = (target.shape[0], *shape[1:])
            _check_shape(name, shape, target.shape)
            value = _array(target, whole)
        _set(out, path, value)
    return out


def _check_shape(name: str, got: tuple, want: tuple) -> None:
    if tuple(got) != tuple(want):
        raise InputError(f"the checkpoint's {name} is {tuple(got)} in podkit's layout; the "
                         f"model from config.json needs {tuple(want)}.")


def _array(target: Any, whole: Callable[[], np.ndarray]) -> jax.Array:
    dtype = target.dtype

    def shard(index: tuple) -> np.ndarray:
        return np.asarray(whole()[index], dtype)

    return jax.make_array_from_callback(target.shape, target.sharding, shard)


def _stacked_array(target: Any, layer: Callable[[int], np.ndarray]) -> jax.Array:
    dtype = target.dtype

    def shard(index: tuple) -> np.ndarray:
        first, rest = index[0], index[1:]
        ids = range(target.shape[0])[first]
        return np.stack([np.asarray(layer(i)[rest], dtype) for i in ids])

    return jax.make_array_from_callback(target.shape, target.sharding, shard)


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
    model = build(config, {"vocab_size": vocab, "seq_len": seq_len}, seed=seed)
    model.build((seq_len,), dtype=np.int32)
    state = model.state
    params = load_params(jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state.params),
        config, tensors, config.scan_layers)
    model.state = state.replace(params=params)
    model.tokenizer = load_tokenizer(directory)
    model.hf_config = hf
    return model
