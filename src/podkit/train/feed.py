"""Feeds: turn the user's data into per-execution device inputs for the compiled steps.

Two kinds, one interface (`epoch(i)` yields `Execution`s):
  * ArrayFeed   in-memory arrays. When they fit the staging budget they are copied to the
                devices once; each execution then ships only row ids (k x B int32), and the step
                gathers rows on the device. Otherwise batches are cut on the host and prefetched.
  * BatchFeed   any iterable of (x, y[, sample_weight]) batches; each process feeds its local
                part. A background thread stacks k batches and moves them to the devices while
                the current execution runs.
Every batch keeps one shape: a short batch is padded and its padding gets weight 0.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from podkit.errors import ConfigError, InputError

# Staged arrays are replicated on every device: stage only what is small next to device memory.
DEFAULT_STAGE_BYTES = int(os.environ.get("PODKIT_STAGE_BYTES", 2 << 30))
PREFETCH_DEPTH = 2


@dataclasses.dataclass
class Execution:
    inputs: dict  # device arrays, see podkit.train.step
    steps: int
    samples: int  # real (unpadded) examples across all processes


def to_global(local: Any, sharding: NamedSharding) -> Any:
    """Assemble a global jax.Array from this process's part (its rows of the batch dim)."""
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return jax.tree.map(lambda a: jax.make_array_from_process_local_data(sharding, a), local)


def from_host_copy(value: Any, sharding: NamedSharding) -> Any:
    """Place an array that every process holds whole (same values everywhere)."""
    if jax.process_count() == 1:
        return jax.device_put(value, sharding)
    return jax.tree.map(
        lambda a: jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx]), value
    )


def check_divisible(batch: int, devices: int) -> None:
    """A process's batch must split evenly over its data-parallel devices."""
    if batch % devices:
        raise InputError(
            f"a batch of {batch} examples is not divisible by the {devices} data-parallel "
            f"devices of this process; batch to a multiple of {devices}.")


def _nbytes(tree: Any) -> int:
    return sum(np.asarray(a).nbytes for a in jax.tree.leaves(tree))


def _length(tree: Any) -> int:
    return len(jax.tree.leaves(tree)[0])


class ArrayFeed:
    """In-memory (x, y[, w]) arrays, shuffled each epoch from a seed, cut into global batches."""

    def __init__(
        self,
        x: Any,
        y: Any,
        sample_weight: np.ndarray | None,
        *,
        batch_size: int,
        steps_per_execution: int,
        shuffle: bool,
        seed: int,
        steps_per_epoch: int | None,
        batch_sharding: NamedSharding,
        data_sharding: NamedSharding,
        stage: bool | None = None,
    ) -> None:
        self.x, self.y = x, y
        self.n = _length(x)
        self.w = None if sample_weight is None else np.asarray(sample_weight, np.float32)
        self.batch_size = batch_size
        self.k = steps_per_execution
        self.shuffle, self.seed = shuffle, seed
        full = -(-self.n // batch_size)
        self.steps_per_epoch = steps_per_epoch or full
        self._step_sharding = batch_sharding  # (k, B) arrays: B on the data axes
        self._data_sharding = data_sharding
        nbytes = _nbytes((x, y))
        self.staged = (nbytes <= DEFAULT_STAGE_BYTES) if stage is None else stage
        self._data = from_host_copy((x, y), data_sharding) if self.staged else None
        self.source_s = 0.0  # seconds spent producing host inputs (see loop.input_wait)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def _step_rows(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(row ids, weights) of every global batch of this epoch, (steps, B) each; the last
        batch is padded with row 0 at weight 0. One vectorized pass per epoch."""
        order = self._order(epoch)
        B, steps = self.batch_size, self.steps_per_epoch
        need = steps * B
        if need > len(order) + B - 1:  # steps_per_epoch asks for more than the data: wrap
            order = np.tile(order, -(-need // len(order)))
        order = order[:need]
        real = len(order)
        rows = np.zeros(need, np.int32)
        rows[:real] = order
        w = np.zeros(need, np.float32)
        w[:real] = 1.0 if self.w is None else self.w[order]
        return rows.reshape(steps, B), w.reshape(steps, B)

    def epoch(self, epoch: int) -> Iterator[Execution]:
        t0 = time.perf_counter()
        rows, weights = self._step_rows(epoch)
        self.source_s += time.perf_counter() - t0
        for s in range(0, self.steps_per_epoch, self.k):
            yield self._execution(rows[s:s + self.k], weights[s:s + self.k])

    def _execution(self, idx: np.ndarray, w: np.ndarray) -> Execution:
        samples = int((w > 0).sum())
        if self.staged:
            placed = from_host_copy({"idx": idx, "w": w}, self._step_sharding)
            inputs = {"data": self._data, "idx": placed["idx"], "w": placed["w"]}
        else:
            inputs = self._host_batches(idx, w)
        return Execution(inputs, len(idx), samples)

    def _host_batches(self, idx: np.ndarray, w: np.ndarray) -> dict:
        # Each process cuts and ships only its own rows of every global batch.
        p, P = jax.process_index(), jax.process_count()
        per = idx.shape[1] // P
        local = idx[:, p * per : (p + 1) * per]
        flat = local.reshape(-1)
        x, y = jax.tree.map(
            lambda a: a[flat].reshape(local.shape + a.shape[1:]), (self.x, self.y)
        )
        return to_global({"x": x, "y": y, "w": w[:, p * per : (p + 1) * per]}, self._step_sharding)


class StagedDatasetFeed(ArrayFeed):
    """A pk.data plan that only reorders and batches in-memory arrays, fed like arrays: the
    arrays stay on the devices and each execution ships row ids. `epoch_rows(e)` gives the
    source rows of epoch e's elements in the Dataset's order (the batches an iterator over
    ds.repeat() would give)."""

    def __init__(self, x: Any, y: Any, sample_weight: Any, epoch_rows: Callable[[int], Any],
                 **kwargs: Any) -> None:
        super().__init__(x, y, sample_weight, shuffle=False, seed=0, **kwargs)
        self._epoch_rows = epoch_rows

    def _order(self, epoch: int) -> np.ndarray:
        # drop_remainder: an epoch may hold more rows than its full batches use
        return self._epoch_rows(epoch)[: self.steps_per_epoch * self.batch_size]


class BatchFeed:
    """An iterable of (x, y[, sample_weight]) batches, local to this process."""

    def __init__(
        self,
        iterable: Iterable,
        *,
        steps_per_execution: int,
        steps_per_epoch: int | None,
        batch_sharding: NamedSharding,
        check: Callable[[Any, Any], None],
        divisor: int = 1,
        with_labels: bool = True,
    ) -> None:
        if not isinstance(iterable, Iterable):
            raise InputError(
                f"x of type {type(iterable).__name__} is neither arrays nor an iterable of "
                "(x, y) batches."
            )
        if jax.process_count() > 1 and steps_per_epoch is None:
            raise ConfigError(
                "with several processes, an iterable input needs steps_per_epoch so that every "
                "process runs the same number of steps (otherwise collectives would wait "
                "forever); pass fit(..., steps_per_epoch=N)."
            )
        self.iterable = iterable
        self.k = steps_per_execution
        self.steps_per_epoch = steps_per_epoch
        self._sharding = batch_sharding
        self._check = check
        self._divisor = divisor
        self._with_labels = with_labels
        self._local_batch: int | None = None
        self._persistent: Iterator | None = None
        self._open_source: Iterator | None = None
        self.batches_seen = 0
        self.source_s = 0.0  # seconds spent waiting on the user's iterable (the pipeline)

    def _source(self) -> Iterator:
        # With steps_per_epoch the iterator carries on across epochs, as in Keras.
        if self.steps_per_epoch is None:
            self._open_source = iter(self.iterable)
        else:
            if self._persistent is None:
                self._persistent = iter(self.iterable)
            self._open_source = self._persistent
        return self._open_source

    def _normalize(self, batch: Any) -> tuple[Any, Any, np.ndarray]:
        if not self._with_labels and not isinstance(batch, tuple | list):
            batch = (batch,)
        if not isinstance(batch, tuple | list) or not 1 <= len(batch) <= 3:
            raise InputError(
                f"batch {self.batches_seen} is a {type(batch).__name__}; yield (x, y) or "
                "(x, y, sample_weight) tuples."
            )
        x = batch[0] if type(batch[0]) is np.ndarray else jax.tree.map(np.asarray, batch[0])
        y = np.asarray(batch[1]) if len(batch) > 1 and batch[1] is not None else None
        if y is None and self._with_labels:
            raise InputError(f"batch {self.batches_seen} has no labels; yield (x, y) tuples.")
        n = _length(x)
        if y is not None and len(y) != n:
            raise InputError(
                f"batch {self.batches_seen}: x has {n} examples but y has {len(y)}; they must "
                "match."
            )
        if n == 0:
            raise InputError(f"batch {self.batches_seen} is empty.")
        if self._local_batch is None:  # later batches are checked a group at a time (_stack)
            self._check(x, y)
        w = np.ones(n, np.float32) if len(batch) < 3 else np.asarray(batch[2], np.float32)
        if self._local_batch is None:
            check_divisible(n, self._divisor)
            self._local_batch = n
        elif n > self._local_batch:
            raise InputError(
                f"batch {self.batches_seen} has {n} examples, more than the first batch's "
                f"{self._local_batch}; batches may shrink at the end but not grow (one shape, "
                "one compiled step)."
            )
        if n < self._local_batch:  # pad the short tail batch; its padding weighs nothing
            pad = self._local_batch - n
            x = jax.tree.map(lambda a: np.concatenate([a, np.repeat(a[:1], pad, 0)]), x)
            if y is not None:
                y = np.concatenate([y, np.repeat(y[:1], pad, 0)])
            w = np.concatenate([w, np.zeros(pad, np.float32)])
        if y is None:
            y = np.zeros(len(w), np.float32)
        return x, y, w

    def _host_groups(self) -> Iterator[tuple[dict, int, int]]:
        source = self._source()
        limit = self.steps_per_epoch
        taken = 0
        group: list[tuple[Any, Any, np.ndarray]] = []
        while limit is None or taken < limit:
            t0 = time.perf_counter()
            try:
                batch = next(source)
            except StopIteration:
                break
            finally:
                self.source_s += time.perf_counter() - t0
            group.append(self._normalize(batch))
            self.batches_seen += 1
            taken += 1
            if len(group) == self.k:
                yield self._stack(group)
                group = []
        if group:
            yield self._stack(group)
        if taken == 0:
            raise InputError(
                "the input produced no batches"
                + (" (the iterator is exhausted: pass a re-iterable such as a list or a "
                   "Dataset, or fewer epochs x steps_per_epoch)" if self.batches_seen else "")
                + "."
            )
        if limit is not None and taken < limit:
            raise InputError(
                f"the input ran out after {taken} of steps_per_epoch={limit} batches; pass a "
                "repeating iterable or a smaller steps_per_epoch."
            )

    def _stack(self, group: list) -> tuple[dict, int, int]:
        xs = jax.tree.map(lambda *a: np.stack(a), *[g[0] for g in group])
        ys = np.stack([g[1] for g in group])
        ws = np.stack([g[2] for g in group])
        # One check for the group's k batches (shapes, label range) instead of k checks.
        self._check(jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), xs),
                    ys.reshape(-1, *ys.shape[2:]) if self._with_labels else None)
        return {"x": xs, "y": ys, "w": ws}, len(group), int((ws > 0).sum())

    def epoch(self, epoch: int) -> Iterator[Execution]:
        def place(item):
            host, steps, samples = item
            # Every process contributes its real examples; the loop sums them globally later.
            return Execution(to_global(host, self._sharding), steps, samples * jax.process_count())

        return prefetch(self._host_groups(), place, on_stop=self._close_source)

    def _close_source(self) -> None:
        """The loop stopped early (an error, Ctrl-C): end the input now, workers included,
        rather than leave the prefetch thread waiting on it."""
        source, self._open_source = self._open_source, None
        if self._persistent is source:
            self._persistent = None
        if source is not None and hasattr(source, "close"):
            source.close()


def dataset_input(ds: Any, steps_per_epoch: int | None, *, training: bool,
                  process: tuple[int, int] | None = None) -> tuple[Any, int | None]:
    """A pk.data.Dataset for BatchFeed: this process's share, and the steps of an epoch.

    Each process gets a disjoint share (podkit.data.Dataset._for_process) and every process
    runs the same number of steps: a share one batch short is topped up with a batch of
    weight 0. A finite dataset is wrapped in repeat() for training so that one iterator (and
    its worker processes) serves every epoch; each repetition reshuffles.
    """
    from jax.experimental import multihost_utils

    from podkit import data

    P, p = process or (jax.process_count(), jax.process_index())
    # Every process must draw the same random order: process 0's seeds win.
    if P > 1 and process is None and ds._shuffle_seeds():
        agreed = multihost_utils.broadcast_one_to_all(np.asarray(ds._shuffle_seeds(), np.uint32))
        ds._adopt_seeds([int(s) for s in np.asarray(agreed)])
    n = ds.cardinality()
    if n == 0:
        raise InputError("the dataset is empty (cardinality 0).")
    if n == data.INFINITE_CARDINALITY and steps_per_epoch is None:
        raise ConfigError("the dataset is endless (repeat() without a count); pass "
                          "steps_per_epoch=N so that an epoch ends.")
    local = ds._for_process(P, p)
    if steps_per_epoch is not None:
        if P > 1 and local.cardinality() != data.INFINITE_CARDINALITY:
            local = local.repeat()  # no process may run out while the others wait for it
        return local, steps_per_epoch
    if n == data.UNKNOWN_CARDINALITY:
        if P > 1:
            raise ConfigError(
                "the dataset's length is unknown (filter, interleave, unbatch, bucketing or a "
                "generator), so processes cannot agree on the steps of an epoch; pass "
                "steps_per_epoch=N.")
        return ds, None
    missing = n - local.cardinality()
    if missing > 0:
        local = local.concatenate(data.Dataset.from_sequence([_empty_batch(local)] * missing))
    return (local.repeat() if training else local), n


def _empty_batch(ds: Any) -> tuple:
    """A one-row batch like the dataset's, with sample weight 0: it changes nothing."""
    spec = ds.element_spec
    parts = list(spec) if isinstance(spec, tuple) else [spec]

    def zeros(s: Any) -> np.ndarray:
        return np.zeros((1, *s.shape[1:]), s.dtype)

    x = jax.tree.map(zeros, parts[0])
    y = jax.tree.map(zeros, parts[1]) if len(parts) > 1 else None
    return (x, y, np.zeros(1, np.float32))


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
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
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
