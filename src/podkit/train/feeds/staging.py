"""Arrays kept on the devices across fit()/evaluate()/predict() calls while unchanged."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import numpy as np
import xxhash
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding, PartitionSpec

from podkit.train.feeds.placement import from_host_copy

# Staged arrays are replicated on every device: stage only what is small next to device memory.
DEFAULT_STAGE_BYTES = int(os.environ.get("PODKIT_STAGE_BYTES", 2 << 30))


def nbytes(tree: Any) -> int:
    """The bytes of a pytree of host or device arrays."""
    return sum(a.nbytes if hasattr(a, "nbytes") else np.asarray(a).nbytes
               for a in jax.tree.leaves(tree))


def fingerprint(tree: Any) -> tuple:
    """Identifies the contents of host arrays (a 128-bit hash at memory speed: ~10 ms for
    200 MB) and device arrays (immutable: by identity)."""
    out = []
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            out.append(("device", id(leaf)))
            continue
        a = np.ascontiguousarray(leaf)
        # as bytes: a buffer of ml_dtypes' bfloat16 has no format memoryview knows
        raw = memoryview(a.reshape(-1).view(np.uint8))
        out.append((a.shape, a.dtype.name, xxhash.xxh3_128_hexdigest(raw)))
    return tuple(out)


class StagingCache:
    """Arrays a model has staged on its devices, one slot per role ("train", "validation",
    ...): a later call on the same contents reuses them instead of copying them again. A
    change in place is seen (the contents are hashed each call); a role's new data replaces its
    old copy (freed first), and the slots together stay within the staging budget (the least
    recently used go first)."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = DEFAULT_STAGE_BYTES if budget is None else budget
        self._slots: dict[str, tuple[tuple, Any, list, int]] = {}  # insertion order = LRU
        self.hits = self.misses = 0

    def stage(self, role: str, tree: Any, sharding: NamedSharding, rows: int = 1) -> Any:
        """`tree` on the devices with `sharding`, each leaf laid out for gathering `rows`
        rows at a time (see gather_format)."""
        formats = tuple(gather_format(np.shape(a), np.result_type(a), sharding, rows)
                        for a in jax.tree.leaves(tree))
        key = (jax.tree.structure(tree), fingerprint(tree), sharding, formats)
        slot = self._slots.pop(role, None)  # freed unless it is a hit
        if slot is not None and slot[0] == key:
            self._slots[role] = slot  # most recently used now
            self.hits += 1
            return slot[1]
        del slot
        size = nbytes(tree)
        while self._slots and sum(s[3] for s in self._slots.values()) + size > self.budget:
            self._slots.pop(next(iter(self._slots)))
        placed = from_host_copy(tree, sharding)
        if any(f is not None for f in formats):  # on the devices: one copy, once per staging
            leaves, structure = jax.tree.flatten(placed)
            placed = structure.unflatten([a if f is None or a.format == f else
                                          jax.device_put(a, f)
                                          for a, f in zip(leaves, formats, strict=True)])
        # Device inputs are kept alive with their key: an id is only unique while it lives.
        self._slots[role] = (key, placed, [a for a in jax.tree.leaves(tree)
                                           if isinstance(a, jax.Array)], size)
        self.misses += 1
        return placed

    def release(self, role: str) -> None:
        """Free a role's copy (its new data is fed from the host instead)."""
        self._slots.pop(role, None)


# A TPU lays out a large array by its shape alone: bf16[1024, 224, 224, 3] gets the row dim
# minor (major_to_minor (1, 3, 2, 0)), good for a convolution's batch and bad for a gather of
# rows. A step that gathers its batch from such an array made XLA copy all of it (308 MB)
# into a gatherable layout at the start of every execution: ResNet-50 fed from staged images
# ran at 0.995x the same steps fed whole batches on the v5e chip. Staged in the layout XLA
# picks for the gather itself (Layout.AUTO), the jitted steps take it as it is (jit compiles
# for a committed array's layout): 1.000x.

def gather_format(shape: tuple[int, ...], dtype: Any, sharding: Any, rows: int
                  ) -> Format | None:
    """The format XLA chooses for an array of `shape` that a program gathers `rows` rows of
    (compiled once per signature: a gather alone, with the array's layout left to XLA).
    None where layouts need no choosing: arrays of one dim, and platforms whose default
    layout is row-major (CPU and GPU)."""
    device = next(iter(sharding.device_set))
    if len(shape) < 2 or device.platform not in RELAYOUT_PLATFORMS:
        return None
    return _gather_format(tuple(shape), np.dtype(dtype), sharding, rows)


@functools.lru_cache(maxsize=64)
def _gather_format(shape: tuple[int, ...], dtype: np.dtype, sharding: Any, rows: int
                   ) -> Format:
    ids_sharding = (NamedSharding(sharding.mesh, PartitionSpec())
                    if isinstance(sharding, NamedSharding) else sharding)
    gather = jax.jit(lambda data, ids: data[ids],
                     in_shardings=(Format(Layout.AUTO, sharding), ids_sharding))
    compiled = gather.lower(
        jax.ShapeDtypeStruct(shape, dtype, sharding=sharding),
        jax.ShapeDtypeStruct((max(1, min(rows, shape[0])),), np.int32, sharding=ids_sharding)
    ).compile()
    return compiled.input_formats[0][0]


# Where gather_format asks XLA (TPUs lay arrays out by shape; tests add "cpu" to run it).
RELAYOUT_PLATFORMS = {"tpu"}
