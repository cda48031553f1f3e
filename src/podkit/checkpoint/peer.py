"""Bytes from each process to a neighbour process, over the devices' own collectives.

    received = shift(buffer, +1)   # process i's buffer arrives at process (i + 1) % n

The local checkpoint tier keeps a copy of each process's shards on one peer process: a real
transfer between processes (on a cluster each host's disk is its own), not a file another
process writes. Each process hands in a uint8 buffer of the same length on its first device;
one jitted `ppermute` over a mesh of one device per process moves every buffer one process on
(or back: a restore fetches a lost copy from the peer that holds it). On CPU devices the
collective is gloo's; on accelerators it is the interconnect's.

A call dispatches a collective program: every process must make the same calls in the same
order, from the thread that dispatches the training steps (programs with collectives that
different processes dispatch in different orders wait for each other forever).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

ALIGN = 1 << 16  # buffer lengths are rounded up to this: a new length is a new program


def padded(length: int) -> int:
    """The transfer length for `length` bytes (rounded up, so that saves of a state whose
    records grow by a few bytes reuse one compiled program)."""
    return max(ALIGN, -(-length // ALIGN) * ALIGN)


def device() -> Any:
    """This process's transfer device: its first device."""
    return devices()[jax.process_index()]


def devices() -> list[Any]:
    """One device per process (its lowest id), in process order."""
    by_process: dict[int, Any] = {}
    for d in jax.devices():
        p = d.process_index
        if p not in by_process or d.id < by_process[p].id:
            by_process[p] = d
    return [by_process[p] for p in range(jax.process_count())]


@functools.cache
def _shifter(processes: int, by: int) -> Any:
    from jax.sharding import Mesh, PartitionSpec

    mesh = Mesh(np.array(devices()), ("p",))
    perm = [(i, (i + by) % processes) for i in range(processes)]

    def move(x: jax.Array) -> jax.Array:
        return jax.lax.ppermute(x, "p", perm)

    return mesh, jax.jit(jax.shard_map(move, mesh=mesh, in_specs=PartitionSpec("p"),
                                       out_specs=PartitionSpec("p")))


def shift(buffer: Any, by: int) -> jax.Array:
    """`buffer` (a 1-D uint8 jax.Array on `device()`, or numpy bytes, the same length on every
    process) sent to process (i + by) % n; returns what arrived from process (i - by) % n,
    on `device()`. Dispatched, not awaited: read it (np.asarray) when the bytes are needed."""
    from jax.sharding import NamedSharding, PartitionSpec

    n = jax.process_count()
    if not isinstance(buffer, jax.Array):
        buffer = jax.device_put(np.asarray(buffer, np.uint8), device())
    mesh, move = _shifter(n, by % n)
    whole = jax.make_array_from_single_device_arrays(
        (n * buffer.shape[0],), NamedSharding(mesh, PartitionSpec("p")), [buffer])
    return move(whole).addressable_data(0)
