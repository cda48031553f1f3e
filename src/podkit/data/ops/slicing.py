"""take, skip, shard and enumerate: ops decided by an element's position.

With random access each is an index map into its parent (enumerate pairs the index with the
element); as a stream each counts the input elements it has seen.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data.constants import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from podkit.data.ops.base import Counted, PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context, OnParent, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Take(Counted):
    """The first `count` elements (-1: all)."""

    name = "take"
    keeps_random_access = True

    def cardinality(self) -> int:
        n = self.parent.cardinality()
        if self.count == -1:
            return n
        if n == INFINITE_CARDINALITY:
            return self.count
        return min(n, self.count) if n >= 0 else UNKNOWN_CARDINALITY

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        parent = self.parent.build(ctx, path)
        n = len(parent)
        length = n if self.count == -1 else min(self.count, n)
        return random_access.Remap(parent, length, random_access.Affine(0, 1))

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return TakeStream(self.parent.stream(ctx, path), self.count)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Skip(Counted):
    """All but the first `count` elements (-1: none)."""

    name = "skip"
    keeps_random_access = True

    def cardinality(self) -> int:
        n = self.parent.cardinality()
        if self.count == -1:
            return 0 if n >= 0 else n
        return max(n - self.count, 0) if n >= 0 else n

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        parent = self.parent.build(ctx, path)
        n = len(parent)
        skip = n if self.count == -1 else min(self.count, n)
        length = (n - skip) if n != random_access.INFINITE else random_access.INFINITE
        return random_access.Remap(parent, length, random_access.Affine(skip, 1))

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return SkipStream(self.parent.stream(ctx, path), self.count)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Shard(PassesBatches, Unary):
    """Elements index, index + num, index + 2 num, ..."""

    num: int
    index: int
    name = "shard"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"num": self.num, "index": self.index}

    def cardinality(self) -> int:
        n = self.parent.cardinality()
        if n < 0:
            return n
        return len(range(self.index, n, self.num))

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        parent = self.parent.build(ctx, path)
        n = len(parent)
        endless = n == random_access.INFINITE
        length = random_access.INFINITE if endless else len(range(self.index, n, self.num))
        return random_access.Remap(parent, length, random_access.Affine(self.index, self.num))

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return ShardStream(self.parent.stream(ctx, path), self.num, self.index)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Enumerate(SplitsBelow, Unary):
    """(start + position, element)."""

    start: int
    name = "enumerate"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"start": self.start}

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        return random_access.MapMapDataset(self.parent.build(ctx, path),
                                           random_access.Enumerate(self.start))

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return EnumerateStream(self.parent.stream(ctx, path), self.start)


class TakeStream(OnParent):
    def __init__(self, parent: Stream, count: int) -> None:
        super().__init__(parent)
        self._count = count

    def next(self) -> Any:
        if self._count != -1 and self._seen >= self._count:
            raise StopIteration
        self._seen += 1
        return self._parent.next()


class SkipStream(OnParent):
    def __init__(self, parent: Stream, count: int) -> None:
        super().__init__(parent)
        self._count = count

    def next(self) -> Any:
        while self._count == -1 or self._seen < self._count:
            self._parent.next()
            self._seen += 1
        return self._parent.next()


class ShardStream(OnParent):
    def __init__(self, parent: Stream, num: int, index: int) -> None:
        super().__init__(parent)
        self._num, self._index = num, index

    def next(self) -> Any:
        while True:
            item = self._parent.next()
            self._seen += 1
            if (self._seen - 1) % self._num == self._index:
                return item


class EnumerateStream(OnParent):
    def __init__(self, parent: Stream, start: int) -> None:
        super().__init__(parent)
        self._start = start

    def next(self) -> Any:
        item = self._parent.next()
        self._seen += 1
        return np.int64(self._start + self._seen - 1), item
