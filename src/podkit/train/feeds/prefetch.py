"""A background thread that prepares the next executions while the current one runs."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

PREFETCH_DEPTH = 2


def prefetch(items: Iterator, place: Callable[[Any], Any], depth: int = PREFETCH_DEPTH,
             on_stop: Callable[[], None] | None = None) -> Iterator:
    """Run `place(item)` for the next items on a background thread, `depth` ahead.

    Errors (in the source or in `place`) reach the consumer with their traceback; closing the
    generator stops the thread. If the consumer stops before the items end (an error, a
    KeyboardInterrupt), `on_stop` runs first: it ends the source, which the thread may be
    blocked on.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(value: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(("ok", place(item))):
                    return
            put(("ok", done))
        except BaseException as e:  # re-raised in the consumer
            put(("err", e))

    thread = threading.Thread(target=work, name="podkit-prefetch", daemon=True)
    thread.start()

    def consume() -> Iterator:
        try:
            while True:
                kind, value = q.get()
                if kind == "err":
                    raise value
                if value is done:
                    return
                yield value
        finally:
            stop.set()
            if thread.is_alive() and on_stop is not None:
                on_stop()
            thread.join(timeout=5)

    return consume()
