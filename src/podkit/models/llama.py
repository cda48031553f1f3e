"""The Llama family of decoders (Llama 2/3, Mistral, Qwen2/3) in Flax NNX, with logical axes.

    tokens (B, T) -> token embeddings -> L x [RMSNorm, causal attention with RoPE and
    grouped-query heads (+ residual), RMSNorm, SwiGLU MLP (+ residual)] -> RMSNorm -> logits

What each family adds is a switch of `LlamaConfig`: `kv_heads` (grouped-query attention:
Llama 2 70B, Llama 3, Mistral, Qwen; 1: multi-query), `head_dim` apart from embed / heads
(Qwen3), `rope_scaling = "llama3"` (Llama 3.1's long-context frequencies), `tie_embeddings`
(the output layer is the token table: small Llama 3.2 and Qwen models), `qkv_bias` (Qwen2),
`qk_norm` (Qwen3: RMSNorm of each head's q and k before RoPE).

The computation is Hugging Face transformers' for these models, step for step, so that their
checkpoints load as they are (podkit.models.hf): RoPE rotates the two halves of each head
(`rotate_half`, not interleaved pairs), its angles are computed in float32, RMSNorm
normalizes in float32 and scales after casting back to the compute dtype.

As the GPT (podkit.models.gpt): in training the model returns LMLogits (the loss reads the
vocabulary `vocab_chunk` entries at a time); `scan_layers` stacks the blocks on a `layers`
axis under one `nnx.scan`; `remat` by name, the block naming its projections (qkv_proj,
out_proj, mlpwi, mlpwo); every parameter names its dims with podkit's logical axes: `embed`
(split by FSDP), `heads` and `mlp` (tensor parallelism), `kv_heads` (the key/value heads: no
built-in rule splits them, as their count need not divide the model axis), `kv` (per-head
width), `vocab`. Mixed precision keeps float32 master weights and computes in bfloat16.
"""

from __future__ import annotations

import math
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from podkit import kernels
from podkit.config import LlamaConfig
from podkit.errors import ConfigError
from podkit.kernels.cross_entropy import LMLogits, cut_vocab
from podkit.models.common import (
    MLP_IN,
    MLP_OUT,
    OUT_PROJ,
    QKV_PROJ,
    dtypes,
    normal_param,
    remat_policy,
    run_stacked,
    run_unstacked,
    stacked_layers,
    unstacked_layers,
    vocab_rows,
    zeros_param,
)
from podkit.strategy import constrain

INIT_STD = 0.02  # transformers' initializer_range for these models


def head_dim_of(c: LlamaConfig) -> int:
    return c.head_dim or c.embed // c.heads


def kv_heads_of(c: LlamaConfig) -> int:
    return c.kv_heads or c.heads


def check(c: LlamaConfig) -> None:
    """A ConfigError naming the key for sizes the model cannot have."""
    for key in ("layers", "heads", "embed", "mlp"):
        if getattr(c, key) < 1:
            raise ConfigError(f"model.{key} = {getattr(c, key)}; it must be >= 1.")
    if c.head_dim < 0 or c.kv_heads < 0:
        raise ConfigError(f"model.head_dim = {c.head_dim}, model.kv_heads = {c.kv_heads}; "
                          "each must be >= 0 (0: embed / heads, and as many as heads).")
    if not c.head_dim and c.embed % c.heads:
        raise ConfigError(f"model.embed = {c.embed} is not divisible by model.heads = "
                          f"{c.heads}; set model.head_dim, or heads that divide embed.")
    if head_dim_of(c) % 2:
        raise ConfigError(f"a head of {head_dim_of(c)} dims: RoPE rotates pairs of dims, so "
                          "model.head_dim (or embed / heads) must be even.")
    if c.heads % kv_heads_of(c):
        raise ConfigError(f"model.kv_heads = {c.kv_heads} does not divide model.heads = "
                          f"{c.heads}: each key/value head serves heads / kv_heads query heads.")
    if c.rope_theta <= 0 or c.norm_eps <= 0:
        raise ConfigError(f"model.rope_theta = {c.rope_theta}, model.norm_eps = {c.norm_eps}; "
                          "both must be > 0.")
    if c.rope_scaling == "llama3" and not (
            c.rope_factor > 0 and c.rope_high_freq_factor > c.rope_low_freq_factor > 0
            and c.rope_original_context > 0):
        raise ConfigError("rope_scaling = 'llama3' needs rope_factor > 0, rope_high_freq_factor "
                          "> rope_low_freq_factor > 0 and rope_original_context > 0 (Llama 3.1: "
                          "8, 4, 1, 8192).")
    if c.vocab_chunk < 0:
        raise ConfigError(f"model.vocab_chunk = {c.vocab_chunk}; it must be >= 0 (0: the "
                          "whole logits).")
    if c.remat != "none":
        remat_policy(c.remat, named=True)  # an unknown name fails here, named
    if isinstance(c.lora_rank, bool) or not isinstance(c.lora_rank, int) or c.lora_rank < 0:
        raise ConfigError(f"model.lora_rank = {c.lora_rank!r}; an int >= 0 (0: no LoRA).")
    if c.lora_rank:
        if not c.lora_alpha > 0:
            raise ConfigError(f"model.lora_alpha = {c.lora_alpha!r}; it must be > 0 (the "
                              "adapters' scale is lora_alpha / lora_rank).")
        lora_targets(c)


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


def lora_targets(c: LlamaConfig) -> tuple[str, ...]:
    """The projections model.lora_targets names (transformers' names accepted: q_proj ->
    q), or a ConfigError naming an unknown one."""
    names = [c.lora_targets] if isinstance(c.lora_targets, str) else list(c.lora_targets)
    out = []
    for name in names:
        short = str(name).removesuffix("_proj")
        if short not in LORA_TARGETS:
            raise ConfigError(f"model.lora_targets holds {name!r}; the projections are "
                              f"{', '.join(LORA_TARGETS)} (or transformers' q_proj, ...).")
        out.append(short)
    if not out:
        raise ConfigError("model.lora_targets is empty; name the projections the adapters "
                          f"go on (e.g. [\"q\", \"v\"]; all: {list(LORA_TARGETS)}).")
    return tuple(dict.fromkeys(out))


def is_lora(path: tuple) -> bool:
    """Whether a parameter path is a LoRA adapter's (its name starts with lora_)."""
    return any(str(k).startswith("lora_") for k in path)


class LoRA:
    """Low-rank adapters of a module's projections: `lora_{name}_a` (the weight's input dims,
    r), drawn as PEFT draws them (uniform in +-1/sqrt(fan_in)), and `lora_{name}_b`
    (r, its output dims), zeros, so that a fresh adapter changes nothing; the projection
    adds scale * (x . A) . B, scale = lora_alpha / r (LoRA, Hu et al. 2021)."""

    @staticmethod
    def add(module: nnx.Module, name: str, c: LlamaConfig, rngs: nnx.Rngs,
            inputs: tuple[int, ...], in_axes: tuple, outputs: tuple[int, ...],
            out_axes: tuple, param_dtype: Any) -> None:
        if not c.lora_rank or name not in lora_targets(c):
            return
        r, bound = c.lora_rank, 1.0 / math.sqrt(math.prod(inputs))
        a = jax.random.uniform(rngs.params(), (*inputs, r), param_dtype, -bound, bound)
        setattr(module, f"lora_{name}_a", nnx.Param(a, out_sharding=(*in_axes, None)))
        setattr(module, f"lora_{name}_b", zeros_param((r, *outputs), (None, *out_axes),
                                                      param_dtype))
        module.lora_scale = c.lora_alpha / r

    @staticmethod
    def apply(module: nnx.Module, name: str, x: jax.Array, h: jax.Array, dtype: Any
              ) -> jax.Array:
        """h (the frozen projection of x) plus the adapter's part, if it has one."""
        a = getattr(module, f"lora_{name}_a", None)
        if a is None:
            return h
        b = getattr(module, f"lora_{name}_b")[...].astype(dtype)
        a = a[...].astype(dtype)
        low = jnp.tensordot(x, a, axes=a.ndim - 1)  # (..., r)
        return h + (module.lora_scale * jnp.tensordot(low, b, axes=1)).astype(h.dtype)

    @staticmethod
    def delta(a: jax.Array, b: jax.Array, scale: float, weight_ndim: int) -> jax.Array:
        """The adapter as a change of the weight it adapts (its layout; stacked layers' A and
        B have a leading layer dim, as their weight)."""
        if a.ndim + b.ndim - 2 == weight_ndim:
            return scale * jnp.tensordot(a, b, axes=1)
        return jax.vmap(lambda a, b: scale * jnp.tensordot(a, b, axes=1))(a, b)


def merge_lora(params: dict, scale: float | None) -> dict:
    """A pure parameter dict with each adapter folded into the weight it adapts
    (W + scale * A . B) and the adapters left out: what export writes and generation runs."""
    if scale is None:
        return params

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items() if not str(k).startswith("lora_")}
        for k, w in out.items():
            if f"lora_{k}_a" in node:
                delta = LoRA.delta(node[f"lora_{k}_a"], node[f"lora_{k}_b"], scale, w.ndim)
                out[k] = (w + delta).astype(w.dtype)
        return out

    return walk(params)


def inverse_frequencies(c: LlamaConfig) -> np.ndarray:
    """RoPE's (head_dim / 2,) angular frequencies, float32, Llama 3.1's scaling applied
    (transformers' `_compute_llama3_parameters`): long wavelengths slowed by `rope_factor`,
    short ones kept, those between blended."""
    d = head_dim_of(c)
    inv = 1.0 / (c.rope_theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    inv = inv.astype(np.float32)
    if c.rope_scaling == "llama3":
        low_wavelen = c.rope_original_context / c.rope_low_freq_factor
        high_wavelen = c.rope_original_context / c.rope_high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / c.rope_factor, inv)
        smooth = (c.rope_original_context / wavelen - c.rope_low_freq_factor) / (
            c.rope_high_freq_factor - c.rope_low_freq_factor)
        smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def rope_angles(inv_freq: jax.Array, positions: jax.Array, dtype: Any
                ) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) of shape positions.shape + (head_dim,), in `dtype`: each frequency's angle
    twice (the head's two halves), computed in float32."""
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x (B, T, H, D) rotated by the angles (B or 1, T, D): transformers' `rotate_half` form."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) * scale over the last dim, normalized in float32 (transformers': the scale
    multiplies after the cast back to x's dtype)."""
    h = x.astype(jnp.float32)
    h = h * jax.lax.rsqrt(jnp.square(h).mean(-1, keepdims=True) + eps)
    return h.astype(x.dtype) * scale.astype(x.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, axis: str, param_dtype: Any) -> None:
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), out_sharding=(axis,))

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


class Attention(nnx.Module):
    """Causal attention with RoPE: `heads` query heads over `kv_heads` key/value heads (each
    serving heads / kv_heads queries, never repeated in memory by podkit's kernels)."""

    def __init__(self, c: LlamaConfig, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> None:
        d, kv_heads = head_dim_of(c), kv_heads_of(c)
        self.dtype = dtype
        self.attention = kernels.check_implementation(c.attention)
        self.q = normal_param(rngs, (c.embed, c.heads, d), ("embed", "heads", "kv"),
                              INIT_STD, param_dtype)
        self.k = normal_param(rngs, (c.embed, kv_heads, d), ("embed", "kv_heads", "kv"),
                              INIT_STD, param_dtype)
        self.v = normal_param(rngs, (c.embed, kv_heads, d), ("embed", "kv_heads", "kv"),
                              INIT_STD, param_dtype)
        self.o = normal_param(rngs, (c.heads, d, c.embed), ("heads", "kv", "embed"),
                              INIT_STD, param_dtype)
        if c.qkv_bias:
            self.q_bias = zeros_param((c.heads, d), ("heads", "kv"), param_dtype)
            self.k_bias = zeros_param((kv_heads, d), ("kv_heads", "kv"), param_dtype)
            self.v_bias = zeros_param((kv_heads, d), ("kv_heads", "kv"), param_dtype)
        if c.qk_norm:
            self.q_norm = RMSNorm(d, c.norm_eps, "kv", param_dtype)
            self.k_norm = RMSNorm(d, c.norm_eps, "kv", param_dtype)
        for name, heads, axis in (("q", c.heads, "heads"), ("k", kv_heads, "kv_heads"),
                                  ("v", kv_heads, "kv_heads")):
            LoRA.add(self, name, c, rngs, (c.embed,), ("embed",), (heads, d), (axis, "kv"),
                     param_dtype)
        LoRA.add(self, "o", c, rngs, (c.heads, d), ("heads", "kv"), (c.embed,), ("embed",),
                 param_dtype)

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        w = getattr(self, name)[...].astype(self.dtype)
        h = LoRA.apply(self, name, x, jnp.einsum("bte,ehd->bthd", x, w), self.dtype)
        if hasattr(self, f"{name}_bias"):
            h = h + getattr(self, f"{name}_bias")[...].astype(self.dtype)
        return checkpoint_name(h, QKV_PROJ)  # what remat "save_qkv_proj" keeps

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        q, k, v = (self._project(x, name) for name in ("q", "k", "v"))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        h = kernels.dot_product_attention(q, k, v, causal=True, segment_ids=segment_ids,
                                          implementation=self.attention)
        out = jnp.einsum("bthd,hde->bte", h, self.o[...].astype(self.dtype))
        return LoRA.apply(self, "o", h, out, self.dtype)


class MLP(nnx.Module):
    """SwiGLU: down(silu(x @ gate) * (x @ up))."""

    def __init__(self, c: LlamaConfig, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> None:
        self.dtype = dtype
        self.gate = normal_param(rngs, (c.embed, c.mlp), ("embed", "mlp"), INIT_STD, param_dtype)
        self.up = normal_param(rngs, (c.embed, c.mlp), ("embed", "mlp"), INIT_STD, param_dtype)
        self.down = normal_param(rngs, (c.mlp, c.embed), ("mlp", "embed"), INIT_STD, param_dtype)
        for name, (n_in, a_in), (n_out, a_out) in (
                ("gate", (c.embed, "embed"), (c.mlp, "mlp")),
                ("up", (c.embed, "embed"), (c.mlp, "mlp")),
                ("down", (c.mlp, "mlp"), (c.embed, "embed"))):
            LoRA.add(self, name, c, rngs, (n_in,), (a_in,), (n_out,), (a_out,), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        d = self.dtype
        gate = checkpoint_name(LoRA.apply(self, "gate", x, x @ self.gate[...].astype(d), d),
                               MLP_IN)
        up = checkpoint_name(LoRA.apply(self, "up", x, x @ self.up[...].astype(d), d), MLP_IN)
        h = jax.nn.silu(gate) * up
        return LoRA.apply(self, "down", h, h @ self.down[...].astype(d), d)


class Block(nnx.Module):
    def __init__(self, c: LlamaConfig, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> None:
        self.attn_norm = RMSNorm(c.embed, c.norm_eps, "embed", param_dtype)
        self.attn = Attention(c, rngs, dtype, param_dtype)
        self.mlp_norm = RMSNorm(c.embed, c.norm_eps, "embed", param_dtype)
        self.mlp = MLP(c, rngs, dtype, param_dtype)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        x = x + checkpoint_name(self.attn(self.attn_norm(x), cos, sin, segment_ids), OUT_PROJ)
        return x + checkpoint_name(self.mlp(self.mlp_norm(x)), MLP_OUT)


class Llama(nnx.Module):
    """The decoder. `__call__(tokens (B, T) int) -> logits (B, T, vocab)` (float32), or
    LMLogits of those when `lazy_logits` is set (podkit's train step sets it) and
    `vocab_chunk` > 0. Packed examples (podkit.datasets.instructions) come as a dict of
    "tokens", "positions" (each example's from 0) and "segment_ids" (B, T): no token attends
    to another example's."""

    def __init__(self, c: LlamaConfig, vocab_size: int, seq_len: int, rngs: nnx.Rngs) -> None:
        check(c)
        dtype, param_dtype = dtypes(c.precision)
        self.dtype, self.seq_len, self.vocab_size = dtype, seq_len, vocab_size
        # The context it is made for (a Hugging Face source's): generate() reads this far.
        self.context = max(c.context, seq_len)
        self.norm_eps = c.norm_eps  # (what podkit.models.llama_decode needs of the config)
        # RoPE's frequencies: a constant of the program (static, not a variable of the state).
        self.inv_freq = tuple(float(f) for f in inverse_frequencies(c))
        rows = vocab_rows(vocab_size, c.vocab_multiple)  # padded: rows past vocab_size unused
        self.tokens = normal_param(rngs, (rows, c.embed), ("vocab", "embed"), INIT_STD,
                                   param_dtype)
        self.scan_layers, self.remat, self.vocab_chunk = c.scan_layers, c.remat, c.vocab_chunk
        make = lambda rngs: Block(c, rngs, dtype, param_dtype)
        if c.scan_layers:
            self.blocks = stacked_layers(make, c.layers, rngs)
        else:
            self.blocks = nnx.List(unstacked_layers(make, c.layers, rngs))
        self.norm = RMSNorm(c.embed, c.norm_eps, "embed", param_dtype)
        self.tied = c.tie_embeddings
        if not c.tie_embeddings:
            self.head = normal_param(rngs, (c.embed, rows), ("embed", "vocab"), INIT_STD,
                                     param_dtype)
        self.lazy_logits = False  # set by podkit's train step (module.train(lazy_logits=True))
        self.lora = bool(c.lora_rank)
        self.lora_scale = c.lora_alpha / c.lora_rank if c.lora_rank else None

    def param_labels(self, params: Any) -> Any:
        """With LoRA, "train" for the adapters and "frozen" for every other parameter (the
        model's trainable set, as a Keras layer's `trainable`); None without."""
        if not self.lora:
            return None
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "train" if is_lora(tuple(getattr(k, "key", getattr(k, "idx", k))
                                                     for k in path)) else "frozen", params)

    def head_weights(self) -> jax.Array:
        """The output layer's (embed, rows) weights (rows: the vocabulary padded to
        `vocab_multiple`): the token table's transpose when tied."""
        return self.tokens[...].T if self.tied else self.head[...]

    def hidden(self, tokens: jax.Array, positions: jax.Array | None = None,
               segment_ids: jax.Array | None = None) -> jax.Array:
        """The final hidden states (B, T, embed) in the compute dtype, after the last norm.
        `positions` (B, T): each token's position for RoPE (default 0..T-1); `segment_ids`
        (B, T): the packed example each token belongs to."""
        t = tokens.shape[-1]
        if t > self.seq_len:
            raise ConfigError(f"a sequence of {t} tokens is longer than the model's context "
                              f"of {self.seq_len}; cut it or build the model with a longer "
                              "data.seq_len.")
        # Read whole along `embed`, as the GPT's (see podkit.models.gpt).
        table = constrain(self.tokens[...], ("vocab", None))
        x = table[tokens].astype(self.dtype)
        if positions is None:
            positions = jnp.arange(t)[None]
        cos, sin = rope_angles(jnp.asarray(self.inv_freq, jnp.float32), positions, self.dtype)
        run = run_stacked if self.scan_layers else run_unstacked
        extra = () if segment_ids is None else (segment_ids,)
        x = run(self.blocks, x, self.remat, cos, sin, *extra)
        return self.norm(x)

    def __call__(self, tokens: jax.Array | dict, positions: jax.Array | None = None
                 ) -> jax.Array:
        segment_ids = None
        if isinstance(tokens, dict):
            unknown = set(tokens) - {"tokens", "positions", "segment_ids"}
            if unknown or "tokens" not in tokens:
                raise ConfigError(f"the Llama takes token ids, or a dict of 'tokens' with "
                                  f"'positions' and 'segment_ids' (packed examples); got the "
                                  f"keys {sorted(tokens)}.")
            positions = tokens.get("positions", positions)
            segment_ids = tokens.get("segment_ids")
            tokens = tokens["tokens"]
        x = self.hidden(tokens, positions, segment_ids)
        head = self.head_weights()
        if self.lazy_logits and self.vocab_chunk:
            return LMLogits(x, head, self.vocab_chunk, vocab=self.vocab_size)
        return cut_vocab((x @ head.astype(self.dtype)).astype(jnp.float32), self.vocab_size)


def build_llama(config: LlamaConfig, info: dict, seed: int = 0) -> Any:
    """An uncompiled pk.Model of a Llama-family decoder sized by `config`, its vocabulary and
    context from the data (`info["vocab_size"]`, `info["seq_len"]`)."""
    from podkit.model import Model

    for key in ("vocab_size", "seq_len"):
        if key not in info:
            raise ConfigError(f"model.name = 'llama' needs token data ([data] name = 'text'); "
                              f"this data has no {key}.")
    check(config)
    vocab, seq_len = info["vocab_size"], info["seq_len"]
    model = Model(lambda rngs: Llama(config, vocab, seq_len, rngs), seed=seed, name="llama")
    model.model_config = config  # what podkit.models.hf.save_hf writes config.json from
    return model
