"""A program's running sums, packed: one device array per dtype across the call boundary.

    layout = SumsLayout.of(zeros)         # zeros: the sums' tree ({entry: {part: array}})
    packed = layout.pack(tree)            # a tuple of vectors (traced: jnp; host: xp=np)
    tree = layout.unpack(packed)          # the tree again

The steps add each batch's loss and metric contributions to running sums (podkit.metrics).
Inside a compiled step they are that tree; between calls they travel packed, every sum of
one dtype raveled into one vector (the built-in metrics' are all float32: one vector). Each
output of a program costs XLA:CPU a buffer and the call an array object: a step dispatched
one at a time with six scalar sums out took ~28 us more than the same step without them,
~3 us more with them packed (a small model on one CPU device; issue 41). The tree's layout
is what checkpoints keep, so Program converts at the edges (`Program.sums_tree`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class SumsLayout:
    """Where each sum of a tree lives in the packed vectors."""

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]  # per leaf, in the tree's leaf order
    dtypes: tuple[np.dtype, ...]  # the packed vectors' dtypes
    slots: tuple[tuple[int, int, int], ...]  # per leaf: (vector, start, size)

    @classmethod
    def of(cls, zeros: Any) -> SumsLayout:
        leaves, treedef = jax.tree.flatten(zeros)
        kinds = [np.dtype(np.result_type(a)) for a in leaves]
        dtypes = tuple(sorted(set(kinds), key=str))
        filled = [0] * len(dtypes)
        slots = []
        for a, kind in zip(leaves, kinds, strict=True):
            g, size = dtypes.index(kind), math.prod(np.shape(a))
            slots.append((g, filled[g], size))
            filled[g] += size
        return cls(treedef, tuple(tuple(np.shape(a)) for a in leaves), dtypes, tuple(slots))

    def pack(self, tree: Any, xp: Any = jnp) -> tuple:
        """The tree's sums as one vector per dtype."""
        leaves = self.treedef.flatten_up_to(tree)
        parts: list[list] = [[] for _ in self.dtypes]
        for a, (g, _, _) in zip(leaves, self.slots, strict=True):
            parts[g].append(xp.ravel(xp.asarray(a, dtype=self.dtypes[g])))
        return tuple(xp.concatenate(p) if p else xp.zeros((0,), d)
                     for p, d in zip(parts, self.dtypes, strict=True))

    def unpack(self, packed: tuple) -> Any:
        """The tree from its packed vectors (traced arrays, or numpy on the host)."""
        return self.treedef.unflatten([
            packed[g][start:start + size].reshape(shape)
            for (g, start, size), shape in zip(self.slots, self.shapes, strict=True)])
