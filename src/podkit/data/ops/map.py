"""map and filter: a user function on every element."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from podkit.data.constants import UNKNOWN_CARDINALITY
from podkit.data.functions import UserFn
from podkit.data.ops.base import SplitsBelow, Unary
from podkit.data.stream import Context, OnParent, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Map(SplitsBelow, Unary):
    """fn(element); in worker processes when `parallel` is set (see Dataset.map)."""

    fn: Callable[..., Any]
    parallel: int | None = None
    deterministic: bool | None = None
    name = "map"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"fn": self.fn, "parallel": self.parallel, "deterministic": self.deterministic}

    def parallel_calls(self) -> int | None:
        return self.parallel

    def reorders(self) -> bool:
        return self.deterministic is False

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        return random_access.MapMapDataset(self.parent.build(ctx, path),
                                           UserFn(self.fn, "map"))

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return MapStream(self.parent.stream(ctx, path), UserFn(self.fn, "map"))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Filter(Unary):
    """The elements for which fn(element) is true; a stream (its length is unknown)."""

    fn: Callable[..., Any]
    name = "filter"

    def describe_args(self) -> dict[str, Any]:
        return {"fn": self.fn}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return FilterStream(self.parent.stream(ctx, path), UserFn(self.fn, "filter"))


class MapStream(OnParent):
    def __init__(self, parent: Stream, fn: UserFn) -> None:
        super().__init__(parent)
        self._fn = fn

    def next(self) -> Any:
        item = self._parent.next()
        self._seen += 1
        return self._fn(self._seen - 1, item)


class FilterStream(OnParent):
    def __init__(self, parent: Stream, fn: UserFn) -> None:
        super().__init__(parent)
        self._fn = fn

    def next(self) -> Any:
        while True:
            item = self._parent.next()
            self._seen += 1
            if self._fn(self._seen - 1, item):
                return item
