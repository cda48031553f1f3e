"""Streams: resumable iterators for the ops that need their input in order.

Every stream has next() (raising StopIteration at the end), get_state() -> a small dict,
set_state(dict) and close(). A state never holds elements: ops that buffer (shuffle on a
stream, bucketing) record where their buffer began and replay from there on restore.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data import batching, random_access, structure
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
                                a["block"], ctx, path)
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
@dataclasses.dataclass
class Parallelism:
    workers: int = 0  # processes computing elements (Grain mp_prefetch); 0: this process
    threads: int = 0  # Grain read threads per process
    buffer: int = 2  # elements buffered per worker / per process


class RandomAccessStream(Stream):
    """Reads a Grain MapDataset in order from an index; workers compute slices of it."""

    def __init__(self, node: Dataset, ctx: Context, path: tuple[int, ...]) -> None:
        from podkit.data import autotune

        self._ds = random_access.build(node, ctx, path)
        self._n = len(self._ds)
        self._index = 0
        self._it: Any = None
        self.plan = Parallelism() if ctx.nested or not ctx.workers else autotune.plan(
            node, self._ds)

    def _open(self) -> None:
        rest = self._ds[self._index:]
        p = self.plan
        if p.workers == 0 and p.threads == 0:
            self._it = _Direct(rest)
            return
        it = rest.to_iter_dataset(grain.ReadOptions(num_threads=p.threads,
                                                    prefetch_buffer_size=p.buffer))
        if p.workers:
            it = it.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(
                num_workers=p.workers, per_worker_buffer_size=p.buffer),
                worker_init_fn=exit_with_parent)
        self._it = iter(it)

    def next(self) -> Any:
        if self._index >= self._n:
            raise StopIteration
        if self._it is None:
            self._open()
        try:
            item = next(self._it)
        except StopIteration:
            self._index = self._n
            raise
        self._index += 1
        return item

    def get_state(self) -> dict:
        return {"index": self._index}

    def set_state(self, state: dict) -> None:
        self.close()
        self._index = int(state["index"])

    def close(self) -> None:
        if self._it is not None and hasattr(self._it, "close"):
            self._it.close()
        self._it = None


def exit_with_parent(worker_index: int, worker_count: int) -> None:
    """Runs in each input worker: exit when the consuming process is gone, even if it was
    killed with SIGKILL and could not stop its workers (it is then no longer our parent)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="podkit-parent-watch", daemon=True).start()


class _Direct:
    """Sequential __getitem__ calls: the cheapest reader for in-memory, light pipelines."""

    def __init__(self, ds: grain.MapDataset) -> None:
        self._ds, self._i, self._n = ds, 0, len(ds)

    def __next__(self) -> Any:
        if self._i >= self._n:
            raise StopIteration
        item = self._ds[self._i]
        self._i += 1
        return item


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
    an exhausted one is replaced in its slot by the next input element's dataset."""

    def __init__(self, parent: Stream, fn: Any, cycle: int, block: int, ctx: Context,
                 path: tuple[int, ...]) -> None:
        self._parent, self._fn, self._cycle, self._block = parent, fn, cycle, block
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
        return make(ds, self._ctx, self._path + (index,))

    def _advance(self) -> None:
        self._in_block = 0
        self._pos = (self._pos + 1) % self._cycle

    def next(self) -> Any:
        while not self._end_of_input or any(s is not None for s in self._slots):
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
