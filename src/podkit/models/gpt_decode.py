"""Sampling from a GPT with a KV cache: the prompt is read once (prefill), then every new
token costs one position's forward pass, its keys and values appended to the cache.

The functions here are pure, over the GPT's parameters as a plain tree (`stacked(params)`:
the L blocks' arrays with a leading layer axis, whether the model scans its layers or not),
and compute what `GPT.__call__` computes at each position: the same casts (the weights cast
to the compute dtype where used, layer norms and the attention's softmax in float32), the
same scaled dot products. `gpt.generate` runs them in one compiled loop.

The cache holds (L, 1, T, heads, kv) keys and values for T = the model's context. A model
with learned absolute positions cannot slide its cache: once the context is full, the last
T/2 tokens are read again as a new prompt (one prefill at positions 0..T/2-1), and decoding
goes on from there; every token then sees at least T/2 tokens of context, and the work per
token stays O(T), not the O(T^2) of recomputing a whole window for each token.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

# A tree of arrays: the GPT's parameters, blocks stacked (see `stacked`).
Params = dict[str, Any]


def stacked(params: Params) -> Params:
    """The GPT's parameter tree with its blocks as one tree of (L, ...) arrays: a scanned
    model's blocks are already stacked; a model of separate blocks ({0: block, 1: ...}) has
    them stacked here."""
    blocks = params["blocks"]
    if "attn" not in blocks:  # {0: block, 1: block, ...}
        layers = [blocks[k] for k in sorted(blocks, key=int)]
        blocks = jax.tree.map(lambda *a: jnp.stack(a), *layers)
    return {**params, "blocks": blocks}


def _norm(p: Params, x: jax.Array) -> jax.Array:
    h = x.astype(jnp.float32)
    mean = h.mean(-1, keepdims=True)
    var = jnp.square(h - mean).mean(-1, keepdims=True)
    h = (h - mean) * jax.lax.rsqrt(var + 1e-5)
    return (h * p["scale"] + p["bias"]).astype(x.dtype)


def _mlp(p: Params, x: jax.Array) -> jax.Array:
    d = x.dtype
    h = x @ p["up"].astype(d) + p["up_bias"].astype(d)
    return jax.nn.gelu(h) @ p["down"].astype(d) + p["down_bias"].astype(d)


def _qkv(p: Params, x: jax.Array) -> jax.Array:
    d = x.dtype
    return jnp.einsum("bte,cehd->cbthd", x, p["qkv"].astype(d)) + p["qkv_bias"].astype(
        d)[:, None, None]


def _attend(p: Params, q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
            ) -> jax.Array:
    """Attention of q (B, S, H, D) to k, v (B, T, H, D) where `allowed` (S, T), projected
    out: as podkit.kernels' XLA attention (float32 scores and softmax, masked places at the
    float32 minimum)."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    probs = jax.nn.softmax(jnp.where(allowed, scores, jnp.finfo(jnp.float32).min), axis=-1)
    h = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
    d = q.dtype
    return jnp.einsum("bthd,hde->bte", h, p["out"].astype(d)) + p["out_bias"].astype(d)


def _block(p: Params, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, start: jax.Array,
           q_scale: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One block over x (B, S, E) at positions start..start+S-1, with this layer's cache
    (B, T, H, D): the new keys and values are written at those positions first. `q_scale`:
    this layer's multiplier of q (gpt.q_scales), None for none."""
    q, k, v = _qkv(p["attn"], _norm(p["norm1"], x))
    if q_scale is not None:
        q = (q * q_scale).astype(q.dtype)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, start, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, start, 0, 0))
    s, t = x.shape[1], k_cache.shape[1]
    # Position start + i sees every cached position up to itself.
    allowed = jnp.arange(t)[None, :] <= start + jnp.arange(s)[:, None]
    x = x + _attend(p["attn"], q, k_cache, v_cache, allowed)
    return x + _mlp(p["mlp"], _norm(p["norm2"], x)), k_cache, v_cache


def empty_cache(params: Params, seq_len: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """Zero keys and values (L, 1, T, heads, kv) for a batch of one sequence."""
    layers, _, _, heads, kv = params["blocks"]["attn"]["qkv"].shape
    shape = (layers, 1, seq_len, heads, kv)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def forward(params: Params, tokens: jax.Array, start: jax.Array, cache: tuple, dtype: Any,
            q_scales: tuple[float, ...] | None = None) -> tuple[jax.Array, tuple]:
    """tokens (1, S) at positions start.. -> (logits (1, S, rows) float32, the cache with
    their keys and values). With S = T and start 0 it is the prefill; with S = 1, a decode
    step. `rows`: the token table's, the vocabulary padded to `vocab_multiple` (cut them to
    the vocabulary with `kernels.cross_entropy.cut_vocab`, as `gpt.generate` does)."""
    s = tokens.shape[1]
    positions = jax.lax.dynamic_slice_in_dim(params["positions"], start, s)
    x = (params["tokens"][tokens] + positions).astype(dtype)

    def layer(x: jax.Array, xs: tuple) -> tuple[jax.Array, tuple]:
        p, k_cache, v_cache, *scale = xs
        x, k_cache, v_cache = _block(p, x, k_cache, v_cache, start, *scale)
        return x, (k_cache, v_cache)

    scales = () if q_scales is None else (jnp.asarray(q_scales, jnp.float32),)
    x, cache = jax.lax.scan(layer, x, (params["blocks"], *cache, *scales))
    x = _norm(params["norm"], x)
    return (x @ params["head"].astype(dtype)).astype(jnp.float32), cache


class Decoder:
    """The functions above bound to one GPT module's constants (its attention options'
    per-layer scales: `gpt.q_scales`), as gpt.generate calls them."""

    def __init__(self, module: Any) -> None:
        self.q_scales = module.q_scales

    stacked = staticmethod(stacked)
    empty_cache = staticmethod(empty_cache)

    def forward(self, params: Params, tokens: jax.Array, start: jax.Array, cache: tuple,
                dtype: Any) -> tuple[jax.Array, tuple]:
        return forward(params, tokens, start, cache, dtype, self.q_scales)
