"""ignore_errors: the elements whose production raised are dropped, as tf.data's
`Dataset.ignore_errors()` (a corrupt TFRecord record, a map function that failed).

Over a random-access part, the failure is caught where the element is computed (in this
process, on a reader thread or in a worker process) and comes back as a `Dropped` marker, so
one bad element never breaks the reader; the stream on top skips the markers. Over a stream,
the parent stream's error is caught and the next element asked for. The count of dropped
elements is part of the position, so resuming is exact.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from podkit.data.constants import UNKNOWN_CARDINALITY
from podkit.data.ops.base import PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context, OnParent, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain

log = logging.getLogger("podkit.data")
_MAX_SKIPS = 1_000_000  # a stream that only fails ends instead of spinning forever


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class IgnoreErrors(PassesBatches, SplitsBelow, Unary):
    """The parent's elements, those whose production raised left out; a stream. It hands
    batches on unchanged and fit() splits below it (each process drops its own failures)."""

    log_warning: bool = False
    name = "ignore_errors"

    def describe_args(self) -> dict[str, Any]:
        return {"log_warning": self.log_warning}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        if self.parent.random_access:
            return SkipDropped(Guard(self.parent).stream(ctx, path), self.log_warning)
        return SkipFailures(self.parent.stream(ctx, path), self.log_warning)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Guard(Unary):
    """The parent's random-access elements, each failure turned into a Dropped marker."""

    name = "guard"
    keeps_random_access = True

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data.guard import GuardedMapDataset  # Grain loads with the first build

        return GuardedMapDataset(self.parent.build(ctx, path))


class SkipDropped(OnParent):
    def __init__(self, parent: Stream, log_warning: bool) -> None:
        from podkit.data.guard import Dropped  # loaded by Guard.build already

        super().__init__(parent)
        self._log, self._dropped = log_warning, Dropped

    def next(self) -> Any:
        while True:
            item = self._parent.next()
            self._seen += 1
            if not isinstance(item, self._dropped):
                return item
            if self._log:
                log.warning("ignore_errors: dropped an element: %s", item.message)


class SkipFailures(OnParent):
    def __init__(self, parent: Stream, log_warning: bool) -> None:
        super().__init__(parent)
        self._log = log_warning

    def next(self) -> Any:
        for _ in range(_MAX_SKIPS):
            try:
                item = self._parent.next()
            except StopIteration:
                raise
            except Exception as e:
                if self._log:
                    log.warning("ignore_errors: dropped an element: %s: %s",
                                type(e).__name__, e)
                continue
            self._seen += 1
            return item
        raise StopIteration
