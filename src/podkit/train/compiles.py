"""Compile time as JAX reports it: every trace, lowering and XLA compile of this process, with
the thread it ran on, from `jax.monitoring`'s duration events.

    mark = compiles.mark()
    ...                                   # fit() runs, its steps compile
    compiles.seconds_since(mark)          # {"trace": s, "lower": s, "compile": s}
    compiles.intervals_since(mark, tid)   # [(start, end), ...] on one thread

A listener registered once per process (on first use) keeps the events; the loop's timeline
(podkit.train.timeline) counts the ones on the loop's thread as its compile time. Events of
other threads (a state initializer compiling on its own thread) are kept too, and tell apart
by thread.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}
KEEP = 100_000  # events kept (a process that compiles more forgets the oldest)


@dataclasses.dataclass(frozen=True)
class Event:
    index: int
    kind: str  # "trace", "lower" or "compile"
    thread: int
    start: float  # perf_counter()
    end: float


_events: collections.deque[Event] = collections.deque(maxlen=KEEP)
_count = 0
_lock = threading.Lock()
_registered = False


def _listen(name: str, duration: float, **_: object) -> None:
    global _count
    kind = EVENTS.get(name)
    if kind is None:
        return
    end = time.perf_counter()
    with _lock:
        _events.append(Event(_count, kind, threading.get_ident(), end - duration, end))
        _count += 1


def _register() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    from jax import monitoring

    monitoring.register_event_duration_secs_listener(_listen)


def mark() -> int:
    """A point to measure from (registers the listener on first use)."""
    _register()
    with _lock:
        return _count


def since(start: int, thread: int | None = None) -> list[Event]:
    """The events after `mark()` returned `start` (on one thread, or all)."""
    with _lock:
        return [e for e in _events if e.index >= start and (thread is None or e.thread == thread)]


def seconds_since(start: int, thread: int | None = None) -> dict[str, float]:
    """Seconds of tracing, lowering and XLA compiling since the mark, and the number of XLA
    compiles ("compiles")."""
    out = dict.fromkeys(EVENTS.values(), 0.0)
    events = since(start, thread)
    for e in events:
        out[e.kind] += e.end - e.start
    out["compiles"] = sum(e.kind == "compile" for e in events)
    return out


def intervals_since(start: int, thread: int) -> list[tuple[float, float]]:
    """When the thread was tracing, lowering or compiling since the mark."""
    return [(e.start, e.end) for e in since(start, thread)]
