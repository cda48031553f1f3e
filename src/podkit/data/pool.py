"""Input worker processes, consumer side: start them, feed them work, take their elements.

    pool = WorkerPool(map_dataset, ranges=[(0, n)], workers=2)
    for item in pool: ...          # items 0, 1, 2, ... in order (or as ready, ordered=False)
    pool.state()                   # where to resume: {"index": i} (+ "done" when unordered)

One server per consuming process (`Server`), started on first use from a clean interpreter,
forks the workers; see podkit.data.worker for their side and why. Work goes out in *chunks*:
runs of consecutive items sized to about CHUNK_S of compute each (measured as the workers
report), so the hand-off costs the same whether an item is a batch of 256 images or one
number. Each worker has `depth` chunks in flight, each in its own reused shared-memory slot;
a chunk of one large item is lent to the consumer as views of its slot (transfer.py), and the
worker gets a new slot rather than wait for views the consumer may keep.

Nothing here hangs: a worker that fails to start, raises, or dies turns into an exception in
the consumer (the worker's own exception and traceback when it had one, its exit status
otherwise); closing the pool ends its workers at once, even in the middle of an element.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import dataclasses
import itertools
import json
import mmap
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from podkit.data import transfer, worker
from podkit.errors import DataError

CHUNK_S = 0.02  # compute per chunk: the hand-off (~100 us) stays under 1% of it
MAX_CHUNK_ITEMS = 4096
CHUNK_BYTES = 32 << 20  # a chunk's elements stay within this, whatever their cost
START_TIMEOUT_S = 120.0  # an interpreter that needs longer to import numpy and Grain is stuck
EXIT_STATUS_WAIT_S = 2.0
# Workers are one process per core: the math libraries inside each must not spawn a thread
# per core too (the consumer's own settings win where it has set them).
_ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _close_segment(segment: mmap.mmap | None) -> None:
    """Unmap a slot's segment now, or, while an array still views it (one the consumer was
    lent and keeps, or one being built), when the last of them goes."""
    if segment is None:
        return
    try:
        segment.close()
    except BufferError:
        pass


# -- the server -------------------------------------------------------------------------------
class Server:
    """The clean process that forks this process's input workers (one per consumer)."""

    _lock = threading.Lock()
    _current: Server | None = None

    @classmethod
    def get(cls) -> Server:
        with cls._lock:
            s = cls._current
            if s is None or s.owner != os.getpid() or not s.alive():
                if s is not None and s.owner == os.getpid():
                    s.close()
                s = cls._current = Server()
            return s

    def __init__(self) -> None:
        self.owner = os.getpid()
        mine, theirs = transfer.pair()
        life_r, self._life_w = os.pipe()
        env = dict(os.environ)
        env["PODKIT_SYS_PATH"] = json.dumps(sys.path)
        for var in _ONE_THREAD:
            env.setdefault(var, "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", worker.BOOT, "podkit-data-server", str(os.getpid()),
             str(life_r), str(theirs.fileno())],
            pass_fds=(life_r, theirs.fileno()), stdin=subprocess.DEVNULL, env=env)
        os.close(life_r)
        theirs.close()
        self.channel = transfer.Channel(mine)
        self._lock = threading.Lock()  # one conversation at a time
        self._exits: dict[int, int] = {}  # pid -> wait status
        self._forked: dict[int, int] = {}  # token -> pid
        self._tokens = itertools.count()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self, timeout: float) -> bool:
        """Record the server's next message (its start, a fork, an exit); False on timeout."""
        if not select.select([self.channel.sock], [], [], timeout)[0]:
            return False
        try:
            message, _ = self.channel.recv()
        except transfer.Closed:
            raise DataError(self._died("while starting input workers")) from None
        if message[0] == "exited":
            self._exits[message[1]] = message[2]
        elif message[0] == "forked":
            self._forked[message[1]] = message[2]
        return True

    def _died(self, when: str) -> str:
        try:
            code = self.proc.wait(timeout=EXIT_STATUS_WAIT_S)
        except subprocess.TimeoutExpired:
            code = None
        return (f"the input worker server (pid {self.proc.pid}) {_status(code, exit_code=True)} "
                f"{when}; its error output, if any, is above. Run with num_parallel_calls=None "
                "to compute the pipeline in this process.")

    def fork(self, data: transfer.socket.socket, life_r: int) -> int:
        """Ask for a worker talking on `data`, living while `life_r`'s pipe is open. Returns
        at once (the server may still be starting) with a token for `pid()`."""
        with self._lock:
            token = next(self._tokens)
            try:
                self.channel.send(("fork", token), fds=(data.fileno(), life_r))
            except transfer.Closed:
                raise DataError(self._died("before it could start a worker")) from None
            return token

    def pid(self, token: int, timeout: float = EXIT_STATUS_WAIT_S) -> int | None:
        """The pid of the worker forked for `token` (None if not known in time)."""
        return self._await(self._forked, token, timeout)

    def _await(self, table: dict, key: int, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while key not in table:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    self._read(left)
                except DataError:
                    return None
            return table[key]

    def exit_status(self, pid: int, timeout: float = EXIT_STATUS_WAIT_S) -> int | None:
        """A worker's wait status, once the server has reaped it (None if not in time)."""
        return self._await(self._exits, pid, timeout)

    def close(self) -> None:
        try:
            os.close(self._life_w)
        except OSError:
            pass
        self.channel.close()

    @classmethod
    def stop(cls) -> None:
        """Close this process's server, if it started one (at exit)."""
        server = cls._current
        if server is not None and server.owner == os.getpid():
            server.close()


atexit.register(Server.stop)


def _status(code: int | None, exit_code: bool = False) -> str:
    """Words for a wait status (or, with exit_code, a Popen return code)."""
    if code is None:
        return "stopped answering"
    if exit_code:
        signum = -code if code < 0 else None
        value = code
    else:
        signum = os.WTERMSIG(code) if os.WIFSIGNALED(code) else None
        value = os.WEXITSTATUS(code) if os.WIFEXITED(code) else code
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:  # a number with no name on this platform
            name = ""
        text = f"was killed by signal {signum} ({name})"
        if signum == signal.SIGKILL:
            text += (" — the kernel's out-of-memory killer sends SIGKILL when memory runs "
                     "out; if that is the cause, use fewer workers (num_parallel_calls) or "
                     "smaller elements")
        return text
    return f"exited with code {value}"


# -- which items are done -----------------------------------------------------------------------
class Progress:
    """The items consumed so far: all below `low`, plus disjoint runs above it (out of order)."""

    def __init__(self, low: int = 0, done: Iterable[tuple[int, int]] = ()) -> None:
        self.low = low
        self.runs: list[list[int]] = sorted([list(r) for r in done if r[1] > low])

    def add(self, i: int) -> None:
        if i == self.low and not self.runs:  # in order: the common case
            self.low += 1
            return
        k = bisect.bisect_right(self.runs, [i, float("inf")])
        if k and self.runs[k - 1][1] == i:
            self.runs[k - 1][1] += 1
            k -= 1
        elif k < len(self.runs) and self.runs[k][0] == i + 1:
            self.runs[k][0] = i
        else:
            self.runs.insert(k, [i, i + 1])
        if k + 1 < len(self.runs) and self.runs[k][1] == self.runs[k + 1][0]:
            self.runs[k][1] = self.runs.pop(k + 1)[1]
        while self.runs and self.runs[0][0] <= self.low:
            self.low = max(self.low, self.runs.pop(0)[1])

    def todo(self, n: int) -> list[tuple[int, int]]:
        """The ranges of [low, n) still to produce, in order."""
        out, at = [], self.low
        for a, b in self.runs:
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < n:
            out.append((at, n))
        return out

    def state(self) -> dict:
        return {"index": self.low, "done": [list(r) for r in self.runs]} if self.runs else {
            "index": self.low}


# -- the pool ---------------------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    token: int  # the server's name for it until it says its pid
    channel: transfer.Channel
    life_w: int
    free: list[int]
    segments: dict[int, mmap.mmap] = dataclasses.field(default_factory=dict)
    pending: collections.deque = dataclasses.field(default_factory=collections.deque)
    ready: bool = False
    pid: int | None = None


class WorkerPool:
    """Computes items of a random-access dataset in worker processes.

    `plan` is the dataset pickled (cloudpickle); `ranges` the item ranges to produce, in order.
    Ordered (the default), items come in index order; unordered, chunk by chunk as workers
    finish them (tf.data's deterministic=False), and state() records which runs are done.
    """

    def __init__(self, plan: bytes, ranges: list[tuple[int, int]] | None, workers: int, *,
                 depth: int = 2, ordered: bool = True, item_s: float | None = None,
                 item_bytes: int = 0, progress: Progress | None = None) -> None:
        ranges = ranges or []
        self._ranges = collections.deque(ranges)
        self._ordered = ordered
        self._item_s, self._item_bytes = item_s, item_bytes
        self.progress = progress or Progress(ranges[0][0] if ranges else 0)
        self._next_seq = 0
        self._order: collections.deque = collections.deque()  # (seq, worker) issued, in order
        self._current: collections.deque = collections.deque()  # (index, item) taken out
        self._error: BaseException | None = None
        # (worker, slot) lent to the consumer as views and dropped since: free again. Appended
        # by whichever thread drops the last view (deque.append is atomic), drained by _issue.
        self._returned: collections.deque = collections.deque()
        self._depth = depth  # chunks in flight per worker, and the free slots it keeps
        self._next_slot = depth
        self.closed = False
        self.compute_s = 0.0  # seconds the workers spent computing the items taken so far
        self.workers: list[_Worker] = []
        server = Server.get()
        self._server = server
        self._created = time.monotonic()
        init = {"plan": plan, "sys_path": list(sys.path), "cwd": os.getcwd(),
                "env": dict(os.environ)}
        try:
            for w in range(workers):
                mine, theirs = transfer.pair()
                life_r, life_w = os.pipe()
                try:
                    token = server.fork(theirs, life_r)
                finally:
                    theirs.close()
                    os.close(life_r)
                channel = transfer.Channel(mine)
                self.workers.append(_Worker(w, token, channel, life_w, list(range(depth))))
                channel.send(init)
            self._issue()
        except BaseException:
            self.close()
            raise

    def started(self) -> bool:
        """Whether a worker is ready to compute (reads start-up news without waiting; a
        worker that failed to start raises here)."""
        for w in self.workers:
            while not w.ready and select.select([w.channel.sock], [], [], 0)[0]:
                self._take(w)
        if any(w.ready for w in self.workers):
            return True
        self._check_start_deadline()
        return False

    def _check_start_deadline(self) -> None:
        if time.monotonic() - self._created > START_TIMEOUT_S:
            self.close()
            raise DataError(f"no input worker started within {START_TIMEOUT_S:.0f} s (the "
                            f"worker server is pid {self._server.proc.pid}); compute the "
                            "pipeline in this process with num_parallel_calls=None.")

    def begin(self, ranges: list[tuple[int, int]]) -> None:
        """Start handing out `ranges` (for a pool created with none)."""
        self._ranges.extend(ranges)
        self._issue()

    # -- work out -------------------------------------------------------------------------
    def _chunk_items(self) -> int:
        if self._item_s is None:
            return 1  # until the first chunk says what an item costs
        n = max(1, round(CHUNK_S / max(self._item_s, 1e-7)))
        if self._item_bytes:
            n = min(n, max(1, CHUNK_BYTES // self._item_bytes))
        return min(n, MAX_CHUNK_ITEMS)

    def _next_range(self) -> tuple[int, int] | None:
        while self._ranges:
            a, b = self._ranges[0]
            if a >= b:
                self._ranges.popleft()
                continue
            c = min(b, a + self._chunk_items())
            self._ranges[0] = (c, b)
            return a, c
        return None

    def _issue(self) -> None:
        """Send out chunks while workers have free slots. Ordered, chunk s goes to worker
        s mod N, so each worker's answers arrive in the order the consumer takes them."""
        while self._returned:
            w, slot = self._returned.popleft()
            if len(w.free) < self._depth:
                w.free.append(slot)
                continue
            # One made while the consumer held views: no longer needed, both sides unmap it.
            _close_segment(w.segments.pop(slot, None))
            try:
                w.channel.send(("drop", slot))
            except transfer.Closed:
                pass  # reported when its answer is awaited
        while True:
            if self._ordered:
                w = self.workers[self._next_seq % len(self.workers)]
                if len(w.pending) >= self._depth:
                    return
            else:
                idle = [w for w in self.workers if len(w.pending) < self._depth]
                if not idle:
                    return
                w = min(idle, key=lambda x: len(x.pending))
            span = self._next_range()
            if span is None:
                return
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            # Every slot of w may be lent out as views the consumer still holds: a new one,
            # never a wait on arrays that may never be dropped.
            slot = w.free.pop() if w.free else self._new_slot()
            w.pending.append((seq, span[0], span[1], slot))
            self._order.append((seq, w))
            try:
                w.channel.send(("chunk", seq, span[0], span[1], slot))
            except transfer.Closed:
                return  # reported when its answer is awaited

    def _new_slot(self) -> int:
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        return slot

    # -- items in ---------------------------------------------------------------------------
    def __iter__(self) -> WorkerPool:
        return self

    def __next__(self) -> Any:
        while not self._current:
            if self._error is not None:
                error, self._error = self._error, None
                self.close()
                raise error
            if self.closed:
                raise StopIteration
            if not self._order:
                raise StopIteration  # every range produced and taken
            self._take(self._wait())
        index, item = self._current.popleft()
        self.progress.add(index)
        return item

    def _wait(self) -> _Worker:
        if self._ordered:
            return self._order[0][1]
        busy = [w for w in self.workers if w.pending]
        ready = select.select([w.channel.sock for w in busy], [], [])[0]
        return next(w for w in busy if w.channel.sock in ready)

    def _take(self, w: _Worker) -> None:
        """Handle one message from `w`: its start-up news, or a chunk of items."""
        while not w.ready and not select.select([w.channel.sock], [], [], 1.0)[0]:
            self._check_start_deadline()  # a worker that never starts is an error, not a hang
        try:
            message, fds = w.channel.recv()
        except transfer.Closed:
            raise self._death(w) from None
        except OSError:
            if self.closed:
                raise DataError("the input iterator was closed.") from None
            raise
        kind = message[0]
        if kind == "ready":
            w.ready, w.pid = True, message[1]
            return
        if kind == "error":
            self.close()
            raise DataError(f"input worker {w.index} (pid {self._pid(w)}) could not start:\n"
                            f"{message[1]}")
        _, seq, layout, seconds, error = message
        issued, start, stop, slot = w.pending.popleft()
        assert issued == seq, (issued, seq)
        if self._ordered:
            self._order.popleft()
        else:
            self._order.remove((seq, w))
        if fds:
            _close_segment(w.segments.pop(slot, None))
            w.segments[slot] = mmap.mmap(fds[0], 0)
            os.close(fds[0])
        if not layout["end"]:
            items = []
            w.free.append(slot)
        elif stop - start == 1 and layout["end"] >= transfer.VIEW_BYTES:
            # one large item: lent as views, the slot back when they are dropped
            returned, lent = self._returned, (w, slot)
            items = transfer.unpack(w.segments[slot], layout, lambda: returned.append(lent))
        else:
            items = transfer.unpack(w.segments[slot], layout)
            w.free.append(slot)
        self.compute_s += seconds
        if items and error is None:
            per = seconds / len(items)
            self._item_s = per if self._item_s is None else 0.7 * self._item_s + 0.3 * per
            self._item_bytes = max(self._item_bytes, layout["end"] // len(items))
        self._current.extend(zip(range(start, start + len(items)), items, strict=True))
        if error is not None:
            self._error = error
            self._ranges.clear()
        else:
            self._issue()

    def _death(self, w: _Worker) -> DataError:
        closed = self.closed
        self.close()
        if closed:
            return DataError("the input iterator was closed.")
        pid = self._pid(w)
        status = None if pid is None else self._server.exit_status(pid)
        if not w.ready:
            what = "could not start"
        elif w.pending:
            what = f"died while computing items {w.pending[0][1]}..{w.pending[0][2] - 1}"
        else:
            what = "died"
        how = "closed its connection" if status is None else _status(status)
        return DataError(f"input worker {w.index} (pid {pid}) {what}: it {how}. Its error "
                         "output, if any, is above.")

    def _pid(self, w: _Worker) -> int | None:
        if w.pid is None:
            w.pid = self._server.pid(w.token)
        return w.pid

    # -- end --------------------------------------------------------------------------------
    def state(self) -> dict:
        return self.progress.state()

    def close(self) -> None:
        """End the workers now. Safe from any thread and from __del__: no locks, no waits."""
        if self.closed:
            return
        self.closed = True
        for w in self.workers:
            try:
                os.close(w.life_w)  # the worker's lifeline: it exits at once
            except OSError:
                pass
            w.channel.close()
            for segment in w.segments.values():
                _close_segment(segment)
            w.segments.clear()

    def __del__(self) -> None:
        self.close()
