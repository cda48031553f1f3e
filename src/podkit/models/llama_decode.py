"""Sampling from a Llama-family decoder with a KV cache: the functions podkit.models.gpt's
`generate` loop calls (`stacked`, `empty_cache`, `forward`), for the Llama's parameters.

What `Llama.__call__` computes at each position, over its parameters as a plain tree with the
blocks stacked: the same casts, RMSNorm, RoPE at each token's absolute position, and grouped-
query attention over the cache, whose (L, 1, T, kv_heads, head_dim) keys and values are the
k/v heads only (a group's query heads read their one cached head). The cache's keys are
stored rotated, so a token's rotation is computed once. As the GPT's, a full context keeps
its last T/2 tokens, read again as a new prompt at positions 0..T/2-1 (RoPE's positions are
relative, so this loses only the context dropped).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from podkit.models.gpt_decode import stacked
from podkit.models.llama import apply_rope, merge_lora, rms_norm, rope_angles

__all__ = ["Decoder", "stacked"]


class Decoder:
    """The decode functions bound to one Llama module's constants (norm epsilon, RoPE's
    frequencies, tied output layer)."""

    def __init__(self, module: Any) -> None:
        self.eps = module.norm_eps
        self.inv_freq = module.inv_freq
        self.tied = module.tied
        self.lora_scale = module.lora_scale

    def stacked(self, params: dict) -> dict:
        """The layers stacked (gpt_decode.stacked), LoRA adapters merged into their weights."""
        return merge_lora(stacked(params), self.lora_scale)

    @staticmethod
    def empty_cache(params: dict, seq_len: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        """Zero keys and values (L, 1, T, kv_heads, head_dim) for a batch of one sequence."""
        layers, _, kv_heads, head_dim = params["blocks"]["attn"]["k"].shape
        shape = (layers, 1, seq_len, kv_heads, head_dim)
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def _block(self, p: dict, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
               start: jax.Array, cos: jax.Array, sin: jax.Array) -> tuple:
        d = x.dtype
        a = p["attn"]
        h = rms_norm(x, p["attn_norm"]["scale"], self.eps)

        def project(name: str) -> jax.Array:
            out = jnp.einsum("bte,ehd->bthd", h, a[name].astype(d))
            return out + a[f"{name}_bias"].astype(d) if f"{name}_bias" in a else out

        q, k, v = project("q"), project("k"), project("v")
        if "q_norm" in a:
            q = rms_norm(q, a["q_norm"]["scale"], self.eps)
            k = rms_norm(k, a["k_norm"]["scale"], self.eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype),
                                               (0, start, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype),
                                               (0, start, 0, 0))
        b, s, heads, dim = q.shape
        kv_heads, t = k_cache.shape[2], k_cache.shape[1]
        # Query head g * group + j reads k/v head g (grouped-query attention).
        qg = q.reshape(b, s, kv_heads, heads // kv_heads, dim)
        scores = jnp.einsum("bsngd,btnd->bngst", qg, k_cache,
                            preferred_element_type=jnp.float32) / math.sqrt(dim)
        allowed = jnp.arange(t)[None, :] <= start + jnp.arange(s)[:, None]
        probs = jax.nn.softmax(jnp.where(allowed, scores, jnp.finfo(jnp.float32).min), -1)
        out = jnp.einsum("bngst,btnd->bsngd", probs.astype(v_cache.dtype), v_cache)
        out = out.reshape(b, s, heads, dim).astype(d)
        x = x + jnp.einsum("bthd,hde->bte", out, a["o"].astype(d))
        m = p["mlp"]
        h = rms_norm(x, p["mlp_norm"]["scale"], self.eps)
        h = jax.nn.silu(h @ m["gate"].astype(d)) * (h @ m["up"].astype(d))
        return x + h @ m["down"].astype(d), k_cache, v_cache

    def forward(self, params: dict, tokens: jax.Array, start: jax.Array, cache: tuple,
                dtype: Any) -> tuple[jax.Array, tuple]:
        """tokens (1, S) at positions start.. -> (logits (1, S, rows) float32, the cache with
        their keys and values); the prefill with S = T and start 0, a decode step with S = 1.
        `rows`: the token table's, padding included (`kernels.cross_entropy.cut_vocab` cuts it)."""
        s = tokens.shape[1]
        x = params["tokens"][tokens].astype(dtype)
        positions = (start + jnp.arange(s))[None]
        cos, sin = rope_angles(jnp.asarray(self.inv_freq, jnp.float32), positions, dtype)

        def layer(x: jax.Array, xs: tuple) -> tuple[jax.Array, tuple]:
            p, k_cache, v_cache = xs
            x, k_cache, v_cache = self._block(p, x, k_cache, v_cache, start, cos, sin)
            return x, (k_cache, v_cache)

        x, cache = jax.lax.scan(layer, x, (params["blocks"], *cache))
        x = rms_norm(x, params["norm"]["scale"], self.eps)
        head = params["tokens"].T if self.tied else params["head"]
        return (x @ head.astype(dtype)).astype(jnp.float32), cache
