"""Streams: the resumable iterators a plan runs as, and the pieces ops build theirs from.

Every stream has next() (raising StopIteration at the end), get_state() -> a small dict,
set_state(dict) and close(). A state never holds elements: ops that buffer (shuffle on a
stream, bucketing) record where their buffer began and replay from there on restore.

Here: the Context one iterator runs in, the Stream protocol and the bases that op streams
share. Each op's own stream lives beside the op in podkit.data.ops; the reader of a
random-access part is podkit.data.reader. Nothing here loads Grain.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from podkit.errors import DataError


@dataclasses.dataclass
class Context:
    """What one iterator decided: whether it may start worker processes, and whether this is
    a pipeline nested inside another (interleave's inner datasets), which never starts any."""

    workers: bool = True
    nested: bool = False
    pools: list = dataclasses.field(default_factory=list)  # worker pools started, for stats
    retired_s: float = 0.0  # compute seconds of pools that have ended

    def worker_stats(self) -> tuple[int, float]:
        """(worker processes running now, seconds all workers have spent computing)."""
        for p in self.pools:
            if p.closed:
                self.retired_s += p.compute_s
        self.pools[:] = [p for p in self.pools if not p.closed]
        return (sum(len(p.workers) for p in self.pools),
                self.retired_s + sum(p.compute_s for p in self.pools))


class Stream:
    def next(self) -> Any:
        raise NotImplementedError

    def get_state(self) -> dict:
        raise NotImplementedError

    def set_state(self, state: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class FilesStream(Stream):
    """The items of several files in order, each file read from its start (a compressed file
    cannot be entered in the middle). The state is (file, items read of it) under `key`;
    resuming opens that file again and skips what was read. An item that raises DataError
    (corrupt or truncated) ends its file: nothing after it can be framed, so the stream goes
    on with the next file, which is what `ignore_errors()` sees."""

    key = "count"  # the state's name for the items read of the current file

    def __init__(self, files: Sequence[str]) -> None:
        self._files = tuple(files)
        self._file, self._read = 0, 0
        self._items: Iterator[Any] | None = None

    def open(self, path: str, skip: int) -> Iterator[Any]:
        """The items of file `path` from item `skip` on (a generator: close() ends it)."""
        raise NotImplementedError

    def next(self) -> Any:
        while self._file < len(self._files):
            if self._items is None:
                self._items = self.open(self._files[self._file], self._read)
            try:
                item = next(self._items, None)
            except DataError:
                self._next_file()
                raise
            if item is not None:
                self._read += 1
                return item
            self._next_file()
        raise StopIteration

    def _next_file(self) -> None:
        self.close()
        self._file, self._read = self._file + 1, 0

    def get_state(self) -> dict:
        return {"file": self._file, self.key: self._read}

    def set_state(self, state: dict) -> None:
        self.close()
        self._file, self._read = int(state["file"]), int(state[self.key])

    def close(self) -> None:
        if self._items is not None:
            self._items.close()  # type: ignore[attr-defined]
            self._items = None


# -- bases of op streams -----------------------------------------------------------------
class Parts(Stream):
    """A stream over several child streams: their states side by side."""

    def __init__(self, parts: list[Stream]) -> None:
        self._parts = parts

    def get_state(self) -> dict:
        return {"parts": [p.get_state() for p in self._parts]}

    def set_state(self, state: dict) -> None:
        for p, s in zip(self._parts, state["parts"], strict=True):
            p.set_state(s)

    def close(self) -> None:
        for p in self._parts:
            p.close()


class OnParent(Stream):
    """A stream whose whole state is its parent's plus a counter."""

    def __init__(self, parent: Stream) -> None:
        self._parent, self._seen = parent, 0

    def get_state(self) -> dict:
        return {"parent": self._parent.get_state(), "seen": self._seen}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["parent"])
        self._seen = int(state["seen"])

    def close(self) -> None:
        self._parent.close()


class Replaying(Stream):
    """Ops with a buffer (stream shuffle, bucketing). The state is the parent's state when the
    buffer was last empty plus how many outputs were produced since; restoring replays."""

    def __init__(self, parent: Stream) -> None:
        self._parent = parent
        self._mark = parent.get_state()
        self._since = 0
        self._reset()

    def _reset(self) -> None:
        raise NotImplementedError

    def _produce(self) -> Any:
        raise NotImplementedError

    def _buffer_empty(self) -> bool:
        raise NotImplementedError

    def next(self) -> Any:
        if self._buffer_empty():
            self._mark, self._since = self._parent.get_state(), 0
            self._reset()
        item = self._produce()
        self._since += 1
        return item

    def get_state(self) -> dict:
        return {"mark": self._mark, "since": self._since}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["mark"])
        self._mark, self._since = state["mark"], 0
        self._reset()
        for _ in range(int(state["since"])):
            self._produce()
            self._since += 1

    def close(self) -> None:
        self._parent.close()


class PrefetchStream(Stream):
    """A thread keeps `buffer` elements ready, each with the parent's state after it, so the
    state of what the consumer has taken is exact."""

    def __init__(self, parent: Stream, buffer: int) -> None:
        self._parent, self._size = parent, buffer
        self._state = parent.get_state()
        self._thread: threading.Thread | None = None

    def ready(self) -> bool:
        """Whether next() would return without waiting."""
        return self._thread is not None and not self._q.empty()

    def start(self) -> None:
        """Begin reading ahead now rather than at the first next()."""
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        self._q: queue.Queue = queue.Queue(self._size)
        self._stop = threading.Event()

        def work() -> None:
            try:
                while not self._stop.is_set():
                    item = self._parent.next()
                    self._put(("ok", item, self._parent.get_state()))
            except StopIteration:
                self._put(("end", None, None))
            except BaseException as e:  # re-raised in the consumer
                self._put(("err", e, None))

        self._thread = threading.Thread(target=work, name="podkit-data-prefetch", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(entry, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> Any:
        if self._thread is None:
            self._start()
        kind, item, state = self._q.get()
        if kind == "end":
            self._q.put(("end", None, None))
            raise StopIteration
        if kind == "err":
            raise item
        self._state = state
        return item

    def get_state(self) -> dict:
        return self._state

    def set_state(self, state: dict) -> None:
        self._halt()
        self._parent.set_state(state)
        self._state = state

    def _halt(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=30)
            self._thread = None

    def close(self) -> None:
        self._halt()
        self._parent.close()
