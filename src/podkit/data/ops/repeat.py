"""repeat: the parent again and again; each repetition is a new path, so shuffles below
reshuffle."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from podkit.data.constants import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from podkit.data.ops.base import Node, PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Repeat(PassesBatches, SplitsBelow, Unary):
    count: int | None = None  # None: endless
    name = "repeat"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"count": self.count}

    def cardinality(self) -> int:
        n = self.parent.cardinality()
        if self.count == 0 or n == 0:
            return 0
        if self.count is None or n == INFINITE_CARDINALITY:
            return INFINITE_CARDINALITY
        return n * self.count if n >= 0 else UNKNOWN_CARDINALITY

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        return random_access.RepeatMapDataset(self.parent, ctx, path, self.count)

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return RepeatStream(self.parent, ctx, path, self.count)


class RepeatStream(Stream):
    """Repetition e iterates the parent anew with path + (e,): shuffles below reshuffle."""

    def __init__(self, node: Node, ctx: Context, path: tuple[int, ...],
                 count: int | None) -> None:
        self._node, self._ctx, self._path, self._count = node, ctx, path, count
        self._rep, self._stream = 0, None
        self._empty_run = True

    def next(self) -> Any:
        while self._count is None or self._rep < self._count:
            if self._stream is None:
                self._stream = self._node.stream(self._ctx, self._path + (self._rep,))
            try:
                item = self._stream.next()
                self._empty_run = False
                return item
            except StopIteration:
                self._stream.close()
                self._stream = None
                if self._empty_run:  # an empty parent repeated forever is still empty
                    raise
                self._rep += 1
                self._empty_run = True
        raise StopIteration

    def get_state(self) -> dict:
        return {"rep": self._rep,
                "parent": None if self._stream is None else self._stream.get_state()}

    def set_state(self, state: dict) -> None:
        self.close()
        self._rep = int(state["rep"])
        if state["parent"] is not None:
            self._stream = self._node.stream(self._ctx, self._path + (self._rep,))
            self._stream.set_state(state["parent"])
            self._empty_run = False

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


