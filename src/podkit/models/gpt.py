"""A GPT-style decoder language model (Radford et al. 2019) in Flax NNX, with logical axes.

    tokens (B, T) -> token + position embeddings -> L x [pre-norm causal attention, pre-norm
    MLP] -> final norm -> logits (B, T, vocab)

In training (podkit's train step sets `lazy_logits`) the model returns LMLogits(hidden, head)
instead: the loss and accuracy then read the vocabulary `vocab_chunk` entries at a time, and
the (B, T, vocab) float32 logits never exist (podkit.kernels.cross_entropy).

With `scan_layers` (the default) the L blocks are one Block whose parameters carry a leading
`layers` axis (no rule shards it), run by `nnx.scan`: XLA compiles one block, not L. `remat`
wraps the block (inside the scan) in `jax.checkpoint` with a policy by name; the block names
its matmul outputs (qkv_proj, out_proj, mlpwi, mlpwo) for the named policies.

Every parameter names its dims with podkit's logical axes, so one definition runs under every
strategy: `embed` (the model width: split by FSDP), `heads` and `mlp` (split by tensor
parallelism: attention heads and MLP hidden units, Megatron's column/row pairs), `kv` (per-head
width), `vocab` (split by tensor parallelism in both embedding and output layer). Mesh axes are
never named here.

Mixed precision keeps float32 master weights and computes in bfloat16 (the weights are cast
where they are used); layer norms and the softmax of attention run in float32.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from podkit import kernels
from podkit.config import GPTConfig
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


class LayerNorm(nnx.Module):
    """LayerNorm over `embed`, computed in float32 (its statistics need the digits)."""

    def __init__(self, embed: int, param_dtype: Any) -> None:
        self.scale = nnx.Param(jnp.ones((embed,), param_dtype), out_sharding=("embed",))
        self.bias = zeros_param((embed,), ("embed",), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        mean = h.mean(-1, keepdims=True)
        var = jnp.square(h - mean).mean(-1, keepdims=True)
        h = (h - mean) * jax.lax.rsqrt(var + 1e-5)
        return (h * self.scale[...] + self.bias[...]).astype(x.dtype)


class Attention(nnx.Module):
    """Causal multi-head self-attention; q, k, v in one (3, embed, heads, kv) weight. The
    attention itself is `c.attention`'s kernel (podkit.kernels.attention: "auto" is splash
    on a TPU, XLA elsewhere)."""

    def __init__(self, c: GPTConfig, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> None:
        kv = c.embed // c.heads
        self.dtype = dtype
        self.attention = kernels.check_implementation(c.attention)
        self.qkv = normal_param(rngs, (3, c.embed, c.heads, kv), (None, "embed", "heads", "kv"),
                          0.02, param_dtype)
        self.qkv_bias = zeros_param((3, c.heads, kv), (None, "heads", "kv"), param_dtype)
        # GPT-2's scaled init of the residual projections: 0.02 / sqrt(2 * layers).
        self.out = normal_param(rngs, (c.heads, kv, c.embed), ("heads", "kv", "embed"),
                          0.02 / math.sqrt(2 * c.layers), param_dtype)
        self.out_bias = zeros_param((c.embed,), ("embed",), param_dtype)
        # GPT-2's attn_pdrop: dropout on the probabilities, which must then exist in full.
        self.attn_drop = nnx.Dropout(c.attn_dropout, rngs=rngs) if c.attn_dropout else None
        if self.attn_drop is not None and \
                kernels.resolve_implementation(self.attention) == "splash":
            warnings.warn(
                f"model.attn_dropout = {c.attn_dropout} (a GPT-2 source's attn_pdrop unless "
                "written) drops attention probabilities, which splash attention never holds: "
                "training computes them with XLA's attention (B x heads x T x T per layer), "
                "not with splash; set model.attn_dropout = 0.0 to train with splash.",
                kernels.KernelFallbackWarning, stacklevel=2)

    def __call__(self, x: jax.Array, q_scale: jax.Array | None = None) -> jax.Array:
        """`q_scale`: multiplies q, so that the scores are scaled by it times the kernel's
        1 / sqrt(head_dim) (GPT-2's attention options, `q_scales`); None: by that alone."""
        w = self.qkv[...].astype(self.dtype)
        qkv = jnp.einsum("bte,cehd->cbthd", x, w) + self.qkv_bias[...].astype(
            self.dtype)[:, None, None]
        qkv = checkpoint_name(qkv, QKV_PROJ)  # what remat "save_qkv_proj" keeps
        q, k, v = qkv[0], qkv[1], qkv[2]
        if q_scale is not None:
            q = (q * q_scale).astype(q.dtype)
        if self.attn_drop is not None and not self.attn_drop.deterministic:  # training
            probs = self.attn_drop(kernels.attention_probabilities(q, k, causal=True))
            h = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
        else:
            h = kernels.dot_product_attention(q, k, v, causal=True,
                                              implementation=self.attention)
        return jnp.einsum("bthd,hde->bte", h, self.out[...].astype(self.dtype)) + \
            self.out_bias[...].astype(self.dtype)


class MLP(nnx.Module):
    def __init__(self, c: GPTConfig, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> None:
        self.dtype = dtype
        self.up = normal_param(rngs, (c.embed, c.mlp), ("embed", "mlp"), 0.02, param_dtype)
        self.up_bias = zeros_param((c.mlp,), ("mlp",), param_dtype)
        self.down = normal_param(rngs, (c.mlp, c.embed), ("mlp", "embed"),
                           0.02 / math.sqrt(2 * c.layers), param_dtype)
        self.down_bias = zeros_param((c.embed,), ("embed",), param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        d = self.dtype
        h = checkpoint_name(x @ self.up[...].astype(d) + self.up_bias[...].astype(d), MLP_IN)
        return jax.nn.gelu(h) @ self.down[...].astype(d) + self.down_bias[...].astype(d)


class Block(nnx.Module):
    def __init__(self, c: GPTConfig, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> None:
        self.norm1 = LayerNorm(c.embed, param_dtype)
        self.attn = Attention(c, rngs, dtype, param_dtype)
        self.norm2 = LayerNorm(c.embed, param_dtype)
        self.mlp = MLP(c, rngs, dtype, param_dtype)
        self.drop = nnx.Dropout(c.dropout, rngs=rngs)

    def __call__(self, x: jax.Array, q_scale: jax.Array | None = None) -> jax.Array:
        x = x + self.drop(checkpoint_name(self.attn(self.norm1(x), q_scale), OUT_PROJ))
        return x + self.drop(checkpoint_name(self.mlp(self.norm2(x)), MLP_OUT))


def q_scales(c: GPTConfig) -> np.ndarray | None:
    """Each block's multiplier of q (so of its attention scores) on top of the kernel's
    1 / sqrt(head_dim): transformers' GPT-2 scales the scores by 1 / sqrt(head_dim) when
    scale_attn_weights (`scale_attn`), and by 1 / (layer index + 1) more when
    scale_attn_by_inverse_layer_idx (`scale_attn_by_layer`). None: GPT-2's defaults (the
    kernel's scale alone, no multiply)."""
    if c.scale_attn and not c.scale_attn_by_layer:
        return None
    per_layer = np.ones(c.layers, np.float32)
    if not c.scale_attn:
        per_layer *= math.sqrt(c.embed // c.heads)  # undoes the kernel's 1 / sqrt(head_dim)
    if c.scale_attn_by_layer:
        per_layer /= np.arange(1, c.layers + 1, dtype=np.float32)
    return per_layer


class GPT(nnx.Module):
    """The decoder. `__call__(tokens (B, T) int) -> logits (B, T, vocab)` (float32), or
    LMLogits of those when `lazy_logits` is set (podkit's train step sets it) and
    `vocab_chunk` > 0."""

    def __init__(self, c: GPTConfig, vocab_size: int, seq_len: int, rngs: nnx.Rngs) -> None:
        if c.embed % c.heads:
            raise ConfigError(f"model.embed = {c.embed} is not divisible by model.heads = "
                              f"{c.heads}; each head gets embed / heads dims.")
        dtype, param_dtype = dtypes(c.precision)
        self.dtype, self.seq_len, self.vocab_size = dtype, seq_len, vocab_size
        context = self.context = c.context or seq_len  # positions it has; generate() reads
        if seq_len > context:
            raise ConfigError(f"a context of {seq_len} tokens (data.seq_len) is past the "
                              f"{context} positions of model.context; use {context} or less.")
        rows = vocab_rows(vocab_size, c.vocab_multiple)  # padded: rows past vocab_size unused
        self.tokens = normal_param(rngs, (rows, c.embed), ("vocab", "embed"), 0.02, param_dtype)
        self.positions = normal_param(rngs, (context, c.embed), (None, "embed"), 0.01,
                                      param_dtype)
        scales = q_scales(c)  # a tuple: static, the same in every trace
        self.q_scales = None if scales is None else tuple(float(v) for v in scales)
        if c.vocab_chunk < 0:
            raise ConfigError(f"model.vocab_chunk = {c.vocab_chunk}; it must be >= 0 (0: the "
                              "whole logits).")
        if c.remat != "none":
            remat_policy(c.remat, named=True)  # an unknown name fails here, named
        self.scan_layers, self.remat, self.vocab_chunk = c.scan_layers, c.remat, c.vocab_chunk
        make = lambda rngs: Block(c, rngs, dtype, param_dtype)
        if c.scan_layers:
            self.blocks = stacked_layers(make, c.layers, rngs)
        else:
            self.blocks = nnx.List(unstacked_layers(make, c.layers, rngs))
        self.norm = LayerNorm(c.embed, param_dtype)
        self.head = normal_param(rngs, (c.embed, rows), ("embed", "vocab"), 0.02, param_dtype)
        self.drop = nnx.Dropout(c.dropout, rngs=rngs)
        self.lazy_logits = False  # set by podkit's train step (module.train(lazy_logits=True))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        t = tokens.shape[-1]
        if t > self.seq_len:
            raise ConfigError(f"a sequence of {t} tokens is longer than the model's context "
                              f"of {self.seq_len}; cut it or build the model with a longer "
                              "data.seq_len.")
        # The token table is read whole along `embed` (gathered, as FSDP gathers every weight
        # where it is used). Looked up from its embed-split form instead, the lookup's
        # gradient (a scatter-add into that form) needs the batch-split output gradient split
        # over `embed`: on a mesh of `data` and `fsdp` XLA can only do that by replicating it
        # ("Involuntary full rematerialization").
        table = constrain(self.tokens[...], ("vocab", None))
        x = table[tokens] + self.positions[...][:t]
        x = self.drop(x.astype(self.dtype))
        run = run_stacked if self.scan_layers else run_unstacked
        if self.q_scales is None:
            x = run(self.blocks, x, self.remat)
        else:
            x = run(self.blocks, x, self.remat, per_layer=(jnp.asarray(self.q_scales),))
        x = self.norm(x)
        if self.lazy_logits and self.vocab_chunk:
            return LMLogits(x, self.head[...], self.vocab_chunk, vocab=self.vocab_size)
        return cut_vocab((x @ self.head[...].astype(self.dtype)).astype(jnp.float32),
                         self.vocab_size)


def build_gpt(config: GPTConfig, info: dict, seed: int = 0) -> Any:
    """An uncompiled pk.Model of a GPT sized by `config`, its vocabulary and context from the
    data (`info["vocab_size"]`, `info["seq_len"]`)."""
    from podkit.model import Model

    for key in ("vocab_size", "seq_len"):
        if key not in info:
            raise ConfigError(f"model.name = 'gpt' needs token data ([data] name = 'text'); "
                              f"this data has no {key}.")
    if info.get("packed"):
        raise ConfigError("packed instruction data (segment ids, positions per example) needs "
                          "the Llama family; for the GPT set data.packing = false (each "
                          "example a padded sequence of its own).")
    vocab, seq_len = info["vocab_size"], info["seq_len"]
    model = Model(lambda rngs: GPT(config, vocab, seq_len, rngs), seed=seed, name="gpt")
    model.model_config = config  # what podkit.models.hf.save_hf writes config.json from
    return model


def context_of(module: Any) -> int:
    """The context a GPT or Llama module is made for: a Hugging Face source's (its
    max_position_embeddings, GPT-2's position table), at least the seq_len it trains at."""
    return max(getattr(module, "context", 0), module.seq_len)


def window_of(module: Any, prompt: int, max_new_tokens: int) -> int:
    """generate()'s window: the prompt and the new tokens, at least the trained seq_len, at
    most the model's context (past it the window slides)."""
    return min(context_of(module), max(module.seq_len, prompt + max_new_tokens))


def generate(model: Any, prompt: list[int], max_new_tokens: int, temperature: float = 0.8,
             seed: int = 0, top_k: int = 0, stop: int | None = None) -> list[int]:
    """Sample `max_new_tokens` tokens after `prompt` from a trained GPT or Llama-family
    pk.Model, in one compiled loop with a KV cache (podkit.models.gpt_decode,
    podkit.models.llama_decode): the prompt is read once, each
    new token costs one position's forward pass; `temperature` 0 is greedy decoding (the
    likeliest token each time, as transformers' do_sample=False); `top_k > 0` samples among
    the k likeliest tokens only; `stop`: a token id (the end-of-text token) after which
    nothing more is generated (it is the last token returned). The window is the model's
    context (a Hugging Face source's max_position_embeddings or n_positions, else seq_len),
    as far as the prompt and the new tokens need: a prompt longer keeps its last tokens, and
    a full window keeps its last half and goes on.

    With several processes every process calls it with the same arguments and gets the same
    tokens: the program is collective work over the model's (sharded) state, and its only
    inputs besides the state are constants of the program, never a process's own array put
    onto the whole mesh. Each process then reads the sample from its own devices (the result
    is replicated), so nothing crosses processes after the program ends.
    """
    module = model.module()
    from podkit.models import gpt_decode, llama_decode
    from podkit.models.llama import Llama

    if isinstance(module, GPT):
        decoder: Any = gpt_decode.Decoder(module)
    elif isinstance(module, Llama):
        decoder = llama_decode.Decoder(module)
    else:
        raise ConfigError(f"generate() needs a GPT or Llama-family model, not "
                          f"{type(module).__name__}.")
    if not prompt:
        raise ConfigError("generate() needs a non-empty prompt (a list of token ids).")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
            or not temperature >= 0:
        raise ConfigError(f"temperature={temperature!r} must be a number >= 0 (0: greedy "
                          "decoding, the likeliest token each time).")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ConfigError(f"top_k={top_k!r} must be an int >= 0 (0: every token).")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1.")
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int)
                             or not 0 <= stop < module.vocab_size):
        raise ConfigError(f"stop={stop!r} must be a token id in [0, {module.vocab_size}) or "
                          "None.")
    bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int)
           or not 0 <= t < module.vocab_size]
    if bad:
        raise ConfigError(f"prompt tokens {bad[:5]} are not ids in [0, {module.vocab_size}); "
                          "encode the prompt with the data's tokenizer.")
    params = nnx.to_pure_dict(nnx.state(module, nnx.Param))
    # The window: what the prompt and the new tokens need, within the model's context (a
    # Hugging Face source's, past the seq_len it was trained at, as transformers reads it).
    t = window_of(module, len(prompt), max_new_tokens)
    dtype = module.dtype
    keep = t // 2  # what a full context keeps (see gpt_decode)
    prompt = [int(p) for p in prompt][-t:]
    replicated = jax.sharding.NamedSharding(model.strategy.mesh, jax.sharding.PartitionSpec())

    @functools.partial(jax.jit, out_shardings=replicated)
    def sample(params: Any) -> jax.Array:
        # Gathered once, before the loop: every token's forward then runs on whole weights.
        weights = decoder.stacked(jax.lax.with_sharding_constraint(params, replicated))
        window = jnp.zeros((t,), jnp.int32).at[:len(prompt)].set(jnp.asarray(prompt, jnp.int32))

        def forward(*args: Any) -> tuple:  # the padded table's extra ids cut off
            logits, cache = decoder.forward(*args)
            return cut_vocab(logits, module.vocab_size), cache

        def prefill(window: jax.Array) -> tuple:
            return forward(weights, window[None], jnp.int32(0),
                           decoder.empty_cache(weights, t, dtype), dtype)

        logits, cache = prefill(window)

        def one(carry: tuple) -> tuple:
            i, _, window, length, cache, last, out, key = carry
            key, sub = jax.random.split(key)
            if temperature == 0:  # greedy, as transformers' do_sample=False: the first of ties
                nxt = jnp.argmax(last).astype(jnp.int32)
            else:
                if 0 < top_k < last.shape[-1]:  # below the k-th largest: never drawn
                    kth = jax.lax.top_k(last, top_k)[0][-1]
                    last = jnp.where(last < kth, -jnp.inf, last)
                nxt = jax.random.categorical(sub, last / temperature).astype(jnp.int32)

            def refill(window: jax.Array) -> tuple:  # full: keep the last half, read again
                window = jnp.roll(window, keep - t)
                return window, jnp.int32(keep), prefill(window)[1]

            window, length, cache = jax.lax.cond(
                length >= t, refill, lambda w: (w, length, cache), window)
            window = window.at[length].set(nxt)
            logits, cache = forward(weights, nxt[None, None], length, cache, dtype)
            stopped = jnp.bool_(False) if stop is None else nxt == stop
            return (i + 1, stopped, window, length + 1, cache, logits[0, 0],
                    out.at[i].set(nxt), key)

        init = (jnp.int32(0), jnp.bool_(False), window, jnp.int32(len(prompt)), cache,
                logits[0, len(prompt) - 1], jnp.zeros((max_new_tokens,), jnp.int32),
                jax.random.key(seed))
        # Until max_new_tokens, or the stop token (included, as transformers' generate does).
        done = jax.lax.while_loop(lambda c: (c[0] < max_new_tokens) & ~c[1], one, init)
        return done[6], done[0]

    with model.strategy.scope():  # the attention kernel finds the mesh in the scope
        out, count = sample(params)
    # Replicated: this process's first device holds all of it (no cross-process fetch).
    local = np.asarray(out.addressable_shards[0].data)
    n = int(np.asarray(count.addressable_shards[0].data))
    return [int(v) for v in local[:n]]
