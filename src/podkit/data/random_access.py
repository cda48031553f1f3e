"""The index-mapped Grain MapDatasets that ops build their random-access part from.

Element i of every dataset here is a pure function of i, so worker processes can compute any
slice and an iterator resumes from one index. Which op builds which is up to the op
(podkit.data.ops); nothing here knows about plan nodes.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from podkit.data import batching, sources, structure
from podkit.data._grain import grain

INFINITE = sys.maxsize  # Grain's length of an endless MapDataset


# -- index-remapping datasets with batched reads ------------------------------------------------
# Grain's per-element path costs tens of microseconds (stats, tracing, one index_shuffle call
# per element). These nodes map whole index arrays with numpy, and a batch over in-memory
# arrays is one fancy-indexing gather: no Python per element at all.
def gathers(ds: grain.MapDataset) -> bool:
    return bool(getattr(ds, "can_gather", False))


def read(ds: grain.MapDataset, indices: np.ndarray) -> list:
    return ds._getitems([int(i) for i in indices])  # noqa: SLF001 - Grain's batched read


def concatenate(parts: list[grain.MapDataset]) -> grain.MapDataset:
    return grain.MapDataset.concatenate(parts)


class Source(grain.MapDataset):
    """Any __len__/__getitem__ source; batched reads where it has them (ArrayRecord does)."""

    def __init__(self, source: Any) -> None:
        super().__init__()
        self._source = source

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._source[index]

    def _getitems(self, indices: Any) -> list:
        batched = getattr(self._source, "__getitems__", None)
        if batched is not None and (sources.BATCHED_READS or isinstance(self._source,
                                                                         sources.ArrayRecords)):
            return list(batched(list(indices)))
        return [self._source[i] for i in indices]

    def __str__(self) -> str:
        return f"podkit.Source({type(self._source).__name__})"


class ArraySource(Source):
    """from_tensor_slices / range: rows of arrays, gathered many at a time."""

    can_gather = True

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """The source rows behind elements `indices` (for fit()'s staged input)."""
        return indices

    def gather(self, indices: np.ndarray) -> Any:
        src = self._source
        if isinstance(src, sources.Range):
            return (src.start + indices.astype(np.int64) * src.step).astype(np.int64)
        return structure.map_structure(lambda t: t[indices], src.tensors)


class Affine:
    def __init__(self, start: int, step: int) -> None:
        self.start, self.step = start, step

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        return self.start + indices * self.step


class Permutation:
    """A seeded permutation of [0, n): whole when the buffer covers n, else window by window
    (an element moves within its window of `window` positions). Computed once, with numpy."""

    MAX_FULL = 1 << 26  # beyond this, keep memory flat: permute windows of this size instead

    def __init__(self, seed: int, n: int, window: int) -> None:
        self.seed, self.n = seed, n
        self.window = min(window, n, self.MAX_FULL)
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, w: int) -> np.ndarray:
        perm = self._perms.get(w)
        if perm is None:
            start = w * self.window
            size = min(self.window, self.n - start)
            if len(self._perms) > 8:
                self._perms.clear()
            rng = np.random.default_rng([self.seed, w])
            perm = self._perms[w] = start + rng.permutation(size).astype(np.int64)
        return perm

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        windows, offsets = np.divmod(indices, self.window)
        if len(indices) and windows[0] == windows[-1]:  # the common case: one window
            return self._perm(int(windows[0]))[offsets]
        out = np.empty_like(indices)
        for w in np.unique(windows):
            sel = windows == w
            out[sel] = self._perm(int(w))[offsets[sel]]
        return out

    def __getstate__(self) -> dict:  # workers recompute the permutation, not receive it
        return {**self.__dict__, "_perms": {}}


class Remap(grain.MapDataset):
    """Element i is the parent's element fn(i): take, skip, shard and shuffle."""

    def __init__(self, parent: grain.MapDataset, length: int, fn: Any) -> None:
        super().__init__(parent)
        self._n, self._fn = length, fn
        self.can_gather = gathers(parent)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[int(self._fn(np.asarray([index], np.int64))[0])]

    def _getitems(self, indices: Any) -> list:
        return read(self._parent, self._fn(np.asarray(indices, np.int64)))

    def gather(self, indices: np.ndarray) -> Any:
        return self._parent.gather(self._fn(indices))

    def rows(self, indices: np.ndarray) -> np.ndarray:
        return self._parent.rows(self._fn(indices))

    def __str__(self) -> str:
        return f"podkit.Remap({type(self._fn).__name__})"


class MapMapDataset(grain.MapDataset):
    """fn(index, element) for each element; batched reads pass through to the parent."""

    def __init__(self, parent: grain.MapDataset, fn: Any) -> None:
        super().__init__(parent)
        self._fn = fn

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._fn(index, self._parent[index])

    def _getitems(self, indices: Any) -> list:
        fn = self._fn
        return [fn(i, e) for i, e in zip(indices, read(self._parent, np.asarray(indices)),
                                         strict=True)]

    def __str__(self) -> str:
        return f"podkit.MapMapDataset({self._fn!r})"


class BatchMapDataset(grain.MapDataset):
    """Batch i holds elements [i*size, (i+1)*size): read together, stacked or padded."""

    def __init__(self, parent: grain.MapDataset, size: int, drop: bool, fn: Any) -> None:
        super().__init__(parent)
        self._size, self._drop, self._fn = size, drop, fn
        self._parent_n = len(parent)
        self._fast = gathers(parent) and isinstance(fn, batching.Stack)

    def __len__(self) -> int:
        n = self._parent_n
        if n == INFINITE:
            return INFINITE
        return n // self._size if self._drop else -(-n // self._size)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        start = index * self._size
        indices = np.arange(start, min(start + self._size, self._parent_n), dtype=np.int64)
        if self._fast:
            return self._parent.gather(indices)
        return self._fn(read(self._parent, indices))

    def _getitems(self, indices: Any) -> list:
        return [self[i] for i in indices]

    def batch_rows(self, index: int) -> np.ndarray:
        """Source rows of batch `index`, when the batch is a plain gather of in-memory rows."""
        start = index * self._size
        indices = np.arange(start, min(start + self._size, self._parent_n), dtype=np.int64)
        return self._parent.rows(indices)

    def element_rows(self) -> np.ndarray:
        """Source rows of every element below the batches, in order (fit()'s staged input)."""
        return self._parent.rows(np.arange(self._parent_n, dtype=np.int64))

    def __str__(self) -> str:
        return "podkit.BatchMapDataset"


class Enumerate:
    def __init__(self, start: int) -> None:
        self.start = start

    def __call__(self, index: int, element: Any) -> tuple[np.int64, Any]:
        return np.int64(self.start + index), element


class RepeatMapDataset(grain.MapDataset):
    """Repetition e of the parent is built for path + (e,), so shuffles below reshuffle.

    `parent` is a plan node (podkit.data.ops): its build(ctx, path) gives each repetition."""

    def __init__(self, parent: Any, ctx: Any, path: tuple[int, ...], count: int | None,
                 ) -> None:
        self._node, self._ctx, self._path = parent, ctx, path
        first = parent.build(ctx, path + (0,))
        super().__init__(first)
        self._n = len(first)
        self._count = count
        self._varies = parent.varies()
        self._built: dict[int, grain.MapDataset] = {0: first}
        self.can_gather = gathers(first)

    def __len__(self) -> int:
        if self._n == 0 or self._count == 0:
            return 0
        if self._count is None or self._n == INFINITE:
            return INFINITE
        return self._n * self._count

    def _repetition(self, e: int) -> grain.MapDataset:
        if not self._varies:
            return self._built[0]
        ds = self._built.get(e)
        if ds is None:
            if len(self._built) > 4:  # keep memory flat over endless repeats
                self._built = {k: v for k, v in self._built.items() if k >= e - 2}
            ds = self._built[e] = self._node.build(self._ctx, self._path + (e,))
        return ds

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        if self._n == INFINITE:
            return self._built[0][index]
        e, i = divmod(index, self._n)
        return self._repetition(e)[i]

    def _split(self, indices: np.ndarray) -> list[tuple[grain.MapDataset, np.ndarray]]:
        if self._n == INFINITE:
            return [(self._built[0], indices)]
        reps, offsets = np.divmod(indices, self._n)
        return [(self._repetition(int(e)), offsets[reps == e]) for e in np.unique(reps)]

    def _getitems(self, indices: Any) -> list:
        out: list = []
        for ds, offsets in self._split(np.asarray(indices, np.int64)):  # indices ascend
            out.extend(read(ds, offsets))
        return out

    def rows(self, indices: np.ndarray) -> np.ndarray:
        return np.concatenate([ds.rows(offsets) for ds, offsets in self._split(indices)])

    def epoch_rows(self, e: int) -> np.ndarray:
        """Source rows of every element of repetition e of a batched dataset, in order."""
        return self._repetition(e).element_rows()

    def gather(self, indices: np.ndarray) -> Any:
        parts = [ds.gather(offsets) for ds, offsets in self._split(indices)]
        if len(parts) == 1:
            return parts[0]
        return structure.map_structure(lambda *a: np.concatenate(a), *parts)

    def __str__(self) -> str:
        return "podkit.RepeatMapDataset"


class ZipMapDataset(grain.MapDataset):
    """zip: as long as the shortest parent; elements in the structure the user gave."""

    def __init__(self, parents: list[grain.MapDataset], template: Any) -> None:
        super().__init__(parents)
        self._template = template
        self._n = min(len(p) for p in parents)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        values = iter([p[index] for p in self._parents])
        return structure.map_structure(lambda _: next(values), self._template)

    def _getitems(self, indices: Any) -> list:
        columns = [read(p, np.asarray(indices, np.int64)) for p in self._parents]
        out = []
        for row in zip(*columns, strict=True):
            values = iter(row)
            out.append(structure.map_structure(lambda _, v=values: next(v), self._template))
        return out

    @property
    def can_gather(self) -> bool:
        return all(gathers(p) for p in self._parents)

    def gather(self, indices: np.ndarray) -> Any:
        values = iter([p.gather(indices) for p in self._parents])
        return structure.map_structure(lambda _: next(values), self._template)

    def __str__(self) -> str:
        return "podkit.ZipMapDataset"
