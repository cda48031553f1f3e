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
layer's tensor at a time, so a checkpoint never sits in host memory whole, let alone twice. A
directory on gs:// or s3:// is read through podkit.paths: each tensor by a ranged read when it
is placed. Every tensor's name and shape is checked against config.json (hf_config.py) before
the model is built, so files that disagree fail before anything compiles.

Out. `save_hf` writes the model with its source's tokenizer settings, token ids, generation
settings, context and dtype (from_hf's directory, or a run's RUN_DIR/hf_source).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import jax
import numpy as np

from podkit import paths
from podkit.config import GPTConfig, LlamaConfig
from podkit.errors import ConfigError, InputError, StorageError
from podkit.interop.safetensors_files import SafetensorsDir
from podkit.models.hf_config import FAMILIES, LLAMA_FAMILY, hf_config, model_config
from podkit.models.llama import is_lora, merge_lora

__all__ = ["FAMILIES", "LLAMA_FAMILY", "from_hf", "hf_config", "load_weights", "model_config",
           "read_config", "run_config", "save_hf"]

# The vocabulary's axis of podkit's token table (rows, embed) and output layer (embed, rows):
# padded to model.vocab_multiple in podkit, the vocabulary alone in a Hugging Face file.
VOCAB_AXIS = {("tokens",): 0, ("head",): 1}

# A transform from transformers' tensor (numpy) to podkit's layout, given the model's sizes.
Transform = Callable[[np.ndarray, dict], np.ndarray]


def read_json(directory: str | os.PathLike, name: str) -> dict | None:
    """A JSON file of a model directory (local, gs:// or s3://), None when it has none; a
    file that is not a JSON object is an InputError naming it, a storage failure (denied
    access, say) the path layer's StorageError naming the URL and the cause."""
    path = paths.join(os.fspath(directory), name)
    try:
        with paths.open(path, "r") as f:
            text = f.read()
    except StorageError as e:
        if e.missing:
            return None
        raise
    except IsADirectoryError:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not JSON ({e}).") from None
    if not isinstance(value, dict):
        raise InputError(f"{path} holds a {type(value).__name__}, not a JSON object.")
    return value


def read_config(directory: str | os.PathLike) -> dict:
    """config.json of a Hugging Face model directory (local, gs:// or s3://)."""
    config = read_json(directory, "config.json")
    if config is None:
        raise InputError(f"{os.fspath(directory)} has no config.json: not a Hugging Face "
                         "model directory (save_pretrained writes config.json beside the "
                         "weights).")
    return config


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
                tied: bool = True, vocab: int | None = None, check_only: bool = False
                ) -> dict | None:
    """The model's parameter tree (abstract: a pure dict of ShapeDtypeStructs with shardings)
    with every leaf made from the files, on its sharding. A tensor missing from the files, or
    of another shape than the config says (every layer's is checked before any is read; the
    token table's and output layer's vocabulary against `vocab`, config.json's vocab_size),
    is an InputError naming it. `check_only`: the checks alone (`abstract` may then be
    ShapeDtypeStructs without shardings), nothing read, None returned."""
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
    makers = []
    for path, name, fn, kind in leaves:
        target = _get(abstract, path)
        if kind == "stacked":
            for i in range(target.shape[0]):
                one = name.replace("{i}", str(i))
                _check_shape(one, _layout_shape(fn, tensors.shape(one), s, one, config),
                             target.shape[1:])
            makers.append((path, lambda target=target, name=name, fn=fn: _stacked_array(
                target, lambda layer: fn(tensors.read(name.replace("{i}", str(layer))), s))))
        else:
            whole = lambda name=name, fn=fn: fn(tensors.read(name), s)
            shape = _layout_shape(fn, tensors.shape(name), s, name, config)
            axis = VOCAB_AXIS.get(path)
            if axis is not None and vocab is not None and shape[axis] != vocab:
                raise InputError(f"the checkpoint's {name} holds {shape[axis]} tokens; "
                                 f"config.json's vocab_size says {vocab}.")
            if axis is not None and shape[axis] < target.shape[axis]:
                # podkit's table padded to model.vocab_multiple: zero rows, no token's
                pad = [(0, 0)] * len(shape)
                pad[axis] = (0, target.shape[axis] - shape[axis])
                whole = lambda w=whole, pad=tuple(pad): np.pad(w(), pad)
                shape = tuple(target.shape[axis] if d == axis else n
                              for d, n in enumerate(shape))
            _check_shape(name, shape, target.shape)
            makers.append((path, lambda target=target, whole=whole: _array(target, whole)))
    if check_only:
        return None
    for path, make in makers:  # every shape checked: now read, shard by shard
        _set(out, path, make())
    return out


def _layout_shape(fn: Transform, shape: tuple, s: dict, name: str = "",
                  config: Any = None) -> tuple:
    """The shape a layout transform gives a tensor of `shape`, nothing read or computed; a
    tensor the model's sizes cannot lay out (its heads do not divide it) is an InputError
    naming it."""
    try:
        return tuple(jax.eval_shape(lambda a: fn(a, s),
                                    jax.ShapeDtypeStruct(tuple(shape), np.float32)).shape)
    except (TypeError, ValueError):
        raise InputError(f"the checkpoint's {name} is {tuple(shape)}, which the model from "
                         f"config.json ({s}) cannot hold: the files and config.json "
                         "disagree.") from None


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
    """Whether `path` (local, gs:// or s3://) is a Hugging Face model directory (config.json,
    no podkit config.toml)."""
    where = os.fspath(path)
    return paths.exists(paths.join(where, "config.json")) and not paths.exists(
        paths.join(where, "config.toml"))


# [model] keys that say how to run a model, not what it is: they apply over config.json's.
RUNTIME_KEYS = ("attention", "precision", "remat", "scan_layers", "vocab_chunk",
                "sample_tokens", "dropout", "attn_dropout", "lora_rank", "lora_alpha",
                "lora_targets")


def run_config(config: Any, directory: str | os.PathLike,
               written: Collection[str] | None = None) -> tuple[Any, int]:
    """A `podkit train` config started from a Hugging Face directory: (the config, the
    model's vocabulary size). `[model]` becomes config.json's architecture, with the
    section's runtime keys (RUNTIME_KEYS) kept: those in `written` (the [model] keys the
    user wrote: config.json's dropout rates stay unless one is written), every one when
    None; `[data]`'s text (`files`) is read with the directory's tokenizer.json instead of a
    BPE trained anew, whose ids the embeddings would not mean; the loss takes logits
    (train.from_logits), as these models emit."""
    import dataclasses

    model, vocab, context = model_config(read_config(directory))
    user = config.model
    kept = {k: getattr(user, k) for k in RUNTIME_KEYS
            if getattr(user, "name", None) == model.name and hasattr(model, k)
            and (written is None or k in written)}
    model = dataclasses.replace(model, **kept, init_from=os.fspath(directory))
    d = config.data
    if getattr(d, "name", None) not in ("text", "instructions") or not getattr(d, "files", ""):
        raise ConfigError(f"init_from {directory} (a Hugging Face model) trains on your text: "
                          "[data] name = \"text\" (documents) or \"instructions\" (chats, "
                          "prompt/completion pairs) with files = \"...\" (read with the "
                          "model's tokenizer; the built-in corpus has a tokenizer of its own).")
    tokenizer = paths.join(os.fspath(directory), "tokenizer.json")
    if d.tokenizer in ("train", ""):  # instruction data: the tokenizer's chat template too
        if not paths.exists(tokenizer):
            raise ConfigError(f"{directory} has no tokenizer.json: set data.tokenizer to the "
                              "tokenizer the model was trained with (a tokenizer.json).")
        d = dataclasses.replace(d, tokenizer=tokenizer)
    if d.seq_len > context:
        raise ConfigError(f"data.seq_len = {d.seq_len} is past the model's context of "
                          f"{context} (config.json); use {context} or less.")
    # These models end in logits: the loss takes them so (no [train] key needed).
    train = dataclasses.replace(config.train, from_logits=True)
    return dataclasses.replace(config, model=model, data=d, train=train), vocab


def load_weights(model: Any, directory: str | os.PathLike,
                 tensors: SafetensorsDir | None = None) -> None:
    """A built Llama-family or GPT pk.Model's parameters replaced by a Hugging Face
    directory's (local, gs:// or s3://), streamed to their shardings (the model's config
    must be the directory's: every tensor's name and shape is checked). `tensors`: the
    directory's, when already opened."""
    hf = read_config(directory)
    config = model.model_config
    state = model.state
    tensors = tensors or SafetensorsDir(directory)
    tied = (config.tie_embeddings if isinstance(config, LlamaConfig)
            else bool(hf.get("tie_word_embeddings", True)))
    _check_tied(tensors, tied, _table_name(config))
    params = load_params(jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state.params),
        config, tensors, config.scan_layers, tied=tied, vocab=model.module().vocab_size)
    # The checkpoint's weights; LoRA's adapters (not in it) as the model made them.
    params = jax.tree.map(lambda new, old: old if new is None else new, params, state.params,
                          is_leaf=lambda v: v is None)
    model.state = state.replace(params=params)


def _table_name(config: Any) -> str:
    """The token table's tensor in a Hugging Face checkpoint of this model."""
    return ("model.embed_tokens.weight" if isinstance(config, LlamaConfig)
            else "transformer.wte.weight")


def _check_tied(tensors: SafetensorsDir, tied: bool, table: str) -> None:
    """tie_word_embeddings true with an lm_head.weight in the files that is not the token
    table: transformers then unties them (with a warning), which podkit's tied model would
    not; refused by name. An lm_head.weight equal to the table is the same model."""
    head = "lm_head.weight"
    if not tied or head not in tensors or table not in tensors:
        return
    if tensors.shape(head) != tensors.shape(table) or not np.array_equal(
            tensors.read(head), tensors.read(table)):
        raise ConfigError(f"config.json's tie_word_embeddings = true, but the checkpoint's "
                          f"{head} is not its {table}: transformers unties them. Set "
                          "tie_word_embeddings to false in config.json for that model (its "
                          "own output layer), or drop lm_head.weight for the tied one.")


def load_tokenizer(directory: str | os.PathLike) -> Any:
    """tokenizer.json's tokenizers.Tokenizer, or None when the directory (local, gs:// or
    s3://) has none."""
    path = paths.join(os.fspath(directory), "tokenizer.json")
    if not paths.exists(path):
        return None
    from podkit.datasets.tokenizer_files import load

    return load(path, "tokenizer.json")


def from_hf(directory: str | os.PathLike, seq_len: int | None = None, seed: int = 0) -> Any:
    """A pk.Model (uncompiled, built) of a Hugging Face model directory: the architecture from
    config.json, the weights from its safetensors files on the current strategy's shardings,
    `model.tokenizer` from tokenizer.json (None without one). `seq_len`: the context the
    model takes (default: config.json's max_position_embeddings / n_positions)."""
    hf = read_config(directory)
    config, vocab, context = model_config(hf)
    seq_len = context if seq_len is None else seq_len
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 1 <= seq_len <= context:
        # As `init_from`'s data.seq_len: past the context the model was made for, its
        # positions were never trained (GPT-2's table has no rows there at all).
        raise ConfigError(f"from_hf(seq_len={seq_len!r}): the model's context is {context} "
                          f"tokens (config.json's max_position_embeddings); pass an int from "
                          f"1 to {context}.")
    tensors = SafetensorsDir(directory)
    if isinstance(config, LlamaConfig):
        from podkit.models.llama import Llama as Module
        from podkit.models.llama import build_llama as build
    else:
        from podkit.models.gpt import GPT as Module
        from podkit.models.gpt import build_gpt as build
    # The files checked against config.json before anything compiles: names, shapes, ties.
    import flax.nnx as nnx

    with nnx.use_eager_sharding(False):  # shapes only: the strategy lays them out later
        abstract = nnx.to_pure_dict(nnx.state(nnx.eval_shape(
            lambda: Module(config, vocab, seq_len, nnx.Rngs(0))), nnx.Param))
    tied = (config.tie_embeddings if isinstance(config, LlamaConfig)
            else bool(hf.get("tie_word_embeddings", True)))
    _check_tied(tensors, tied, _table_name(config))
    load_params(abstract, config, tensors, config.scan_layers, tied=tied, vocab=vocab,
                check_only=True)
    model = build(config, {"vocab_size": vocab, "seq_len": seq_len}, seed=seed)
    model.build((seq_len,), dtype=np.int32)
    load_weights(model, directory, tensors)
    model.tokenizer = load_tokenizer(directory)
    model.hf_config = hf
    model.hf_source = os.fspath(directory)  # what save_hf keeps the tokenizer settings of
    return model


# -- out ------------------------------------------------------------------------------------------
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


# What a Hugging Face directory says besides its weights: kept by a run that starts from one
# (RUN_DIR/hf_source) and written again by its export.
SOURCE_FILES = ("config.json", "generation_config.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja")
SOURCE_DIR = "hf_source"
DTYPES = ("float32", "bfloat16", "float16")


def source_files(directory: str | os.PathLike | None) -> dict[str, Any]:
    """SOURCE_FILES that `directory` (local, gs:// or s3://) holds: the JSON ones as dicts,
    chat_template.jinja as text."""
    if directory is None:
        return {}
    out: dict[str, Any] = {}
    for name in SOURCE_FILES:
        if name.endswith(".json"):
            value = read_json(directory, name)
        else:
            path = paths.join(os.fspath(directory), name)
            value = None
            if paths.exists(path):
                with paths.open(path, "r") as f:
                    value = f.read()
        if value is not None:
            out[name] = value
    return out


def keep_source(directory: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """Copy a Hugging Face directory's SOURCE_FILES into RUN_DIR/hf_source: what the run's
    export writes again (pad and bos tokens, chat template, context, dtype, generation
    settings), whether or not the directory is still there then."""
    target = paths.join(os.fspath(run_dir), SOURCE_DIR)
    for name, value in source_files(directory).items():
        with paths.open(paths.join(target, name), "w") as f:
            f.write(value if isinstance(value, str) else json.dumps(value, indent=2) + "\n")


def _source_dtype(config: dict) -> str:
    """The dtype a source config.json stores its weights in, when podkit writes it."""
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in DTYPES else "float32"


def save_hf(model: Any, directory: str | os.PathLike, tokenizer: Any = None,
            eos_token: str | None = None, dtype: str | None = None,
            max_shard_bytes: int | None = None, chat_template: str | None = None,
            bos_token: str | None = None, source: str | os.PathLike | None = None) -> str:
    """Write a Llama-family or GPT pk.Model as a Hugging Face directory (local, gs:// or
    s3://) that transformers' `AutoModelForCausalLM.from_pretrained` loads with the same
    logits: config.json, model.safetensors (sharded with an index past 5 GB),
    generation_config.json, and with a tokenizer tokenizer.json and tokenizer_config.json.

    `source`: the Hugging Face directory the model came from (default: the one
    pk.models.from_hf read): its config.json's context (max_position_embeddings), token ids
    and dtype, its tokenizer_config.json (pad, bos and eos tokens, chat template,
    model_max_length), special_tokens_map.json, chat_template.jinja and
    generation_config.json are written again, with what the arguments change. `tokenizer`:
    a tokenizers.Tokenizer (default: the model's, from_hf's). `eos_token`: the end-of-text
    token's text (its id goes into the configs); `chat_template` (a Jinja source) and
    `bos_token` go into tokenizer_config.json; a token not given keeps the source's, and
    none is made up (no bos without one). `dtype`: "float32" (the master weights, exactly),
    "bfloat16" or "float16" (default: the source's dtype, else float32). Every process
    calls it (the weights are gathered from all); the lead process writes. Returns the
    directory."""
    from podkit.cluster import is_lead_process
    from podkit.interop.safetensors_files import SHARD_BYTES, write_checkpoint

    config = getattr(model, "model_config", None)
    if not isinstance(config, LlamaConfig | GPTConfig):
        raise ConfigError("save_hf writes podkit's Llama-family and GPT models (built by "
                          "pk.models.from_hf, from a config or a run); this model is "
                          f"{getattr(model, 'name', type(model).__name__)!r}.")
    files = source_files(source if source is not None else getattr(model, "hf_source", None))
    src = files.get("config.json") or getattr(model, "hf_config", None) or {}
    dtype = _source_dtype(src) if dtype is None else dtype
    if dtype not in DTYPES:
        raise ConfigError(f"dtype = {dtype!r}; use {', '.join(map(repr, DTYPES))}.")
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)
    module = model.module()
    ids: dict[str, Any] = {k: src[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                           if k in src}
    for key, token in (("eos_token_id", eos_token), ("bos_token_id", bos_token)):
        if token is None:
            continue
        if tokenizer is None:
            raise ConfigError(f"{key[:3]}_token {token!r} was given without a tokenizer to "
                              "find its id in; pass tokenizer= (the run's tokenizer.json), "
                              "or leave the token out.")
        found = tokenizer.token_to_id(token)
        if found is None:
            raise ConfigError(f"{key[:3]}_token {token!r} is not in the tokenizer's "
                              "vocabulary.")
        ids[key] = found
    kind = src.get("model_type") if isinstance(config, LlamaConfig) else None
    # The context it was made for: a GPT's position table, a Llama's source's or its own.
    context = (int(model.state.params["positions"].shape[0]) if isinstance(config, GPTConfig)
               else config.context or module.seq_len)
    hf = hf_config(config, module.vocab_size, context, dtype, kind, ids)
    np_dtype = np.dtype(jax.numpy.bfloat16 if dtype == "bfloat16" else dtype)
    tensors = _tensors(model, config, np_dtype)
    lead = is_lead_process()
    directory = os.fspath(directory)
    if not lead:  # the gathers are collective: every process takes part in each
        for *_, make in tensors:
            make()
        return directory
    generation = dict(files.get("generation_config.json") or {"_from_model_config": True})
    for key in ("bos_token_id", "pad_token_id"):
        if key in ids:
            generation[key] = ids[key]
    if "eos_token_id" in ids:  # the run's end of text, and the source's ends besides
        before = generation.get("eos_token_id")
        ends = [ids["eos_token_id"]] + [e for e in (before if isinstance(before, list)
                                                    else [before]) if e is not None]
        ends = list(dict.fromkeys(ends))
        generation["eos_token_id"] = ends[0] if len(ends) == 1 else ends
    written = {"config.json": hf, "generation_config.json": generation}
    if tokenizer is not None:
        written.update(_tokenizer_files(files, context, eos_token, bos_token, chat_template))
    with paths.staged(directory) as local:
        local = Path(local)
        local.mkdir(parents=True, exist_ok=True)
        write_checkpoint(local, tensors, max_shard_bytes or SHARD_BYTES)
        for name, value in written.items():
            text = value if isinstance(value, str) else json.dumps(value, indent=2) + "\n"
            (local / name).write_text(text)
        if tokenizer is not None:
            tokenizer.save(str(local / "tokenizer.json"))
    return directory


def _tokenizer_files(files: dict, context: int, eos_token: str | None, bos_token: str | None,
                     chat_template: str | None) -> dict[str, Any]:
    """tokenizer_config.json (and special_tokens_map.json, chat_template.jinja where the
    source has them): the source's, with the run's eos, bos and chat template over them."""
    config = dict(files.get("tokenizer_config.json") or
                  {"tokenizer_class": "PreTrainedTokenizerFast"})
    config.setdefault("model_max_length", context)
    special = dict(files.get("special_tokens_map.json") or {})
    for key, token in (("eos_token", eos_token), ("bos_token", bos_token)):
        if token is not None:
            config[key] = token
            if special:
                special[key] = token
    out: dict[str, Any] = {"tokenizer_config.json": config}
    if special:
        out["special_tokens_map.json"] = special
    if chat_template:
        config["chat_template"] = chat_template
    if "chat_template.jinja" in files:  # transformers reads it over tokenizer_config.json's
        out["chat_template.jinja"] = chat_template or files["chat_template.jinja"]
    return out
