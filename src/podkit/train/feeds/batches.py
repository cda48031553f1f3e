"""Any iterable of (x, y[, sample_weight]) batches as input, local to this process (a Dataset
is first cut to this process's share: datasets.py). A background thread stacks k batches and
moves them to the devices while the current execution runs (large ones are stacked there:
placement.stacked_to_global). Every batch keeps one shape: a
short batch is padded and its padding is masked out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding

from podkit.errors import ConfigError, InputError
from podkit.train.feeds.arrays import (
    check_dtypes,
    class_weights,
    combine_weights,
    length,
    times_mask,
)
from podkit.train.feeds.inputs import BatchInputs
from podkit.train.feeds.placement import check_divisible, stacked_to_global, to_global
from podkit.train.feeds.position import DataPosition
from podkit.train.feeds.prefetch import prefetch
from podkit.train.feeds.protocol import Check, Execution
from podkit.train.feeds.staging import nbytes


class BatchFeed:
    """An iterable of (x, y[, sample_weight]) batches, local to this process."""

    def __init__(self, iterable: Iterable, *, steps_per_execution: int,
                 steps_per_epoch: int | None, batch_sharding: NamedSharding, divisor: int = 1,
                 with_labels: bool = True, class_weight: Mapping | None = None,
                 first: Any = None) -> None:
        if jax.process_count() > 1 and steps_per_epoch is None:
            raise ConfigError(
                "with several processes, an iterable input needs steps_per_epoch so that every "
                "process runs the same number of steps (otherwise collectives would wait "
                "forever); pass fit(..., steps_per_epoch=N).")
        self.iterable = iterable
        self.k = steps_per_execution
        self.steps_per_epoch = steps_per_epoch
        self._sharding = batch_sharding
        self._check: Check | None = None
        self._divisor = divisor
        self._with_labels = with_labels
        self._class_weight = class_weight
        self._first = first
        self._local_batch: int | None = None
        self._template: Any = None  # one row like the first batch's, for padding batches
        self._weight_tail: tuple[int, ...] = ()  # the sample weights' dims after the batch
        self._persistent: Iterator | None = None
        self._open_source: Iterator | None = None
        # With steps_per_epoch, one read-ahead over consecutive epochs (the epoch it is at,
        # its prefetched executions with an _EPOCH_END between epochs), so that the next
        # epoch's first batches are on the devices when it begins.
        self._ahead: tuple[int, Iterator, threading.Event] | None = None
        self._more: dict[int, bool] = {}  # epoch -> whether another follows it (epoch())
        self._decided = threading.Condition()
        self._resume: DataPosition | None = None
        self.batches_seen = 0
        self.source_s = 0.0  # seconds spent waiting on the user's iterable (the pipeline)
        self._leaf_shapes: list | None = None  # the first batch's, per x and y leaf
        self._varying: set[tuple[int, int]] = set()  # (leaf, dim) that varied: bucketed

    def first(self) -> tuple[Any, Any]:
        x, y, _, _ = self._normalize(self._first, check=False)
        return x, (y if self._with_labels else None)

    @property
    def global_batch(self) -> int:
        x, _ = self.first()  # every process's batches are its share of one global batch
        return length(x) * jax.process_count()

    @property
    def batch_nbytes(self) -> int:
        return nbytes(self.first()) * jax.process_count()

    def check(self, check: Check) -> None:
        self._check = check  # applied to each batch as its group is formed (_stack)
        x, y = self.first()
        check(x, y)

    def resume(self, at: DataPosition) -> None:
        """Continue where a checkpoint left the input: a pk.data iterator from its saved state
        (same process count: DataPosition.from_checkpoint checks it), any other re-iterable by
        skipping the batches already taken (exact when the iterable gives the same batches in
        the same order again)."""
        self._resume = at

    def _source(self) -> tuple[Iterator, DataPosition | None]:
        """The iterator for this epoch, and where a resume put it (None: at the start)."""
        # With steps_per_epoch the iterator carries on across epochs, as in Keras.
        if self.steps_per_epoch is None:
            self._open_source = iter(self.iterable)
        else:
            if self._persistent is None:
                self._persistent = iter(self.iterable)
            self._open_source = self._persistent
        at, self._resume = self._resume, None
        if at is not None:
            self._seek(self._open_source, at)
        return self._open_source, at

    def _seek(self, source: Iterator, at: DataPosition) -> None:
        if self.steps_per_epoch is None and at.steps_in_epoch == 0:
            return  # a new pass over the input begins: a fresh iterator is already there
        if at.iterator is not None and hasattr(source, "set_state"):
            source.set_state(at.iterator)
            return
        # Skip what was taken: this epoch's steps, and earlier epochs' when one iterator
        # serves them all.
        skip = at.steps_in_epoch + (at.epoch * self.steps_per_epoch
                                    if self.steps_per_epoch is not None else 0)
        for _ in range(skip):
            if next(source, None) is None:
                raise InputError(f"resuming skips {skip} batches, but the input ended before "
                                 "that; resume with the same input as the saved run.")

    def _normalize(self, batch: Any, check: bool = True) -> tuple[Any, Any, np.ndarray,
                                                                  np.ndarray]:
        if not self._with_labels and not isinstance(batch, tuple):
            batch = (batch,)
        if not isinstance(batch, tuple | list) or not 1 <= len(batch) <= 3:
            raise InputError(f"batch {self.batches_seen} is a {type(batch).__name__}; yield "
                             "(x, y) or (x, y, sample_weight) tuples.")
        x = batch[0] if type(batch[0]) is np.ndarray else jax.tree.map(np.asarray, batch[0])
        check_dtypes(x, f"batch {self.batches_seen}'s x")
        y = batch[1] if len(batch) > 1 else None
        if y is not None:
            y = jax.tree.map(np.asarray, y)
            check_dtypes(y, f"batch {self.batches_seen}'s y")
        if y is None and self._with_labels:
            raise InputError(f"batch {self.batches_seen} has no labels; yield (x, y) tuples.")
        scalars = [a for a in jax.tree.leaves((x, y)) if np.ndim(a) == 0]
        if scalars:
            raise InputError(
                f"batch {self.batches_seen} holds a scalar (shape (), value {scalars[0]!r}): "
                "that is one example, not a batch. A pk.data.Dataset yields batches only "
                "after .batch(batch_size), e.g. ds.batch(32); a generator must yield "
                "batches, (x, y) with a leading batch dim.")
        n = length(x)
        if y is not None and length(y) != n:
            raise InputError(f"batch {self.batches_seen}: x has {n} examples but y has "
                             f"{length(y)}; they must match (a Dataset without "
                             ".batch(batch_size) yields single examples, not batches).")
        if n == 0:
            if self._template is None:
                raise InputError(f"batch {self.batches_seen} is empty.")
            return self._padding_batch()
        w = combine_weights(batch[2] if len(batch) > 2 else None,
                     class_weights(y, self._class_weight) if y is not None else None, n)
        w = np.ones(n, np.float32) if w is None else w
        mask = np.ones(n, np.float32)
        if not check:
            return x, y, w, mask
        if self._local_batch is None:
            check_divisible(n, self._divisor)
            self._local_batch = n
            # a copy: a view would keep the whole first batch (and the input worker's
            # shared memory it may view) alive for as long as the feed
            self._template = jax.tree.map(lambda a: a[:1].copy(), (x, y))
            self._weight_tail = w.shape[1:]  # () or (time,): per-step sample weights
        elif n > self._local_batch:
            raise InputError(
                f"batch {self.batches_seen} has {n} examples, more than the first batch's "
                f"{self._local_batch}; batches may shrink at the end but not grow (one shape, "
                "one compiled step).")
        if n < self._local_batch:  # pad the short tail batch with its own rows, masked out
            pad = self._local_batch - n
            cycle = np.resize(np.arange(n), pad)
            grow = lambda a: np.concatenate([a, a[cycle]])
            x = jax.tree.map(grow, x)
            y = jax.tree.map(grow, y) if y is not None else None
            w = np.concatenate([w, np.zeros((pad, *w.shape[1:]), np.float32)])
            mask = np.concatenate([mask, np.zeros(pad, np.float32)])
        if y is None:
            y = np.zeros(len(w), np.float32)
        return x, y, w, mask

    def _padding_batch(self) -> tuple[Any, Any, np.ndarray, np.ndarray]:
        """A whole batch of padding (an empty batch: a process's share ran one short)."""
        n = self._local_batch
        x, y = jax.tree.map(lambda a: np.repeat(a, n, 0), self._template)
        if y is None:
            y = np.zeros(n, np.float32)
        return x, y, np.zeros((n, *self._weight_tail), np.float32), np.zeros(n, np.float32)

    def _host_groups(self, epoch: int = 0
                     ) -> Iterator[tuple[BatchInputs, int, int, DataPosition]]:
        """Host batches stacked k at a time: (inputs, steps, real examples here, position)."""
        source, at = self._source()
        # Batches of this epoch taken so far (a resume skipped some), executions likewise.
        taken, execution = (at.steps_in_epoch, at.execution) if at is not None else (0, 0)
        limit = self.steps_per_epoch
        group: list[tuple[Any, Any, np.ndarray, np.ndarray]] = []
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
                execution += 1
                yield (*self._stack(group),
                       DataPosition(epoch, execution, taken, _state_of(source)))
                group = []
        if group:
            execution += 1
            yield (*self._stack(group), DataPosition(epoch, execution, taken, _state_of(source)))
        if taken == 0:
            raise InputError(
                "the input produced no batches"
                + (" (the iterator is exhausted: pass a re-iterable such as a list or a "
                   "Dataset, or fewer epochs x steps_per_epoch)" if self.batches_seen else "")
                + ".")
        if limit is not None and taken < limit:
            raise InputError(
                f"the input ran out after {taken} of steps_per_epoch={limit} batches; pass a "
                "repeating iterable or a smaller steps_per_epoch.")

    def _lengths(self, group: list) -> list:
        """The group's batches with one shape: a non-batch dim that has varied in this input
        (sequence lengths of padded_batch without padded_shapes, a generator's) is padded
        with zeros to the next power of two, so a text pipeline compiles one program per
        length bucket, a handful, not one per batch. Zeros are padding to
        Embedding(mask_zero=True) and Masking(0.0)."""
        firsts = [jax.tree.leaves((g[0], g[1])) for g in group]
        if self._leaf_shapes is None:
            self._leaf_shapes = [a.shape[1:] for a in firsts[0]]
        targets = []
        for i, base in enumerate(self._leaf_shapes):
            shapes = [b[i].shape[1:] for b in firsts]
            if any(len(s) != len(base) for s in shapes):
                raise InputError(f"batch {self.batches_seen}: an array of rank "
                                 f"{len(shapes[-1]) + 1} where earlier batches had rank "
                                 f"{len(base) + 1}; every batch needs the same structure.")
            target = []
            for d, first in enumerate(base):
                sizes = [s[d] for s in shapes]
                if any(n != first for n in sizes):
                    self._varying.add((i, d))
                target.append(_bucket(max(sizes)) if (i, d) in self._varying else first)
            targets.append(tuple(target))
        if not self._varying:
            return group
        out = []
        for g, leaves in zip(group, firsts, strict=True):
            padded = [a if a.shape[1:] == t else np.pad(
                a, [(0, 0)] + [(0, want - have) for have, want in zip(a.shape[1:], t,
                                                                       strict=True)])
                      for a, t in zip(leaves, targets, strict=True)]
            x, y = jax.tree.unflatten(jax.tree.structure((g[0], g[1])), padded)
            out.append((x, y, g[2], g[3]))
        return out

    def _stack(self, group: list) -> tuple[_HostGroup, int, int]:
        """The group's batches, each checked, with their weights and masks stacked (the
        features and labels are stacked where they go over: placement.stacked_to_global)."""
        group = self._lengths(group)
        if self._check is not None:
            for x, y, _, _ in group:
                self._check(x, y if self._with_labels else None)
        sw = np.stack([g[2] for g in group])
        mask = np.stack([g[3] for g in group])
        return (_HostGroup([(g[0], g[1]) for g in group], times_mask(sw, mask), mask), len(group),
                int(mask.sum()))

    def epoch(self, epoch: int, more: bool = False) -> Iterator[Execution]:
        if self.steps_per_epoch is None:  # a fresh pass each epoch: nothing to read ahead
            return prefetch(self._host_groups(epoch), self._place, on_stop=self.close)
        return self._epoch_ahead(epoch, more)

    def _epoch_ahead(self, epoch: int, more: bool) -> Iterator[Execution]:
        """This epoch's executions from the read-ahead, which goes on into the next epoch when
        `more` says one follows: a drained queue at each epoch end left the devices idle while
        the next epoch's first k batches were read and placed (~5-7% of a 40-step epoch of
        ResNet-50 fed from files on a TPU v5e)."""
        with self._decided:  # the read-ahead waits for this before it reads past the epoch
            self._more[epoch] = more
            self._decided.notify_all()
        if self._ahead is None or self._ahead[0] != epoch:
            self._stop_ahead()
            stop = threading.Event()
            self._ahead = (epoch, prefetch(self._epochs_from(epoch, stop), self._place_or_end,
                                           on_stop=self._close_source), stop)
        stream = self._ahead[1]
        for item in stream:
            if item is _EPOCH_END:
                self._ahead = (epoch + 1, stream, self._ahead[2])
                if not more:
                    self._stop_ahead()
                return
            yield item
        self._ahead = None  # the input ended inside the epoch (an error says so)

    def _epochs_from(self, epoch: int, stop: threading.Event) -> Iterator:
        """Epochs' host groups from `epoch` on, an _EPOCH_END after each; past an epoch's end
        only once its epoch() call said another follows (nothing is read past the fit's
        last epoch; a stop at an epoch's end leaves up to the prefetch depth read, as a stop
        inside one does)."""
        while True:
            yield from self._host_groups(epoch)
            yield _EPOCH_END
            with self._decided:
                while epoch not in self._more and not stop.is_set():
                    self._decided.wait(0.1)
                more = self._more.get(epoch, False)
            if not more or stop.is_set():
                return
            epoch += 1

    def _place_or_end(self, item: Any) -> Any:
        return item if item is _EPOCH_END else self._place(item)

    def _stop_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[2].set()  # a read-ahead waiting at an epoch's end gives up
            ahead[1].close()

    def _place(self, item: Any) -> Execution:
        host, steps, samples, position = item
        xs, ys = stacked_to_global(host.batches, self._sharding)
        sw, mask = to_global((host.sw, host.mask), self._sharding)
        # Every process contributes its real examples; the loop sums them globally later.
        return Execution(BatchInputs(xs, ys, sw, mask), steps, samples * jax.process_count(),
                         position)

    def close(self) -> None:
        """End the input now, workers included (the loop stopped: an error, Ctrl-C, the end),
        rather than leave a prefetch thread waiting on it."""
        self._stop_ahead()
        self._close_source()

    def _close_source(self) -> None:
        source, self._open_source = self._open_source, None
        if self._persistent is source:
            self._persistent = None
        if source is not None and hasattr(source, "close"):
            source.close()


_EPOCH_END = object()  # between two epochs' executions in the read-ahead


class _HostGroup(NamedTuple):
    """k batches as they came: [(x, y)] each, sample weights and mask (k, B) stacked."""

    batches: list
    sw: np.ndarray
    mask: np.ndarray


def _state_of(source: Iterator) -> Any:
    """A pk.data iterator's position (taken right after a group's batches, on the thread that
    reads them, so it is exactly the position after this execution)."""
    get = getattr(source, "get_state", None)
    if get is None:
        return None
    try:
        return get()
    except InputError:  # the pass just ended (the iterator closed itself): no position
        return None


def _bucket(n: int) -> int:
    """The length bucket of `n`: the next power of two (at least 8)."""
    return max(8, 1 << max(n - 1, 0).bit_length())
