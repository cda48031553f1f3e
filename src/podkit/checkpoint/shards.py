"""One process's shards of named arrays as one byte buffer, and back into arrays.

    plan = layout(flat)                 # every process's shards: names, indices, offsets
    buffer = pack(flat, plan)           # this process's shards, packed on its first device
    flat = rebuild(targets, plan[p], bytes_of_p)   # arrays on the current shardings

The local checkpoint tier stores, per process, only the shards that process holds (no global
coordination, no Orbax): the raw bytes of each distinct shard (a shard replicated on several
of its devices is stored once), and an index of array name, global shape, dtype and each
shard's index with its offset in the buffer. Every process can compute every process's index
from the shardings alone, so a peer can check a copy it holds without asking. The packing is
one jitted program on the process's first device: dispatched like a step, the loop does not
wait for it, and its output is a new buffer (the loop may donate the state afterwards).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from podkit.checkpoint import peer

ALIGN = 16  # each shard starts at a multiple of this in the buffer


def _index(index: tuple, shape: tuple) -> list[list[int]]:
    """A shard's index (a tuple of slices) as [[start, stop], ...] over every dimension."""
    return [list(s.indices(d)[:2]) for s, d in zip(index, shape, strict=True)] if index \
        else []


def _nbytes(index: list[list[int]], dtype: np.dtype) -> int:
    return math.prod(b - a for a, b in index) * dtype.itemsize


def layout(flat: dict[str, Any]) -> list[dict]:
    """Every process's record of its shards, index = process: {"arrays": {name: {"shape",
    "dtype", "shards": [[index, offset, nbytes], ...]}}, "length": bytes}. Computed from the
    arrays' shardings, the same on every process."""
    n = jax.process_count()
    plans: list[dict] = [{"arrays": {}, "length": 0} for _ in range(n)]
    for name in sorted(flat):
        a = flat[name]
        shape, dtype = tuple(np.shape(a)), np.dtype(a.dtype)
        if isinstance(a, jax.Array):
            where = a.sharding.devices_indices_map(shape)
        else:  # a host value: whole on every process
            where = {d: tuple(slice(None) for _ in shape) for d in peer.devices()}
        for p, plan in enumerate(plans):
            seen: list[list[list[int]]] = []
            for d in sorted((d for d in where if d.process_index == p), key=lambda d: d.id):
                index = _index(where[d], shape)
                if index not in seen:
                    seen.append(index)
            shards = []
            for index in seen:
                size = _nbytes(index, dtype)
                shards.append([index, plan["length"], size])
                plan["length"] += -(-size // ALIGN) * ALIGN
            plan["arrays"][name] = {"shape": list(shape), "dtype": dtype.name, "shards": shards}
    return plans


def pieces(flat: dict[str, Any], plan: dict) -> list[jax.Array]:
    """This process's distinct shards, in `plan`'s order, on its transfer device."""
    dev = peer.device()
    out = []
    for name in sorted(flat):
        a = flat[name]
        entry = plan["arrays"][name]
        if not isinstance(a, jax.Array):
            out.append(jax.device_put(np.asarray(a), dev))
            continue
        held = {tuple(map(tuple, _index(s.index, a.shape))): s for s in
                sorted(a.addressable_shards, key=lambda s: s.device.id)}
        for index, _, _ in entry["shards"]:
            out.append(jax.device_put(held[tuple(map(tuple, index))].data, dev))
    return out


def pack(flat: dict[str, Any], plan: dict, length: int) -> jax.Array:
    """This process's shards as one uint8 buffer of `length` bytes (>= plan["length"]) on its
    transfer device; dispatched, not awaited."""
    return _packer(length)(*pieces(flat, plan))


@functools.cache
def _packer(length: int) -> Any:
    def run(*xs: jax.Array) -> jax.Array:
        parts, used = [], 0
        for x in xs:
            b = _as_bytes(x)
            pad = -b.shape[0] % ALIGN
            parts += [b, jnp.zeros(pad, jnp.uint8)] if pad else [b]
            used += b.shape[0] + pad
        parts.append(jnp.zeros(length - used, jnp.uint8))
        return jnp.concatenate(parts)

    return jax.jit(run)


def _as_bytes(x: jax.Array) -> jax.Array:
    """An array's bytes in memory order (little-endian, C order), as 1-D uint8."""
    x = x.ravel()
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if x.dtype.itemsize == 1:
        return jax.lax.bitcast_convert_type(x, jnp.uint8)
    return jax.lax.bitcast_convert_type(x, jnp.uint8).ravel()


def check(targets: dict[str, Any], plan: dict, process: int,
          optional: tuple[str, ...] = ()) -> str | None:
    """Why `plan` (process `process`'s saved shards) cannot give that process its shards of
    `targets` ({name: ShapeDtypeStruct with the current sharding}); None when it can."""
    saved = plan["arrays"]
    missing = [n for n in targets if n not in saved and not n.startswith(optional)]
    extra = [n for n in saved if n not in targets]
    if missing or extra:
        return f"other arrays (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, t in targets.items():
        if name not in saved:
            continue
        entry = saved[name]
        if tuple(entry["shape"]) != tuple(t.shape) or entry["dtype"] != np.dtype(t.dtype).name:
            return (f"{name} was {tuple(entry['shape'])} {entry['dtype']}, this model needs "
                    f"{tuple(t.shape)} {np.dtype(t.dtype).name}")
        have = {tuple(map(tuple, s[0])) for s in entry["shards"]}
        where = t.sharding.devices_indices_map(tuple(t.shape))
        for d, index in where.items():
            if d.process_index == process and \
                    tuple(map(tuple, _index(index, t.shape))) not in have:
                return f"{name} is sharded differently (another mesh)"
    return None


def rebuild(targets: dict[str, Any], plan: dict, data: Any) -> dict[str, jax.Array]:
    """The arrays of `targets` on their shardings from this process's saved shards (`plan`,
    `data`: its bytes); arrays `plan` lacks (optional ones, `check` said) are zeros."""
    buf = memoryview(data)
    out = {}
    for name, t in targets.items():
        shape, sharding = tuple(t.shape), t.sharding
        entry = plan["arrays"].get(name)
        if entry is None:
            out[name] = jax.make_array_from_callback(
                shape, sharding, lambda index, t=t: np.zeros(t.shape, t.dtype)[index])
            continue
        dtype = jnp.dtype(entry["dtype"])
        stored = {tuple(map(tuple, index)): (offset, size)
                  for index, offset, size in entry["shards"]}
        singles = []
        for d, index in sharding.addressable_devices_indices_map(shape).items():
            idx = _index(index, shape)
            offset, size = stored[tuple(map(tuple, idx))]
            part = np.frombuffer(buf[offset:offset + size], dtype=dtype).reshape(
                [b - a for a, b in idx])
            singles.append(jax.device_put(part, d))
        out[name] = jax.make_array_from_single_device_arrays(shape, sharding, singles)
    return out
