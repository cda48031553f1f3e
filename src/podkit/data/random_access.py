"""Build the random-access part of a plan as a Grain MapDataset.

Element i of every node is a pure function of i (and of the iteration's path, for shuffles that
reshuffle), so worker processes can compute any slice and an iterator resumes from one index.
"""

from __future__ import annotations

import pickle
import sys
from typing import TYPE_CHECKING, Any

import grain
import numpy as np
from grain.experimental import WindowShuffleMapDataset

from podkit.data import sources, structure
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
    if op in ("slices", "range", "sequence", "text", "array_record"):
        return grain.MapDataset.source(a["source"])
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
    if op == "map":
        return parent.map_with_index(UserFn(a["fn"], "map"))
    if op in ("batch", "padded_batch"):
        return parent.batch(a["size"], drop_remainder=a["drop"], batch_fn=a["fn"])
    if op == "shuffle":
        seed = derive_seed(ctx.seed(node), path if a["reshuffle"] else ())
        n = len(parent)
        if n == 0:
            return parent
        if n != INFINITE and a["buffer"] >= n:
            return parent.shuffle(seed)
        return WindowShuffleMapDataset(parent, window_size=min(a["buffer"], n), seed=seed)
    if op == "take":
        return parent if a["count"] == -1 else parent[: a["count"]]
    if op == "skip":
        return parent[len(parent):] if a["count"] == -1 else parent[a["count"]:]
    if op == "shard":
        return parent[a["index"]:: a["num"]]
    if op == "enumerate":
        return parent.map_with_index(Enumerate(a["start"]))
    if op == "prefetch":
        return parent
    raise AssertionError(op)


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

    def __str__(self) -> str:
        return "podkit.ZipMapDataset"


# -- cache -------------------------------------------------------------------------------------
class Unpickle:
    def __call__(self, record: bytes) -> Any:
        return pickle.loads(record)


def cached(node: Dataset, ctx: Context) -> grain.MapDataset:
    """The cache's contents: materialized by the first iteration (in parallel where the parent
    allows), then read by index. A file cache is written under a temporary name and renamed."""
    import os

    from podkit.data.stream import drain

    filename = node._args["filename"]
    path = filename + ".podkit_cache.array_record" if filename else ""
    if "cache" not in node._memo:
        if path and os.path.exists(path):
            node._memo["cache"] = sources.array_record_source([path])
        else:
            elements = drain(node._parents[0], ctx, "cache()")
            if path:
                from array_record.python.array_record_module import ArrayRecordWriter

                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                writer = ArrayRecordWriter(path + ".tmp", "group_size:1")
                for e in elements:
                    writer.write(pickle.dumps(e, protocol=5))
                writer.close()
                os.replace(path + ".tmp", path)
                node._memo["cache"] = sources.array_record_source([path])
            else:
                node._memo["cache"] = sources.Elements(elements)
    ds = grain.MapDataset.source(node._memo["cache"])
    return ds.map(Unpickle()) if path else ds
