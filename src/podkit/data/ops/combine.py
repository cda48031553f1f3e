"""zip and concatenate: several datasets side by side, or one after another."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from podkit.data import structure
from podkit.data.constants import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from podkit.data.ops.base import Nary
from podkit.data.stream import Context, Parts, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Zip(Nary):
    """Elements of `inputs` side by side, in the structure of `template` (a structure with a
    None where each dataset goes)."""

    template: Any
    name = "zip"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"structure": self.template}

    def cardinality(self) -> int:
        parents = [p.cardinality() for p in self.inputs]
        if any(p == UNKNOWN_CARDINALITY for p in parents):
            return UNKNOWN_CARDINALITY
        finite = [p for p in parents if p >= 0]
        return min(finite) if finite else INFINITE_CARDINALITY

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        return random_access.ZipMapDataset([p.build(ctx, path) for p in self.inputs],
                                           self.template)

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return ZipStream([p.stream(ctx, path) for p in self.inputs], self.template)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Concatenate(Nary):
    """Elements of `inputs`, one dataset after the other."""

    name = "concatenate"
    keeps_random_access = True

    def cardinality(self) -> int:
        parents = [p.cardinality() for p in self.inputs]
        if INFINITE_CARDINALITY in parents:
            return INFINITE_CARDINALITY
        if UNKNOWN_CARDINALITY in parents:
            return UNKNOWN_CARDINALITY
        return sum(parents)

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        return random_access.concatenate([p.build(ctx, path) for p in self.inputs])

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return ConcatStream([p.stream(ctx, path) for p in self.inputs])


class ZipStream(Parts):
    def __init__(self, parts: list[Stream], template: Any) -> None:
        super().__init__(parts)
        self._template = template

    def next(self) -> Any:
        values = iter([p.next() for p in self._parts])
        return structure.map_structure(lambda _: next(values), self._template)


class ConcatStream(Parts):
    def __init__(self, parts: list[Stream]) -> None:
        super().__init__(parts)
        self._which = 0

    def next(self) -> Any:
        while self._which < len(self._parts):
            try:
                return self._parts[self._which].next()
            except StopIteration:
                self._which += 1
        raise StopIteration

    def get_state(self) -> dict:
        return {"which": self._which, **super().get_state()}

    def set_state(self, state: dict) -> None:
        self._which = int(state["which"])
        super().set_state(state)


