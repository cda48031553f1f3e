"""The iterator a Dataset hands out: resumable state, statistics, and worker clean-up."""

from __future__ import annotations

import atexit
import dataclasses
import time
import weakref
from typing import TYPE_CHECKING, Any

from podkit.data import stream
from podkit.errors import InputError

if TYPE_CHECKING:
    from podkit.data.ops import Node

STATE_FORMAT = "podkit.data/1"
_LIVE: weakref.WeakSet = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class IteratorStats:
    """elements produced; seconds since the first request; seconds the consumer spent waiting
    inside next(); input worker processes running now, and the seconds they have spent
    computing what was taken; the ratios."""

    elements: int
    elapsed_s: float
    wait_s: float
    workers: int = 0
    worker_s: float = 0.0

    @property
    def elements_per_s(self) -> float:
        return self.elements / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        return self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def worker_busy(self) -> float:
        """Share of the workers' time spent computing: near 1 with a high wait_fraction
        means more workers (cores) would help; low means the workers wait on the consumer."""
        if not self.workers or self.elapsed_s <= 0:
            return 0.0
        return min(self.worker_s / (self.workers * self.elapsed_s), 1.0)


class DatasetIterator:
    """Iterates a Dataset's plan. `get_state()` is a small JSON-able dict; `set_state(state)`
    resumes exactly there, also in a new process, as long as the pipeline is the same."""

    def __init__(self, plan: Node, iteration: int, workers: bool = True) -> None:
        self._plan = plan
        self._fingerprint = plan.fingerprint()
        if workers and plan.asks_for_workers(whole_plan=True, explicitly=True):
            from podkit.data import pool  # loads with the first iterator that asks for workers

            pool.Server.get()  # its start (~1.5 s of imports) overlaps Grain's, here
        self._ctx = stream.Context(workers=workers)
        self._iteration = iteration
        self._stream: stream.Stream | None = plan.stream(self._ctx, (iteration,))
        self._position = 0
        self._t0: float | None = None
        self._wait = 0.0
        _LIVE.add(self)

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        if self._stream is None:
            raise StopIteration
        start = time.perf_counter()
        if self._t0 is None:
            self._t0 = start
        try:
            item = self._stream.next()
        except BaseException:  # end of data or a failure: stop the workers either way
            self.close()
            raise
        finally:
            self._wait += time.perf_counter() - start
        self._position += 1
        return item

    next = __next__

    def stats(self) -> IteratorStats:
        elapsed = 0.0 if self._t0 is None else time.perf_counter() - self._t0
        return IteratorStats(self._position, elapsed, self._wait, *self._ctx.worker_stats())

    def get_state(self) -> dict:
        if self._stream is None:
            raise InputError("this iterator is closed or exhausted; take the state before the "
                             "end, or start a new iterator.")
        return {
            "format": STATE_FORMAT,
            "fingerprint": self._fingerprint,
            "iteration": self._iteration,
            "position": self._position,
            "seeds": self._plan.shuffle_seeds(),
            "stream": self._stream.get_state(),
        }

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InputError(f"set_state got {type(state).__name__} {str(state)[:80]!r}, not a "
                             "state from DatasetIterator.get_state().")
        if state["fingerprint"] != self._fingerprint:
            raise InputError(
                f"this state was saved from a different pipeline (fingerprint "
                f"{state['fingerprint']}, this one is {self._fingerprint}); restore it into an "
                "iterator of the same Dataset definition (same ops, arguments and sources).")
        self.close()
        # The saved run's seeds (drawn ones included) make a plan of their own; the Dataset
        # this iterator came from is left as it is.
        self._plan = self._plan.with_shuffle_seeds(state["seeds"])
        self._iteration = int(state["iteration"])
        self._stream = self._plan.stream(self._ctx, (self._iteration,))
        self._stream.set_state(state["stream"])
        self._position = int(state["position"])
        _LIVE.add(self)

    def close(self) -> None:
        """Stop worker processes and threads now (also done at the end, on errors, and when
        the iterator is garbage-collected)."""
        s, self._stream = self._stream, None
        if s is not None:
            s.close()

    def __enter__(self) -> DatasetIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


@atexit.register
def _close_all() -> None:
    for it in list(_LIVE):
        it.close()
