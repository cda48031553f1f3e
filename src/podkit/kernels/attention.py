"""Multi-head dot-product attention by name: XLA's, or Pallas splash attention on a TPU.

    out = dot_product_attention(q, k, v, causal=True)                  # "auto"
    out = dot_product_attention(q, k, v, causal=True, implementation="xla")

q, k, v are laid out (batch, time, heads, head_dim), as `jax.nn.dot_product_attention` takes
them; the result is (batch, q time, heads, v head_dim) in q's dtype, the scores scaled by
1/sqrt(head_dim).

Implementations (`implementation=`):
    "xla"     `jax.nn.dot_product_attention`: any shape, any mask; the (Tq, Tkv) scores of
              every head exist in memory (and are kept for the backward pass).
    "splash"  `jax.experimental.pallas.ops.tpu.splash_attention` with a causal (or full)
              mask: the scores live one block at a time in the core's memory, and blocks
              above the causal diagonal are skipped. Compiled by Mosaic on a TPU; elsewhere
              it runs in Pallas's interpreter (`interpret=True`: the same kernel, slowly —
              how the tests check it on CPU).
    "auto"    splash when `jax.devices()[0].platform == "tpu"`, XLA elsewhere.

What splash takes: no mask or the causal one (a padding `mask=` always goes through XLA),
query and key lengths that are multiples of 128, head dims up to 256 (every one from 8 to
256 compiled and matched XLA on a v5e chip, 100 and 200 included, and a v head dim other
than q's), float32 or bfloat16, as many k/v heads as q heads or a divisor of them
(grouped-query and multi-query attention: each k/v head serves its group, never repeated).
Anything else runs XLA's attention instead, with one `KernelFallbackWarning` per shape, never
an error.

Block sizes. Splash tiles the scores in (block_q, block_kv) blocks whose sides are multiples
of 128 (the TPU's lanes) and divide the length. podkit takes, for each length, the largest of
512, 384, 256, 128 that divides it (`block_size`): 512 for 1024 or 2048 tokens, 384 for 768,
256 for 256, 128 for 128 or 640; the same sizes serve the backward pass. 512 is MaxText's
choice; measured on one v5e chip (bf16, causal, forward + backward; B=8, T=1024, 12 heads of
64): XLA 4.55 ms, splash with blocks of 256 3.94 ms, 512 2.88 ms, 1024 2.97 ms, 512 with
the fused backward kernel 2.51 ms (T=2048, 8 heads of 128: XLA 16.9 ms, 512 5.63 ms, fused
4.88 ms). The backward pass uses that fused kernel (dq, dk, dv in one pass) while the keys
span at most 4 blocks: it keeps one partial dq per key block (4 x q's size at most, for a
moment), so longer sequences use the separate dq kernel instead.

Meshes. The kernel sees one device's arrays, so it runs inside `jax.shard_map`: each device
takes its share of the batch (mesh axes `data`, `fsdp`) and of the heads (`model`: tensor
parallelism); time and head_dim are never split. The mesh is, in order: `mesh=` (with
`spec=`, the PartitionSpec of q, k, v; default from podkit's axis names), the podkit
strategy in scope (podkit's compiled steps trace inside their model's strategy scope; its
rules for `batch` and `heads` give the split), JAX's mesh context (`jax.set_mesh`). A batch
or head count the mesh does not divide stays whole on every device (computed redundantly,
still correct). With no mesh, a single device runs the kernel directly; with several
devices it falls back to XLA (with the warning): XLA cannot partition a Pallas kernel.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from podkit.config import ATTENTION_IMPLEMENTATIONS
from podkit.errors import ConfigError
from podkit.sharding import Rules, parts_of, resolve_spec
from podkit.strategy import scoped_strategy

IMPLEMENTATIONS: tuple[str, ...] = ATTENTION_IMPLEMENTATIONS
LANES = 128  # splash's block sides are multiples of the TPU's 128 lanes
MAX_BLOCK = 512
MAX_HEAD_DIM = 256
FUSED_BACKWARD_MAX_BLOCKS = 4  # key blocks up to which the fused backward kernel is used
# podkit's mesh axis names (podkit.strategy): the batch over data and fsdp, heads over model.
MESH_RULES: Rules = (("batch", ("data", "fsdp")), ("heads", ("model",)))

# (reason, shapes, dtype) already warned about: one warning per shape, not one per trace.
_warned: set[tuple[Any, ...]] = set()


class KernelFallbackWarning(UserWarning):
    """A kernel was asked for a case it cannot take; XLA's attention ran instead."""


def check_implementation(implementation: Any) -> str:
    """`implementation` if it is a valid name; a ConfigError naming the valid ones if not."""
    if not isinstance(implementation, str) or implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"attention={implementation!r} is not an attention implementation; "
                          f"valid: {', '.join(repr(i) for i in IMPLEMENTATIONS)}.")
    return implementation


def resolve_implementation(implementation: str) -> str:
    """"xla" or "splash": what `implementation` means on this machine ("auto": splash on a
    TPU, XLA elsewhere)."""
    if check_implementation(implementation) == "auto":
        return "splash" if jax.devices()[0].platform == "tpu" else "xla"
    return implementation


def block_size(length: int) -> int:
    """The largest of 512, 384, 256, 128 that divides `length` (a multiple of 128)."""
    if length % LANES:
        raise ConfigError(f"splash attention needs a length that is a multiple of {LANES}, "
                          f"not {length}.")
    return next(b for b in range(MAX_BLOCK, 0, -LANES) if length % b == 0)


CAUSAL_SCOPE = "causal_attention"
"""The jax.named_scope a causal splash call runs under (what podkit.train.flops looks for)."""


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                          causal: bool, mask: jax.Array | None = None,
                          segment_ids: jax.Array | None = None,
                          implementation: str = "auto", mesh: Any = None, spec: P | None = None,
                          interpret: bool | None = None) -> jax.Array:
    """Attention of `query` (B, Tq, H, D) over `key` (B, Tkv, H, D) and `value`
    (B, Tkv, H, Dv) -> (B, Tq, H, Dv), in query's dtype.

    `causal`: query i sees keys j <= i. `mask`: a boolean array broadcastable to
    (B, H, Tq, Tkv), True where a query may attend (always computed by XLA).
    `segment_ids`: (B, T) ints, self-attention of packed sequences: a query attends only to
    keys of its own segment (splash takes them as its SegmentIds; XLA as a mask).
    `implementation`: "auto", "xla" or "splash" (see the module docstring). `mesh`, `spec`:
    the mesh splash runs over and the PartitionSpec of q, k, v on it (both default as the
    module docstring says). `interpret`: run splash in Pallas's interpreter (default: off a
    TPU)."""
    check_implementation(implementation)
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ConfigError(f"dot_product_attention takes (batch, time, heads, head_dim) arrays; "
                          f"got q {query.shape}, k {key.shape}, v {value.shape}.")
    if segment_ids is not None:
        if segment_ids.shape != query.shape[:2] or key.shape[1] != query.shape[1]:
            raise ConfigError(f"segment_ids of shape {segment_ids.shape} apply to self-"
                              f"attention of (batch, time) = {query.shape[:2]}; got q "
                              f"{query.shape}, k {key.shape}.")
        if mask is not None or resolve_implementation(implementation) != "splash":
            same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
            mask = same if mask is None else mask & same
            segment_ids = None
    if mask is None and resolve_implementation(implementation) == "splash":
        reason = _unsupported(query, key, value)
        placement = _placement(mesh, spec)
        if reason is None and placement is None and jax.device_count() > 1:
            reason = ("no mesh to run it over on several devices (pass mesh=, use a podkit "
                      "strategy scope or jax.set_mesh)")
        if reason is None:
            if interpret is None:
                interpret = jax.devices()[0].platform != "tpu"
            # The scope tells FLOP counters (podkit.train.flops) the kernel skips the masked
            # half: a Pallas call states no FLOPs of its own.
            with jax.named_scope(CAUSAL_SCOPE if causal else "attention"):
                return _splash(query, key, value, causal, placement, interpret, segment_ids)
        _warn_once(reason, query, key, value)
        if segment_ids is not None:  # XLA's attention takes them as a mask
            mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    if query.shape[3] == value.shape[3]:
        return jax.nn.dot_product_attention(query, key, value, mask=mask, is_causal=causal,
                                            implementation="xla")
    # jax.nn takes one head dim for q, k and v; the same computation for a v of its own.
    probs = attention_probabilities(query, key, causal=causal, mask=mask)
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(value.dtype), value)


def attention_probabilities(query: jax.Array, key: jax.Array, *, causal: bool,
                            mask: jax.Array | None = None) -> jax.Array:
    """The attention probabilities (B, H, Tq, Tkv) in float32, as XLA's attention computes
    them (softmax of the scaled scores, masked places at the float32 minimum first): for
    what needs them in full, e.g. dropout on them."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(query.shape[-1])
    allowed = jnp.ones(scores.shape[-2:], bool)
    if causal:
        allowed = jnp.tril(allowed)
    if mask is not None:
        allowed = allowed & mask
    return jax.nn.softmax(jnp.where(allowed, scores, jnp.finfo(jnp.float32).min), axis=-1)


def _unsupported(q: jax.Array, k: jax.Array, v: jax.Array) -> str | None:
    """Why splash cannot take these arrays, or None."""
    if q.dtype not in (jnp.float32, jnp.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return (f"dtypes q {q.dtype}, k {k.dtype}, v {v.dtype} (it takes float32 or bfloat16, "
                "the same for all three)")
    if k.shape[2] != v.shape[2] or q.shape[2] % k.shape[2]:
        return (f"{k.shape[2]} k and {v.shape[2]} v heads for {q.shape[2]} query heads (it "
                "takes as many k as v heads, a divisor of the query heads)")
    if q.shape[1] % LANES or k.shape[1] % LANES:
        return (f"a query length of {q.shape[1]} and a key length of {k.shape[1]} (it takes "
                f"multiples of {LANES})")
    if max(q.shape[3], v.shape[3]) > MAX_HEAD_DIM:
        return (f"head dims {q.shape[3]} (q, k) and {v.shape[3]} (v) (it takes up to "
                f"{MAX_HEAD_DIM})")
    return None


def _warn_once(reason: str, q: jax.Array, k: jax.Array, v: jax.Array) -> None:
    seen = (reason, q.shape, k.shape, v.shape, str(q.dtype))
    if seen in _warned:
        return
    _warned.add(seen)
    warnings.warn(f"splash attention cannot take {reason}; XLA's attention runs instead for "
                  f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} {q.dtype}.",
                  KernelFallbackWarning, stacklevel=3)


def _placement(mesh: Any, spec: P | None) -> tuple[Any, P] | None:
    """(mesh, PartitionSpec of q, k, v) for the kernel's shard_map, or None (no mesh)."""
    rules = MESH_RULES
    if mesh is None:
        strategy = scoped_strategy()
        if strategy is not None:
            mesh, rules = strategy.mesh, strategy.rules
        elif not jax.sharding.get_abstract_mesh().empty:
            mesh = jax.sharding.get_abstract_mesh()
    if mesh is None:
        if spec is not None:
            raise ConfigError(f"dot_product_attention(spec={spec}) needs mesh= as well.")
        return None
    if spec is None:
        spec = resolve_spec(("batch", None, "heads", None), rules, mesh)
    entries = (*spec, None, None, None, None)[:4]
    if len(spec) > 4 or entries[1] is not None or entries[3] is not None:
        raise ConfigError(f"dot_product_attention(spec={spec}): splash splits only the batch "
                          "(dim 0) and the heads (dim 2) of (batch, time, heads, head_dim).")
    return mesh, P(*entries)


def _splash(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool,
            placement: tuple[Any, P] | None, interpret: bool,
            segment_ids: jax.Array | None = None) -> jax.Array:
    run = functools.partial(_splash_local, causal=causal, interpret=interpret)
    if placement is None:
        return run(q, k, v, segment_ids)
    mesh, spec = placement
    batch, _, heads, _ = spec
    # A dim the mesh does not divide is not split: each device computes all of it.
    if q.shape[0] % parts_of(batch, mesh):
        batch = None
    if q.shape[2] % parts_of(heads, mesh) or k.shape[2] % parts_of(heads, mesh):
        heads = None  # grouped k/v heads: split only where both counts divide
    spec = P(batch, None, heads, None)
    if segment_ids is None:
        return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                             check_vma=False)(q, k, v)
    return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec, P(batch, None)),
                         out_specs=spec, check_vma=False)(q, k, v, segment_ids)


def _splash_local(q: jax.Array, k: jax.Array, v: jax.Array,
                  segment_ids: jax.Array | None = None, *, causal: bool,
                  interpret: bool) -> jax.Array:
    """Splash on one device's (batch, time, heads, head_dim) arrays: the kernel takes
    (heads, time, head_dim) per example, so it is vmapped over the batch. Fewer k/v heads
    than query heads (grouped-query attention) go in as they are: the kernel reads k/v head
    h // (heads / kv_heads) for query head h, nothing repeated in memory."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    _, q_len, heads, head_dim = q.shape
    kv_len = k.shape[1]
    q = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)  # splash does not scale
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))
    shape = (q_len, kv_len)
    head_mask = splash.CausalMask(shape) if causal else splash.FullMask(shape)
    bq, bkv = block_size(q_len), block_size(kv_len)
    fused = kv_len // bkv <= FUSED_BACKWARD_MAX_BLOCKS
    blocks = splash.BlockSizes(
        block_q=bq, block_kv=bkv, block_kv_compute=bkv,
        block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
        block_q_dq=None if fused else bq, block_kv_dq=None if fused else bkv,
        use_fused_bwd_kernel=fused)
    kernel = splash.make_splash_mha(splash.MultiHeadMask([head_mask] * heads),
                                    block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)
    if segment_ids is None:
        return jnp.swapaxes(jax.vmap(kernel)(q, k, v), 1, 2)
    # Packed sequences: a query block skips the key blocks of other segments.
    ids = segment_ids.astype(jnp.int32)
    segmented = lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s))
    return jnp.swapaxes(jax.vmap(segmented)(q, k, v, ids), 1, 2)
