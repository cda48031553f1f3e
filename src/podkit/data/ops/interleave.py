"""interleave: map each element to a dataset and read several of them in turn."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from podkit.data.constants import UNKNOWN_CARDINALITY
from podkit.data.functions import call, fn_name
from podkit.data.ops.base import Node, Unary
from podkit.data.stream import Context, PrefetchStream, Stream
from podkit.errors import InputError


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Interleave(Unary):
    """fn(element) -> a dataset; `plan_of` turns what fn returned into its plan (None when it
    is not a dataset), so this module needs nothing from the public Dataset."""

    fn: Callable[..., Any]
    cycle: int
    block: int
    parallel: int | None
    deterministic: bool | None
    plan_of: Callable[[Any], Node | None]
    name = "interleave"

    def describe_args(self) -> dict[str, Any]:
        return {"fn": self.fn, "cycle": self.cycle, "block": self.block,
                "parallel": self.parallel, "deterministic": self.deterministic}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def open(self, element: Any) -> Node:
        """The plan of the dataset fn makes of `element`."""
        made = call(self.fn, element)
        plan = self.plan_of(made)
        if plan is None:
            raise InputError(f"the interleave function {fn_name(self.fn)} returned a "
                             f"{type(made).__name__}; it must return a pk.data.Dataset.")
        return plan

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return InterleaveStream(self.parent.stream(ctx, path), self, ctx, path,
                                parallel=self.parallel is not None,
                                ordered=self.deterministic is not False)


class InterleaveStream(Stream):
    """tf.data's interleave order: cycle over `cycle` open datasets, `block` elements each;
    an exhausted one is replaced in its slot by the next input element's dataset.

    parallel: each open dataset is read ahead by its own thread (PrefetchStream, whose state
    is exact). Not ordered: when the slot whose turn it is has nothing ready, the next slot
    that has takes the turn."""

    READ_AHEAD = 4  # elements each open dataset's thread keeps ready

    def __init__(self, parent: Stream, op: Interleave, ctx: Context, path: tuple[int, ...],
                 parallel: bool = False, ordered: bool = True) -> None:
        self._parent, self._op, self._cycle, self._block = parent, op, op.cycle, op.block
        self._parallel, self._ordered = parallel, ordered
        self._ctx = dataclasses.replace(ctx, nested=True)
        self._path = path
        self._slots: list[Stream | None] = [None] * op.cycle
        self._slot_marks: list[dict | None] = [None] * op.cycle  # parent state before the input
        self._slot_index: list[int] = [0] * op.cycle
        self._pos = self._in_block = 0
        self._inputs = 0
        self._end_of_input = False

    def _open(self, slot: int, mark: dict, index: int) -> Stream | None:
        try:
            element = self._parent.next()
        except StopIteration:
            self._end_of_input = True
            return None
        plan = self._op.open(element)
        self._slot_marks[slot], self._slot_index[slot] = mark, index
        stream = plan.stream(self._ctx, self._path + (index,))
        return PrefetchStream(stream, self.READ_AHEAD) if self._parallel else stream

    def _advance(self) -> None:
        self._in_block = 0
        self._pos = (self._pos + 1) % self._cycle

    def _take_ready_turn(self) -> None:
        """Unordered: if the current slot has nothing ready, give the turn to one that has."""
        current = self._slots[self._pos]
        if current is None or current.ready():
            return
        for k in range(1, self._cycle):
            j = (self._pos + k) % self._cycle
            other = self._slots[j]
            if other is not None and other.ready():
                self._pos, self._in_block = j, 0
                return

    def next(self) -> Any:
        while not self._end_of_input or any(s is not None for s in self._slots):
            if self._parallel and not self._ordered:
                self._take_ready_turn()
            slot = self._slots[self._pos]
            if slot is not None:
                try:
                    item = slot.next()
                except StopIteration:
                    slot.close()
                    self._slots[self._pos] = None
                    self._advance()
                    continue
                self._in_block += 1
                if self._in_block == self._block:
                    self._advance()
                return item
            if not self._end_of_input:
                mark = self._parent.get_state()
                opened = self._open(self._pos, mark, self._inputs)
                if opened is not None:
                    self._inputs += 1
                    self._slots[self._pos] = opened
                    if self._parallel:
                        opened.start()
            else:
                self._advance()
        raise StopIteration

    def get_state(self) -> dict:
        return {
            "parent": self._parent.get_state(), "pos": self._pos, "in_block": self._in_block,
            "inputs": self._inputs, "end": self._end_of_input,
            "slots": [None if s is None else {"mark": self._slot_marks[i],
                                              "index": self._slot_index[i],
                                              "state": s.get_state()}
                      for i, s in enumerate(self._slots)],
        }

    def set_state(self, state: dict) -> None:
        self.close()
        for i, slot in enumerate(state["slots"]):
            if slot is None:
                continue
            self._parent.set_state(slot["mark"])  # re-read the input that opened this slot
            stream = self._open(i, slot["mark"], slot["index"])
            assert stream is not None
            stream.set_state(slot["state"])
            self._slots[i] = stream
            if self._parallel:
                stream.start()
        self._parent.set_state(state["parent"])
        self._pos, self._in_block = int(state["pos"]), int(state["in_block"])
        self._inputs, self._end_of_input = int(state["inputs"]), bool(state["end"])

    def close(self) -> None:
        for i, s in enumerate(self._slots):
            if s is not None:
                s.close()
            self._slots[i] = None


