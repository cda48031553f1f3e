"""Build the random-access part of a plan as a Grain MapDataset.

Element i of every node is a pure function of i (and of the iteration's path, for shuffles that
reshuffle), so worker processes can compute any slice and an iterator resumes from one index.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data import batching, sources, structure
from podkit.data._grain import grain
from podkit.data.functions import UserFn

if TYPE_CHECKING:
    from podkit.data.dataset import Dataset
    from podkit.data.stream import Context

INFINITE = sys.maxsize  # Grain's length of an endless MapDataset


def derive_seed(seed: int, path: tuple[int, ...]) -> int:
    return int(np.random.SeedSequence([seed, *path]).generate_state(1)[0] >> 1)


def varies(node: Dataset) -> bool:
    """Whether the node's elements depend on the iteration path (a reshuffling shuffle)."""
    if "varies" not in node._memo:
        node._memo["varies"] = (node._op == "shuffle" and node._args["reshuffle"]) or (
            node._op != "cache" and any(varies(p) for p in node._parents))
    return node._memo["varies"]


def build(node: Dataset, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
    op, a = node._op, node._args
    if op in ("slices", "range"):
        return ArraySource(a["source"])
    if op in ("sequence", "text", "array_record"):
        return Source(a["source"])
    if op == "cache":
        return cached(node, ctx)
    if op == "repeat":
        return RepeatMapDataset(node._parents[0], ctx, path, a["count"])
    if op == "zip":
        parents = [build(p, ctx, path) for p in node._parents]
        return ZipMapDataset(parents, a["structure"])
    if op == "concatenate":
        return grain.MapDataset.concatenate([build(p, ctx, path) for p in node._parents])
    parent = build(node._parents[0], ctx, path)
    n = len(parent)
    if op == "map":
        return MapMapDataset(parent, UserFn(a["fn"], "map"))
    if op in ("batch", "padded_batch"):
        return BatchMapDataset(parent, a["size"], a["drop"], a["fn"])
    if op == "shuffle":
        seed = derive_seed(ctx.seed(node), path if a["reshuffle"] else ())
        if n == 0:
            return parent
        return Remap(parent, n, Permutation(seed, n, a["buffer"]))
    if op in ("take", "skip", "shard"):
        start, step, length = _affine(op, a, n)
        return Remap(parent, length, Affine(start, step))
    if op == "enumerate":
        return MapMapDataset(parent, Enumerate(a["start"]))
    if op == "prefetch":
        return parent
    raise AssertionError(op)


def _affine(op: str, a: dict, n: int) -> tuple[int, int, int]:
    """(start, step, length) of take/skip/shard as an index map into a parent of length n."""
    if op == "take":
        return 0, 1, n if a["count"] == -1 else min(a["count"], n)
    if op == "skip":
        skip = n if a["count"] == -1 else min(a["count"], n)
        return skip, 1, (n - skip) if n != INFINITE else INFINITE
    count = len(range(a["index"], n, a["num"])) if n != INFINITE else INFINITE
    return a["index"], a["num"], count


# -- index-remapping datasets with batched reads ------------------------------------------------
# Grain's per-element path costs tens of microseconds (stats, tracing, one index_shuffle call
# per element). These nodes map whole index arrays with numpy, and a batch over in-memory
# arrays is one fancy-indexing gather: no Python per element at all.
def gathers(ds: grain.MapDataset) -> bool:
    return bool(getattr(ds, "can_gather", False))


def read(ds: grain.MapDataset, indices: np.ndarray) -> list:
    return ds._getitems([int(i) for i in indices])  # noqa: SLF001 - Grain's batched read


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

    def __str__(self) -> str:
        return "podkit.BatchMapDataset"


class Enumerate:
    def __init__(self, start: int) -> None:
        self.start = start

    def __call__(self, index: int, element: Any) -> tuple[np.int64, Any]:
        return np.int64(self.start + index), element


class RepeatMapDataset(grain.MapDataset):
    """Repetition e of the parent is built for path + (e,), so shuffles below reshuffle."""

    def __init__(self, parent: Dataset, ctx: Context, path: tuple[int, ...],
                 count: int | None) -> None:
        self._node, self._ctx, self._path = parent, ctx, path
        first = build(parent, ctx, path + (0,))
        super().__init__(first)
        self._n = len(first)
        self._count = count
        self._varies = varies(parent)
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
            ds = self._built[e] = build(self._node, self._ctx, self._path + (e,))
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
        batches = self._repetition(e)
        return batches._parent.rows(np.arange(batches._parent_n, dtype=np.int64))

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


# -- cache -------------------------------------------------------------------------------------
class Unpickle:
    def __call__(self, record: bytes) -> Any:
        return pickle.loads(record)


def cached(node: Dataset, ctx: Context) -> grain.MapDataset:
    """The cache's contents: materialized by the first iteration (in parallel where the parent
    allows), then read by index. A file cache is written under a temporary name and renamed."""
    from podkit.data.stream import drain

    filename = node._args["filename"]
    path = filename + ".podkit_cache.array_record" if filename else ""
    if "cache" not in node._memo:
        if path and os.path.exists(path):
            node._memo["cache"] = sources.ArrayRecords([path])
        else:
            elements = drain(node._parents[0], ctx, "cache()")
            if path:
                from array_record.python.array_record_module import ArrayRecordWriter

                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                writer = ArrayRecordWriter(path + ".tmp", "group_size:1")
                try:
                    for e in elements:
                        writer.write(pickle.dumps(e, protocol=5))
                    writer.close()
                    os.replace(path + ".tmp", path)
                except BaseException:
                    writer.close()
                    if os.path.exists(path + ".tmp"):
                        os.remove(path + ".tmp")
                    raise
                node._memo["cache"] = sources.ArrayRecords([path])
            else:
                node._memo["cache"] = sources.Elements(elements)
    ds = Source(node._memo["cache"])
    return ds.map(Unpickle()) if path else ds


def staged_rows(node: Dataset) -> tuple[Any, int, Any] | None:
    """For a plan that only reorders and batches in-memory arrays — from_tensor_slices, then
    shuffle/take/skip/shard/repeat, then batch, then prefetch — return (tensors, batch size,
    f) where f(e) gives the source rows of all elements of epoch e in order (the epochs of
    ds.repeat(), each reshuffled). fit() then keeps the arrays on the devices and ships row
    ids, as it does for arrays. None for any other plan."""
    from podkit.data.stream import Context

    top = node
    while top._op == "prefetch":
        top = top._parents[0]
    if top._op != "batch" or not isinstance(top._args["fn"], batching.Stack):
        return None
    below = top._parents[0]
    while below._op in ("shuffle", "take", "skip", "shard", "repeat"):
        below = below._parents[0]
    if below._op != "slices":
        return None
    from podkit.data.dataset import Dataset

    # Epoch after epoch, as fit() iterates ds.repeat(): each repetition reshuffles.
    endless = Dataset("repeat", [node], count=None)
    ds = build(endless, Context(workers=False), (node._next_iteration(),))
    return below._args["source"].tensors, top._args["size"], ds.epoch_rows
