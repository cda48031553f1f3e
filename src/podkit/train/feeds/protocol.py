"""What a feed is to its users: the `Feed` protocol the loop and the model program against,
and the `Execution` it yields for each device call.

The loop reads `epoch`, `close` and `source_s`; the checkpoint side calls `resume`; the model
calls `first`, `check`, reads `steps_per_epoch`, `global_batch` and `batch_nbytes`, and sets
`k` (the steps per execution) before the first epoch. Nothing else of a feed is part of the
protocol (runtime_checkable, so tests can ask `isinstance(feed, Feed)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from podkit.train.feeds.inputs import StepInputs
from podkit.train.feeds.position import DataPosition

# The model's check of the data it is given: check(x, y) raises InputError on what it cannot
# take (y is None for predict).
Check = Callable[[Any, Any], None]


@dataclasses.dataclass(slots=True)
class Execution:
    """One device call's worth of input: `steps` batches (k, or fewer at an epoch's end)."""

    inputs: StepInputs  # for the compiled step (inputs.py)
    steps: int
    samples: int  # real (unpadded) examples across all processes
    position: DataPosition  # this process's input position after this execution's batches


@runtime_checkable
class Feed(Protocol):
    """fit()/evaluate()/predict()'s input, cut into executions for the compiled steps."""

    # Steps of one epoch (None: until the input ends).
    steps_per_epoch: int | None
    # Seconds spent producing host inputs so far; the loop's input_wait is measured against it.
    source_s: float
    # Steps per execution: the model sets it before the first epoch (steps_per_execution).
    k: int

    @property
    def global_batch(self) -> int:
        """Examples per step over all processes."""
        ...

    @property
    def batch_nbytes(self) -> int:
        """Bytes one step's batch puts on the devices (all of them together): 0 when the data
        is staged on the devices and a step ships only row ids."""
        ...

    def first(self) -> tuple[Any, Any]:
        """A few rows (x, y) to build the model from (y None without labels)."""
        ...

    def check(self, check: Check) -> None:
        """Have `check` look at the data (at once, or batch by batch as it is read)."""
        ...

    def resume(self, at: DataPosition) -> None:
        """Begin the next `epoch()` where a checkpoint left the input."""
        ...

    def epoch(self, epoch: int, more: bool = False) -> Iterator[Execution]:
        """The executions of one epoch, in order. `more`: epoch + 1 follows in this fit, so
        the feed may prepare its first executions while this one ends (a fed input's
        read-ahead carries on across the boundary instead of draining at it)."""
        ...

    def close(self) -> None:
        """Stop the input now (threads, worker processes); the feed may be resumed after."""
        ...
