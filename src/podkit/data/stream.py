"""Streams: resumable iterators for the ops that need their input in order.

Every stream has next() (raising StopIteration at the end), get_state() -> a small dict,
set_state(dict) and close(). A state never holds elements: ops that buffer (shuffle on a
stream, bucketing) record where their buffer began and replay from there on restore.
"""

from __future__ import annotations

import dataclasses
import hashlib
import queue
import threading
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data import batching, pool, random_access, structure, transfer
from podkit.data._grain import grain
from podkit.data.dataset import AUTOTUNE, INFINITE_CARDINALITY
from podkit.data.functions import UserFn, call, fn_name
from podkit.errors import InputError

if TYPE_CHECKING:
    from podkit.data.dataset import Dataset


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

    def seed(self, node: Dataset) -> int:
        return node._args["seed"]


class Stream:
    def next(self) -> Any:
        raise NotImplementedError

    def get_state(self) -> dict:
        raise NotImplementedError

    def set_state(self, state: dict) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def make(node: Dataset, ctx: Context, path: tuple[int, ...]) -> Stream:
    if node._random_access:
        return RandomAccessStream(node, ctx, path)
    op, a = node._op, node._args
    if op == "generator":
        return GeneratorStream(a["fn"], a["args"])
    if op == "zip":
        return ZipStream([make(p, ctx, path) for p in node._parents], a["structure"])
    if op == "concatenate":
        return ConcatStream(node._parents, ctx, path)
    if op == "repeat":
        return RepeatStream(node._parents[0], ctx, path, a["count"])
    if op == "interleave":
        return InterleaveStream(make(node._parents[0], ctx, path), a["fn"], a["cycle"],
                                a["block"], ctx, path, parallel=a["parallel"] is not None,
                                ordered=a["deterministic"] is not False)
    parent = make(node._parents[0], ctx, path)
    if op == "map":
        return MapStream(parent, UserFn(a["fn"], "map"))
    if op == "filter":
        return FilterStream(parent, UserFn(a["fn"], "filter"))
    if op in ("batch", "padded_batch"):
        return BatchStream(parent, a["size"], a["drop"], a["fn"])
    if op == "unbatch":
        return UnbatchStream(parent)
    if op == "bucket":
        return BucketStream(parent, a)
    if op == "shuffle":
        seed = random_access.derive_seed(ctx.seed(node), path if a["reshuffle"] else ())
        return ShuffleStream(parent, a["buffer"], seed)
    if op in ("take", "skip", "shard", "enumerate"):
        return CountStream(parent, op, a)
    if op == "prefetch":
        return PrefetchStream(parent, a["buffer"] if a["buffer"] != AUTOTUNE else 8)
    raise AssertionError(op)


def drain(node: Dataset, ctx: Context, what: str) -> list[Any]:
    """All elements of a finite node (for cache())."""
    if node.cardinality() == INFINITE_CARDINALITY:
        raise InputError(f"{what} of an endless dataset would never finish; put repeat() after "
                         "cache(), or take(n) first.")
    stream = make(node, ctx, (0,))
    out = []
    try:
        while True:
            out.append(stream.next())
    except StopIteration:
        return out
    finally:
        stream.close()


# -- the random-access part ---------------------------------------------------------------------
class RandomAccessStream(Stream):
    """Reads a Grain MapDataset in index order: in this process, or in worker processes
    (podkit.data.pool) that compute runs of it. The state is the progress through the
    indices, which does not depend on who computed them."""

    def __init__(self, node: Dataset, ctx: Context, path: tuple[int, ...]) -> None:
        from podkit.data import autotune

        self._ds = random_access.build(node, ctx, path)
        self._n = len(self._ds)
        self._ctx = ctx
        self._progress = pool.Progress()
        self._it: Any = None
        self.plan = autotune.Parallelism() if ctx.nested or not ctx.workers else autotune.plan(
            node, self._ds)
        if self.plan.workers:  # the server starts now; its first items are computed here
            pool.Server.get()

    def _open(self) -> None:
        p = self.plan
        todo = self._progress.todo(self._n)
        if p.workers:
            plan = self._portable()
            if plan is not None:
                workers = pool.WorkerPool(
                    plan, None, p.workers, depth=p.depth, ordered=p.ordered, item_s=p.item_s,
                    item_bytes=p.item_bytes, progress=self._progress)
                self._ctx.pools.append(workers)
                self._it = _WarmingUp(_Direct(self._ds, todo, self._progress), workers,
                                      self._progress, self._n)
                return
        if p.threads and len(todo) == 1:
            rest = self._ds[todo[0][0]:].to_iter_dataset(grain.ReadOptions(
                num_threads=p.threads, prefetch_buffer_size=p.buffer))
            self._it = _Counted(iter(rest), todo[0][0], self._progress)
            return
        self._it = _Direct(self._ds, todo, self._progress)

    def _portable(self) -> bytes | None:
        """The plan as bytes for the workers; None (after a warning) when AUTOTUNE chose
        workers for a pipeline that cannot travel, so it runs here as it would without."""
        try:
            return transfer.dumps_plan(self._ds)
        except Exception as e:  # noqa: BLE001 - pickling can fail in many ways
            cause = f"{type(e).__name__}: {e}"
        fix = ("Make the map function and what it uses picklable (module-level objects, "
               "no open files, locks or sockets; create those inside the function), or compute "
               "the pipeline in this process with num_parallel_calls=None.")
        if not self.plan.tuned:
            raise InputError(f"the pipeline cannot be sent to its input worker processes "
                             f"({cause}). {fix}")
        warnings.warn(f"pk.data: AUTOTUNE would compute this pipeline in worker processes, but "
                      f"it cannot be sent to them ({cause}); computing it in this process "
                      f"instead. {fix}", stacklevel=2)
        self.plan = dataclasses.replace(self.plan, workers=0, tuned=False)
        return None

    def next(self) -> Any:
        if self._it is None:
            if self._progress.low >= self._n:
                raise StopIteration
            self._open()
        return next(self._it)

    def get_state(self) -> dict:
        return self._progress.state()

    def set_state(self, state: dict) -> None:
        self.close()
        self._progress = pool.Progress(int(state["index"]), state.get("done", ()))

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()


class _Direct:
    """Sequential reads in this process: the cheapest reader for light pipelines."""

    def __init__(self, ds: grain.MapDataset, todo: list[tuple[int, int]],
                 progress: pool.Progress) -> None:
        self._ds, self._todo, self._progress = ds, list(todo), progress

    def __next__(self) -> Any:
        while self._todo and self._todo[0][0] >= self._todo[0][1]:
            self._todo.pop(0)
        if not self._todo:
            raise StopIteration
        i, stop = self._todo[0]
        item = self._ds[i]
        self._todo[0] = (i + 1, stop)
        self._progress.add(i)
        return item


class _WarmingUp:
    """Items from this process until a worker is ready, then from the workers: the first
    batches never wait for worker start-up, and the order is the same either way."""

    def __init__(self, here: _Direct, workers: pool.WorkerPool, progress: pool.Progress,
                 n: int) -> None:
        self._here, self._workers, self._progress, self._n = here, workers, progress, n
        self._begun = False

    def __next__(self) -> Any:
        if not self._begun and self._workers.started():
            self._workers.begin(self._progress.todo(self._n))
            self._begun = True
        return next(self._workers) if self._begun else next(self._here)

    def close(self) -> None:
        self._workers.close()


class _Counted:
    """A Grain iterator from index `start` on, recording progress as items are taken."""

    def __init__(self, it: Any, start: int, progress: pool.Progress) -> None:
        self._it, self._i, self._progress = it, start, progress

    def __next__(self) -> Any:
        item = next(self._it)
        self._progress.add(self._i)
        self._i += 1
        return item

    def close(self) -> None:
        if hasattr(self._it, "close"):
            self._it.close()


# -- sources and combinators ------------------------------------------------------------------
class GeneratorStream(Stream):
    def __init__(self, fn: Any, args: tuple) -> None:
        self._fn, self._args, self._gen, self._count = fn, args, None, 0

    def next(self) -> Any:
        if self._gen is None:
            self._gen = iter(self._fn(*self._args))
            for _ in range(self._count):  # replay to the restored position
                next(self._gen)
        item = next(self._gen)
        self._count += 1
        return structure.as_numpy(item)

    def get_state(self) -> dict:
        return {"count": self._count}

    def set_state(self, state: dict) -> None:
        self._gen, self._count = None, int(state["count"])


class _Parts(Stream):
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


class ZipStream(_Parts):
    def __init__(self, parts: list[Stream], template: Any) -> None:
        super().__init__(parts)
        self._template = template

    def next(self) -> Any:
        values = iter([p.next() for p in self._parts])
        return structure.map_structure(lambda _: next(values), self._template)


class ConcatStream(_Parts):
    def __init__(self, nodes: tuple, ctx: Context, path: tuple[int, ...]) -> None:
        super().__init__([make(n, ctx, path) for n in nodes])
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


class RepeatStream(Stream):
    """Repetition e iterates the parent anew with path + (e,): shuffles below reshuffle."""

    def __init__(self, node: Dataset, ctx: Context, path: tuple[int, ...],
                 count: int | None) -> None:
        self._node, self._ctx, self._path, self._count = node, ctx, path, count
        self._rep, self._stream = 0, None
        self._empty_run = True

    def next(self) -> Any:
        while self._count is None or self._rep < self._count:
            if self._stream is None:
                self._stream = make(self._node, self._ctx, self._path + (self._rep,))
            try:
                item = self._stream.next()
                self._empty_run = False
                return item
            except StopIteration:
                self._stream.close()
                self._stream = None
                if self._empty_run:  # an empty parent repeated forever is still empty
                    raise
                self._rep += 1
                self._empty_run = True
        raise StopIteration

    def get_state(self) -> dict:
        return {"rep": self._rep,
                "parent": None if self._stream is None else self._stream.get_state()}

    def set_state(self, state: dict) -> None:
        self.close()
        self._rep = int(state["rep"])
        if state["parent"] is not None:
            self._stream = make(self._node, self._ctx, self._path + (self._rep,))
            self._stream.set_state(state["parent"])
            self._empty_run = False

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


class _OnParent(Stream):
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


class MapStream(_OnParent):
    def __init__(self, parent: Stream, fn: UserFn) -> None:
        super().__init__(parent)
        self._fn = fn

    def next(self) -> Any:
        item = self._parent.next()
        self._seen += 1
        return self._fn(self._seen - 1, item)


class FilterStream(_OnParent):
    def __init__(self, parent: Stream, fn: UserFn) -> None:
        super().__init__(parent)
        self._fn = fn

    def next(self) -> Any:
        while True:
            item = self._parent.next()
            self._seen += 1
            if self._fn(self._seen - 1, item):
                return item


class BatchStream(_OnParent):
    def __init__(self, parent: Stream, size: int, drop: bool, fn: Any) -> None:
        super().__init__(parent)
        self._size, self._drop, self._fn = size, drop, fn

    def next(self) -> Any:
        items = []
        try:
            while len(items) < self._size:
                items.append(self._parent.next())
        except StopIteration:
            if not items or self._drop:
                raise
        return self._fn(items)


class CountStream(_OnParent):
    """take, skip, shard and enumerate: decisions by the count of input elements."""

    def __init__(self, parent: Stream, op: str, args: dict) -> None:
        super().__init__(parent)
        self._op, self._a = op, args

    def next(self) -> Any:
        op, a = self._op, self._a
        if op == "take":
            if a["count"] != -1 and self._seen >= a["count"]:
                raise StopIteration
            self._seen += 1
            return self._parent.next()
        if op == "skip":
            while a["count"] == -1 or self._seen < a["count"]:
                self._parent.next()
                self._seen += 1
            return self._parent.next()
        if op == "shard":
            while True:
                item = self._parent.next()
                self._seen += 1
                if (self._seen - 1) % a["num"] == a["index"]:
                    return item
        item = self._parent.next()  # enumerate
        self._seen += 1
        return np.int64(a["start"] + self._seen - 1), item


class UnbatchStream(Stream):
    def __init__(self, parent: Stream) -> None:
        self._parent = parent
        self._batch: list | None = None
        self._pos = 0
        self._before = parent.get_state()  # the parent's state before the current batch

    def next(self) -> Any:
        while self._batch is None or self._pos >= len(self._batch):
            self._before = self._parent.get_state()
            self._batch, self._pos = _rows(self._parent.next()), 0
        item = self._batch[self._pos]
        self._pos += 1
        return item

    def get_state(self) -> dict:
        return {"before": self._before, "pos": self._pos if self._batch is not None else 0,
                "open": self._batch is not None}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["before"])
        self._before, self._batch, self._pos = state["before"], None, 0
        if state["open"]:
            self._batch, self._pos = _rows(self._parent.next()), int(state["pos"])

    def close(self) -> None:
        self._parent.close()


def _rows(batch: Any) -> list:
    flat = structure.leaves(batch)
    sizes = {len(np.asarray(x)) if np.ndim(x) else None for x in flat}
    if None in sizes or len(sizes) != 1:
        raise InputError(f"unbatch needs leaves with one common leading dim, got shapes "
                         f"{structure.describe(batch)}.")
    n = sizes.pop()
    return [structure.map_structure(lambda a, i=i: a[i], batch) for i in range(n)]


class _Replaying(Stream):
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


class ShuffleStream(_Replaying):
    """tf.data's buffer shuffle: fill `buffer` elements, emit a random one, refill."""

    def __init__(self, parent: Stream, buffer: int, seed: int) -> None:
        self._size, self._seed = buffer, seed
        super().__init__(parent)

    def _reset(self) -> None:
        self._buf: list = []
        self._done = False
        self._rng = np.random.default_rng([self._seed, *self._mark_key()])

    def _mark_key(self) -> list[int]:
        # The random stream restarts at each mark, keyed by where the mark is.
        digest = hashlib.sha256(repr(self._mark).encode()).digest()
        return [int.from_bytes(digest[:8], "little")]

    def _buffer_empty(self) -> bool:
        return not self._buf and self._done

    def _produce(self) -> Any:
        while not self._done and len(self._buf) < self._size:
            try:
                self._buf.append(self._parent.next())
            except StopIteration:
                self._done = True
        if not self._buf:
            raise StopIteration
        i = int(self._rng.integers(len(self._buf)))
        self._buf[i], self._buf[-1] = self._buf[-1], self._buf[i]
        return self._buf.pop()


class BucketStream(_Replaying):
    """bucket_by_sequence_length with tf.data's rules."""

    def __init__(self, parent: Stream, args: dict) -> None:
        self._a = args
        self._pad = batching.Pad(args["padded_shapes"], args["padding_values"])
        self._stack = batching.Stack()
        super().__init__(parent)

    def _reset(self) -> None:
        self._buckets: list[list] = [[] for _ in self._a["sizes"]]
        self._done = False
        self._flush = 0

    def _buffer_empty(self) -> bool:
        return self._done and not any(self._buckets)

    def _emit(self, b: int, items: list) -> Any:
        a = self._a
        if a["no_padding"]:
            return self._stack(items)
        if a["to_boundary"]:
            if b == len(a["bounds"]):
                raise InputError(
                    f"an element is longer than the last bucket boundary {a['bounds'][-1]} and "
                    "pad_to_bucket_boundary=True; add a larger boundary or filter long "
                    "elements out.")
            target = a["bounds"][b] - 1
            return batching.Pad(_boundary_shapes(items[0], target, a["padded_shapes"]),
                                a["padding_values"])(items)
        return self._pad(items)

    def _produce(self) -> Any:
        a = self._a
        while not self._done:
            try:
                item = self._parent.next()
            except StopIteration:
                self._done = True
                break
            length = int(call(a["length_fn"], item))
            b = batching.bucket_index(length, a["bounds"])
            self._buckets[b].append(item)
            if len(self._buckets[b]) == a["sizes"][b]:
                items, self._buckets[b] = self._buckets[b], []
                return self._emit(b, items)
        while self._flush < len(self._buckets):  # leftovers, bucket by bucket
            b = self._flush
            items, self._buckets[b] = self._buckets[b], []
            self._flush += 1
            if items and not a["drop"]:
                return self._emit(b, items)
        raise StopIteration


def _boundary_shapes(element: Any, target: int, padded_shapes: Any) -> Any:
    if padded_shapes is not None:
        return structure.map_structure(lambda s: s, padded_shapes)
    return structure.map_structure(
        lambda x: tuple([target] + [None] * (np.ndim(x) - 1)) if np.ndim(x) else (), element)


class InterleaveStream(Stream):
    """tf.data's interleave order: cycle over `cycle` open datasets, `block` elements each;
    an exhausted one is replaced in its slot by the next input element's dataset.

    parallel: each open dataset is read ahead by its own thread (PrefetchStream, whose state
    is exact). Not ordered: when the slot whose turn it is has nothing ready, the next slot
    that has takes the turn."""

    READ_AHEAD = 4  # elements each open dataset's thread keeps ready

    def __init__(self, parent: Stream, fn: Any, cycle: int, block: int, ctx: Context,
                 path: tuple[int, ...], parallel: bool = False, ordered: bool = True) -> None:
        self._parent, self._fn, self._cycle, self._block = parent, fn, cycle, block
        self._parallel, self._ordered = parallel, ordered
        self._ctx = dataclasses.replace(ctx, nested=True)
        self._path = path
        self._slots: list[Stream | None] = [None] * cycle
        self._slot_marks: list[dict | None] = [None] * cycle  # parent state before the input
        self._slot_index: list[int] = [0] * cycle
        self._pos = self._in_block = 0
        self._inputs = 0
        self._end_of_input = False

    def _open(self, slot: int, mark: dict, index: int) -> Stream | None:
        try:
            element = self._parent.next()
        except StopIteration:
            self._end_of_input = True
            return None
        ds = call(self._fn, element)
        from podkit.data.dataset import Dataset

        if not isinstance(ds, Dataset):
            raise InputError(f"the interleave function {fn_name(self._fn)} returned a "
                             f"{type(ds).__name__}; it must return a pk.data.Dataset.")
        self._slot_marks[slot], self._slot_index[slot] = mark, index
        stream = make(ds, self._ctx, self._path + (index,))
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
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
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
