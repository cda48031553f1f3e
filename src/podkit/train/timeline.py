"""Where a loop's wall time goes: when the devices were busy, and what the host was doing when
they were not.

    timeline = Timeline()
    with timeline.host("validation"):
        ...                                                   # or timeline.add(label, t0, t1)
    ex = timeline.dispatched(sums, steps, samples)            # after the asynchronous call
    timeline.finished(ex)             # when the devices finished it (a thread watched)
    timeline.window(t1)               # {"productive": s, "compile": s, "input": s, ...}

The devices' side is measured, not inferred from the host's calls: a thread ("podkit-timeline")
waits on dispatched executions in order (see WATCH_S) and notes when each finished, so
throughput and step
time are computed over completed device work (a dispatch returns at once; the host sees an
execution finish only when it next waits, which may be long after). An execution runs from
the later of its dispatch and its predecessor's finish until its own finish; between an
execution's finish and the next one's dispatch the devices are idle.

The host's side is a list of labelled intervals: "compile" (from jax.monitoring's events on the
loop's thread, podkit.train.compiles, and waiting for a state being initialized), "restore"
(reading the checkpoint the fit resumes from), "input" (blocked on the feed), "checkpoint" (a
save blocking the loop), "validation". Device-idle time is attributed to the label whose
interval covers it (compile first, then restore, checkpoint, input, validation), and the rest
of it is "other" (callbacks, hooks, Python).
That split is goodput's (podkit.monitor's run report): productive time is device-busy time.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import jax

from podkit.train import compiles

LABELS = ("compile", "restore", "checkpoint", "input", "validation")
"""Host activities, in the order they claim device-idle time."""

WATCH_S = 0.01
"""The thread waits on an execution dispatched at least this long after the last one it
waited on. Executions of a fraction of a millisecond (a tiny model on CPU) would otherwise
wake it a few thousand times a second, and its every wake-up takes Python's lock from the
loop and CPU from the devices' own threads on a small machine (2 ms: 9-14 us of CPU per
0.7 ms step of the seed MLP on 2 cores; 10 ms: ~11; a finish known to 10 ms is 1% of a
one-second log window). An execution not waited on finished no later than the next
one that is (they run in order), which is a close bound only when the next one follows soon:
the newest execution not waited on is therefore waited on too once nothing newer was
dispatched within WATCH_S (the loop went on to wait for input, say), so its finish is known
to within about WATCH_S."""


@dataclasses.dataclass(slots=True)
class Execution:
    """One dispatched execution as the timeline knows it."""

    index: int
    dispatched: float  # perf_counter() when the asynchronous call returned
    steps: int
    samples: int
    finished: float | None = None  # when the devices finished it
    done: threading.Event | None = None  # set by the watching thread (watched ones only)

    @property
    def watched(self) -> bool:
        return self.done is not None


class Timeline:
    """Device-busy intervals and labelled host intervals of one loop run (see the module
    docstring). Cheap per execution: a queue put on the host, a blocking wait on a thread."""

    def __init__(self) -> None:
        self.start = self.cursor = time.perf_counter()
        self.started_at = time.time()  # the same moment as Unix time (the run's records)
        self.executions: list[Execution] = []  # those not yet accounted for by window()
        self.intervals: dict[str, list[tuple[float, float]]] = {label: [] for label in LABELS}
        self.totals = dict.fromkeys(("productive", *LABELS, "other"), 0.0)
        self.dispatched_count = 0
        self.first_dispatch: float | None = None  # when the first execution was dispatched
        self._last_finish = float("-inf")  # the finish of the last execution accounted for
        self._last: Execution | None = None  # the newest the thread watches
        self._thread_id = threading.get_ident()  # the loop's: its compiles are the loop's
        self._compile_mark = compiles.mark()

    # -- the host's side -----------------------------------------------------------------------
    @contextlib.contextmanager
    def host(self, label: str) -> Iterator[None]:
        """Note the time the block takes as `label` (one of LABELS)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.intervals[label].append((t0, time.perf_counter()))

    def add(self, label: str, start: float, end: float) -> None:
        self.intervals[label].append((start, end))

    # -- the devices' side ---------------------------------------------------------------------
    def dispatched(self, arrays: Any, steps: int, samples: int) -> Execution:
        """An execution was dispatched; `arrays` are outputs it computes (waited on by the
        timeline's thread, so they must not be donated by the next execution)."""
        ex = Execution(self.dispatched_count, time.perf_counter(), steps, samples)
        if self.first_dispatch is None:
            self.first_dispatch = ex.dispatched
        self.dispatched_count += 1
        self.executions.append(ex)
        if self._last is None or ex.dispatched - self._last.dispatched >= WATCH_S:
            ex.done = threading.Event()
            self._last = ex
            _watcher().put((ex, arrays))
        else:
            _set_newest(ex, arrays)
        return ex

    def finished(self, ex: Execution) -> float:
        """When the devices finished `ex` (waits for the timeline's thread to see it). For an
        execution not watched, which the caller has waited for: the first finish known after
        it, or now."""
        if ex.watched:
            ex.done.wait()
            return ex.finished
        with _lock:
            if ex.done is None and ex.finished is None:
                later = [e.finished for e in self.executions
                         if e.index > ex.index and e.finished is not None]
                ex.finished = min([time.perf_counter(), *later])
        if ex.watched:  # the thread took it up meanwhile
            ex.done.wait()
        return ex.finished

    def close(self) -> None:
        """Return once the watching thread has seen every execution dispatched so far."""
        if self._last is not None:
            self._last.done.wait()

    # -- the split -----------------------------------------------------------------------------
    def window(self, t1: float | None = None) -> dict[str, float]:
        """Seconds from the previous window's end (the loop's start, at first) to `t1` (now
        by default; a log point passes the finish time of the execution it reports, so that
        everything dispatched before it has finished): "productive" (devices busy), then the
        devices' idle time by what the host was doing: compile, checkpoint, input,
        validation, other. Added to `totals`; what lies before t1 is then forgotten."""
        t0, t1 = self.cursor, time.perf_counter() if t1 is None else t1
        later = None  # executions finish in order: an unwatched one by the next known finish
        for ex in reversed(self.executions):
            if ex.finished is not None:
                later = ex.finished
            elif later is not None and later <= t1:
                ex.finished = later
        busy, previous, keep = [], self._last_finish, []
        for ex in self.executions:
            if ex.finished is None or ex.finished > t1:
                keep.append(ex)
                continue
            busy.append((max(ex.dispatched, previous), ex.finished))
            previous = ex.finished
        # An execution still running at t1 was busy from its start to t1.
        if keep and keep[0].dispatched < t1:
            busy.append((max(keep[0].dispatched, previous), t1))
        busy = _clip(busy, t0, t1)
        idle = _complement(busy, t0, t1)
        compiled = compiles.intervals_since(self._compile_mark, self._thread_id)
        out = {"productive": _length(busy)}
        for label in LABELS:
            extra = compiled if label == "compile" else []
            claimed = _intersect(idle, _merge(_clip(self.intervals[label] + extra, t0, t1)))
            out[label] = _length(claimed)
            idle = _subtract(idle, claimed)
        out["other"] = _length(idle)
        for key, value in out.items():
            self.totals[key] += value
        self.executions, self._last_finish, self.cursor = keep, previous, t1
        for label in LABELS:
            self.intervals[label] = [(a, b) for a, b in self.intervals[label] if b > t1]
        return out


# -- the watching thread: one per process, started on first use (a thread per fit() would cost
# its start on every call, which a short fit notices) ------------------------------------------
_queue: queue.SimpleQueue = queue.SimpleQueue()
_pid: int | None = None  # the process that started the thread (a forked child has none)
_lock = threading.Lock()
_NUDGE = object()  # put when the thread sleeps on the queue and a newest execution appears
_newest: tuple[Execution, Any] | None = None  # the newest execution not waited on
_sleeping = False  # the thread waits on the queue without a timeout


_STOP = object()  # put at interpreter exit: the thread returns
_thread: threading.Thread | None = None


def _watcher() -> queue.SimpleQueue:
    global _pid, _queue, _newest, _thread
    if _pid is None:  # cleared in a forked child (below): no getpid() per dispatch
        with _lock:
            if _pid is None:
                _queue, _newest = queue.SimpleQueue(), None
                _thread = threading.Thread(target=_watch, args=(_queue,),
                                           name="podkit-timeline", daemon=True)
                _thread.start()
                _pid = os.getpid()
    return _queue


def _forget_parent_thread() -> None:
    global _pid
    _pid = None


os.register_at_fork(after_in_child=_forget_parent_thread)


@atexit.register
def _stop_watcher() -> None:
    """End the thread before the interpreter finalizes: a daemon thread still inside XLA's
    C++ (a wait on an execution) when Python tears threads down aborts the process
    ("FATAL: exception not rethrown")."""
    global _newest
    thread = _thread
    if thread is None or _pid != os.getpid() or not thread.is_alive():
        return
    with _lock:
        _newest = None
    _queue.put(_STOP)
    thread.join(timeout=5.0)


def _set_newest(ex: Execution, arrays: Any) -> None:
    global _newest, _sleeping
    q = _watcher()
    with _lock:
        _newest = (ex, arrays)
        nudge, _sleeping = _sleeping, False
    if nudge:
        q.put(_NUDGE)


def _take_newest(before: float | None = None) -> tuple[Execution, Any] | None:
    """The newest execution not waited on (dispatched before `before`), now watched; or
    None."""
    global _newest
    with _lock:
        item = _newest
        if item is None or (before is not None and item[0].dispatched >= before):
            return None
        _newest = None
        ex = item[0]
        if ex.finished is not None:  # the loop already settled it
            return None
        ex.done = threading.Event()
        return item


def _poll_ready(arrays: Any) -> None:
    """Return once `arrays` are computed, asking without blocking (every WATCH_S): an
    execution taken up after the loop moved on is only looked at, never waited on in XLA
    while the loop itself may be waiting on, or handing on, the same buffers."""
    leaves = [a for a in jax.tree.leaves(arrays) if hasattr(a, "is_ready")]
    while not all(a.is_ready() for a in leaves):
        time.sleep(WATCH_S)


def _watch(q: queue.SimpleQueue) -> None:
    global _sleeping
    while True:
        with _lock:
            pending = _newest is not None
            _sleeping = not pending
        adopted = False
        try:
            item = q.get(timeout=WATCH_S if pending else None)
        except queue.Empty:  # nothing newer within WATCH_S: watch the newest itself
            item, adopted = _take_newest(), True
        if item is _STOP:
            return
        if item is None or item is _NUDGE:
            continue
        # An older execution not waited on is bounded closely by this one only when this one
        # followed it soon; otherwise watch it first.
        older = _take_newest(before=item[0].dispatched - WATCH_S)
        for (ex, arrays), polled in ([(older, True)] if older else []) + [(item, adopted)]:
            try:
                if polled:
                    _poll_ready(arrays)
                else:
                    jax.block_until_ready(arrays)
            except Exception:  # the loop sees the failure itself, when it waits
                pass
            now = time.perf_counter()
            with _lock:
                ex.finished = now if ex.finished is None else min(ex.finished, now)
            ex.done.set()
        del item, older, arrays


# -- interval arithmetic on sorted, disjoint lists of (start, end) --------------------------------
def _merge(xs: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(xs):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def _clip(xs: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    return [(max(a, t0), min(b, t1)) for a, b in xs if min(b, t1) > max(a, t0)]


def _length(xs: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in xs)


def _complement(xs: list[tuple[float, float]], t0: float, t1: float
                ) -> list[tuple[float, float]]:
    out, at = [], t0
    for a, b in _merge(xs):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if t1 > at:
        out.append((at, t1))
    return out


def _intersect(xs: list[tuple[float, float]], ys: list[tuple[float, float]]
               ) -> list[tuple[float, float]]:
    out = []
    starts = [a for a, _ in ys]
    for a, b in xs:
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(ys) and ys[i][0] < b:
            lo, hi = max(a, ys[i][0]), min(b, ys[i][1])
            if hi > lo:
                out.append((lo, hi))
            i += 1
    return out


def _subtract(xs: list[tuple[float, float]], ys: list[tuple[float, float]]
              ) -> list[tuple[float, float]]:
    out = []
    for a, b in xs:
        out += _complement(_clip(ys, a, b), a, b)
    return out
