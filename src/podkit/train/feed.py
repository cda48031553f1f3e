"""Feeds: the one place where fit()/evaluate()/predict() arguments become device inputs.

`make_feed(x, y, ...)` takes what a Keras user passes — arrays (or lists, dicts and tuples of
them), a pk.data.Dataset, any iterable of (x, y[, sample_weight]) batches — and returns a Feed
whose `epoch(i)` yields `Execution`s for the compiled steps (podkit.train.step says their two
forms). The model never looks inside its input; the feed never looks inside the model: the
model hands it a `check(x, y)` that refuses data the model cannot take.

  * ArrayFeed    in-memory arrays. When they fit the staging budget they are copied to the
                 devices once (and kept there across calls while unchanged: `StagingCache`);
                 each execution then ships only row ids (k x B int32) and the step gathers rows
                 on the device. Otherwise batches are cut on the host and prefetched.
  * InMemoryDatasetFeed  a Dataset that only reorders and batches arrays: fed like arrays,
                 in the Dataset's own order.
  * BatchFeed    any iterable of batches, local to this process (a Dataset is first cut to
                 this process's share). A background thread stacks k batches and moves them to
                 the devices while the current execution runs.
Every batch keeps one shape: a short batch is padded and its padding is masked out.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
import xxhash
from jax.sharding import NamedSharding

from podkit import agree
from podkit.errors import ConfigError, InputError

# Staged arrays are replicated on every device: stage only what is small next to device memory.
DEFAULT_STAGE_BYTES = int(os.environ.get("PODKIT_STAGE_BYTES", 2 << 30))
PREFETCH_DEPTH = 2
REMAINDER_OPTIONS = ("pad", "drop")

Check = Callable[[Any, Any], None]


@dataclasses.dataclass
class Execution:
    inputs: dict  # device arrays, see podkit.train.step
    steps: int
    samples: int  # real (unpadded) examples across all processes
    # This process's input position after this execution's batches, when the input can say
    # (a pk.data iterator's state); array feeds need none (their order is a function of the
    # seed and the epoch).
    data_state: Any = None


@dataclasses.dataclass(frozen=True)
class ResumeAt:
    """Where a resumed fit() continues: `steps_in_epoch` steps into `epoch`, and each saving
    process's data state (None where the input needs none)."""

    epoch: int
    steps_in_epoch: int
    data_states: tuple = ()


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
        lambda a: jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx]), value)


def check_divisible(batch: int, devices: int) -> None:
    """A process's batch must split evenly over its data-parallel devices."""
    if batch % devices:
        raise InputError(
            f"a batch of {batch} examples is not divisible by the {devices} data-parallel "
            f"devices of this process; batch to a multiple of {devices}.")


def _nbytes(tree: Any) -> int:
    return sum(a.nbytes if hasattr(a, "nbytes") else np.asarray(a).nbytes
               for a in jax.tree.leaves(tree))


def _length(tree: Any) -> int:
    return len(jax.tree.leaves(tree)[0])


# -- what the user passed -------------------------------------------------------------------------
def is_arrays(x: Any) -> bool:
    """Arrays, or a dict / list / tuple of arrays (several inputs or outputs)."""
    if isinstance(x, np.ndarray | jax.Array):
        return True
    items = list(x.values()) if isinstance(x, Mapping) else x if isinstance(
        x, list | tuple) else None
    return bool(items) and all(isinstance(v, np.ndarray | jax.Array) for v in items)


def as_arrays(value: Any, what: str) -> Any:
    """Keras's conversions: a dict / list / tuple of arrays stays a structure (several inputs
    or outputs); Python lists and scalars of numbers become one numpy array."""
    if value is None or is_arrays(value):
        return _check_dtypes(value, what)
    if isinstance(value, list | tuple):
        try:
            array = np.asarray(value)
        except ValueError as e:
            raise InputError(f"{what} is a ragged Python list ({e}); give every example the "
                             "same shape, or pad it.") from None
        return _check_dtypes(array, what)
    return value


def _check_dtypes(value: Any, what: str) -> Any:
    for leaf in jax.tree.leaves(value):
        kind = np.asarray(leaf).dtype.kind if not isinstance(leaf, jax.Array) else "f"
        if kind in "OSUV":
            raise InputError(
                f"{what} holds {np.asarray(leaf).dtype} values (e.g. strings); models take "
                "numbers. Map them to ids first (e.g. np.unique(values, return_inverse=True)"
                "[1] for class labels).")
    return value


def class_weights(y: Any, class_weight: Mapping[int, float] | None) -> np.ndarray | None:
    """Per-example weights from Keras's `class_weight={class: weight}` (labels are class ids,
    or one-hot rows: their argmax)."""
    if class_weight is None:
        return None
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise ConfigError(f"class_weight={class_weight!r} must be a dict {{class id: weight}}.")
    if not is_arrays(y) or not isinstance(y, np.ndarray | jax.Array):
        raise ConfigError("class_weight needs one output with class labels; for several "
                          "outputs, pass sample weights in the data instead.")
    y = np.asarray(y)
    ids = y.argmax(axis=-1) if y.ndim > 1 and y.shape[-1] > 1 else y.reshape(len(y), -1)[:, 0]
    if not np.issubdtype(ids.dtype, np.integer):
        if not np.all(np.mod(ids, 1) == 0):
            raise InputError("class_weight needs integer class labels (or one-hot rows).")
        ids = ids.astype(np.int64)
    if any(not isinstance(k, int | np.integer) or k < 0 for k in class_weight):
        raise ConfigError(f"class_weight keys {sorted(class_weight, key=str)} must be class ids "
                          "(ints >= 0).")
    table = np.ones(max(max(class_weight) + 1, int(ids.max(initial=0)) + 1), np.float32)
    for k, v in class_weight.items():
        table[int(k)] = float(v)
    return table[ids]


def _combine(sample_weight: Any, extra: np.ndarray | None, n: int) -> np.ndarray | None:
    if sample_weight is None and extra is None:
        return None
    w = np.ones(n, np.float32) if sample_weight is None else np.asarray(sample_weight,
                                                                          np.float32)
    if w.shape != (n,):
        raise InputError(f"sample_weight has shape {w.shape}; it needs one weight per example, "
                         f"shape ({n},).")
    return w if extra is None else w * extra


# -- arrays that stay on the devices --------------------------------------------------------------
def fingerprint(tree: Any) -> tuple:
    """Identifies the contents of host arrays (a 128-bit hash at memory speed: ~10 ms for
    200 MB) and device arrays (immutable: by identity)."""
    out = []
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            out.append(("device", id(leaf)))
            continue
        a = np.ascontiguousarray(leaf)
        out.append((a.shape, a.dtype.str, xxhash.xxh3_128_hexdigest(memoryview(a).cast("B"))))
    return tuple(out)


class StagingCache:
    """Arrays a model has staged on its devices, one slot per role ("train", "validation",
    ...): a later call on the same contents reuses them instead of copying them again. A
    change in place is seen (the contents are hashed each call); a role's new data replaces its
    old copy (freed first), and the slots together stay within the staging budget (the least
    recently used go first)."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = DEFAULT_STAGE_BYTES if budget is None else budget
        self._slots: dict[str, tuple[tuple, Any, list, int]] = {}  # insertion order = LRU
        self.hits = self.misses = 0

    def stage(self, role: str, tree: Any, sharding: NamedSharding) -> Any:
        key = (jax.tree.structure(tree), fingerprint(tree), sharding)
        slot = self._slots.pop(role, None)  # freed unless it is a hit
        if slot is not None and slot[0] == key:
            self._slots[role] = slot  # most recently used now
            self.hits += 1
            return slot[1]
        del slot
        nbytes = _nbytes(tree)
        while self._slots and sum(s[3] for s in self._slots.values()) + nbytes > self.budget:
            self._slots.pop(next(iter(self._slots)))
        placed = from_host_copy(tree, sharding)
        # Device inputs are kept alive with their key: an id is only unique while it lives.
        self._slots[role] = (key, placed, [a for a in jax.tree.leaves(tree)
                                           if isinstance(a, jax.Array)], nbytes)
        self.misses += 1
        return placed

    def release(self, role: str) -> None:
        """Free a role's copy (its new data is fed from the host instead)."""
        self._slots.pop(role, None)


# -- feeds ----------------------------------------------------------------------------------------
class ArrayFeed:
    """In-memory (x, y[, w]) arrays, shuffled each epoch from a seed, cut into global batches."""

    def __init__(self, x: Any, y: Any, sample_weight: np.ndarray | None, *, batch_size: int,
                 steps_per_execution: int, shuffle: bool, seed: int,
                 steps_per_epoch: int | None, batch_sharding: NamedSharding,
                 data_sharding: NamedSharding, cache: StagingCache | None = None,
                 role: str = "train") -> None:
        self.x, self.y, self.w = x, y, sample_weight
        self.n = _length(x)
        self.batch_size = batch_size
        self.k = steps_per_execution
        self.shuffle, self.seed = shuffle, seed
        self.steps_per_epoch = steps_per_epoch or -(-self.n // batch_size)
        self._step_sharding = batch_sharding  # (k, B) arrays: B on the data axes
        self._data_sharding = data_sharding
        self._cache = cache if cache is not None else StagingCache()
        self.staged = _nbytes((x, y)) <= self._cache.budget
        if not self.staged:
            self._cache.release(role)
        self._role = role
        self._data: dict | None = None
        self._resume: ResumeAt | None = None
        self.source_s = 0.0  # seconds spent producing host inputs (see loop.input_wait)

    def first(self) -> tuple[Any, Any]:
        return jax.tree.map(lambda a: np.asarray(a[:8]), (self.x, self.y))

    def resume(self, at: ResumeAt) -> None:
        """Start `at.epoch` after its first `at.steps_in_epoch` steps: the epoch's order is a
        function of (seed, epoch), so any device or process count continues exactly."""
        self._resume = at

    def check(self, check: Check) -> None:
        check(self.x, self.y)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def _step_rows(self, epoch: int) -> np.ndarray:
        """Row ids of every global batch of this epoch, (steps, B). The last batch is padded
        with -(r + 1): masked out, but a real row r (the epoch's first rows again), so batch
        statistics see real data. One vectorized pass per epoch."""
        order = self._order(epoch).astype(np.int32)
        B, steps = self.batch_size, self.steps_per_epoch
        need = steps * B
        if need > len(order) + B - 1:  # steps_per_epoch asks for more than the data: wrap
            order = np.tile(order, -(-need // len(order)))
        real = min(need, len(order))
        rows = np.resize(order, need)  # padding repeats the epoch's first rows...
        rows[real:] = -rows[real:] - 1  # ...marked as padding
        return rows.reshape(steps, B)

    def _staged_data(self) -> dict:
        if self._data is None:
            tree = {"x": self.x, "y": self.y}
            if self.w is not None:
                tree["sw"] = self.w
            self._data = self._cache.stage(self._role, tree, self._data_sharding)
        return self._data

    def epoch(self, epoch: int) -> Iterator[Execution]:
        t0 = time.perf_counter()
        rows = self._step_rows(epoch)
        data = self._staged_data() if self.staged else None
        self.source_s += time.perf_counter() - t0
        first = 0
        if self._resume is not None and self._resume.epoch == epoch:
            first, self._resume = self._resume.steps_in_epoch, None
        for s in range(first, self.steps_per_epoch, self.k):
            idx = rows[s:s + self.k]
            samples = int((idx >= 0).sum())
            if data is not None:
                # One process: the row ids go into the step call as numpy (the jitted call
                # transfers them in its fast path, ~10x cheaper than a device_put first).
                ids = idx if jax.process_count() == 1 else from_host_copy(idx,
                                                                          self._step_sharding)
                inputs = {"data": data, "idx": ids}
            else:
                inputs = self._host_batches(idx)
            yield Execution(inputs, len(idx), samples)

    def _host_batches(self, idx: np.ndarray) -> dict:
        # Each process cuts and ships only its own rows of every global batch.
        p, P = jax.process_index(), jax.process_count()
        per = idx.shape[1] // P
        local = idx[:, p * per:(p + 1) * per]
        mask = (local >= 0).astype(np.float32)
        flat = np.where(local >= 0, local, -local - 1).reshape(-1)
        x, y = jax.tree.map(lambda a: np.asarray(a)[flat].reshape(local.shape + a.shape[1:]),
                            (self.x, self.y))
        sw = mask if self.w is None else self.w[flat].reshape(local.shape) * mask
        return to_global({"x": x, "y": y, "sw": sw, "mask": mask}, self._step_sharding)

    def close(self) -> None:
        pass


class InMemoryDatasetFeed(ArrayFeed):
    """A pk.data plan that only reorders and batches in-memory arrays, fed like arrays: the
    arrays stay on the devices and each execution ships row ids, in the Dataset's order
    (`epoch_rows(e)`: the rows of epoch e as an iterator over ds.repeat() gives them)."""

    def __init__(self, x: Any, y: Any, sample_weight: Any,
                 epoch_rows: Callable[[int], np.ndarray], **kwargs: Any) -> None:
        super().__init__(x, y, sample_weight, shuffle=False, seed=0, **kwargs)
        self._epoch_rows = epoch_rows

    def _order(self, epoch: int) -> np.ndarray:
        # drop_remainder: an epoch may hold more rows than its full batches use
        return self._epoch_rows(epoch)[: self.steps_per_epoch * self.batch_size]


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
        self._persistent: Iterator | None = None
        self._open_source: Iterator | None = None
        self._resume: ResumeAt | None = None
        self.batches_seen = 0
        self.source_s = 0.0  # seconds spent waiting on the user's iterable (the pipeline)

    def first(self) -> tuple[Any, Any]:
        x, y, _, _ = self._normalize(self._first, check=False)
        return x, (y if self._with_labels else None)

    def check(self, check: Check) -> None:
        self._check = check  # applied a group of k batches at a time (_stack)
        x, y = self.first()
        check(x, y)

    def resume(self, at: ResumeAt) -> None:
        """Continue where a checkpoint left the input: a pk.data iterator from its saved state
        (same process count), any other re-iterable by skipping the batches already taken
        (exact when the iterable gives the same batches in the same order again)."""
        states = [s for s in at.data_states if s is not None]
        if states and len(at.data_states) != jax.process_count():
            raise ConfigError(
                f"the checkpoint holds the input positions of {len(at.data_states)} processes "
                f"and this job has {jax.process_count()}: a pk.data pipeline resumes on the "
                "same process count (arrays and in-memory datasets resume on any). Resume with "
                f"{len(at.data_states)} processes.")
        self._resume = at

    def _source(self) -> tuple[Iterator, int]:
        """The iterator for this epoch, and how many of its batches were already taken."""
        # With steps_per_epoch the iterator carries on across epochs, as in Keras.
        if self.steps_per_epoch is None:
            self._open_source = iter(self.iterable)
        else:
            if self._persistent is None:
                self._persistent = iter(self.iterable)
            self._open_source = self._persistent
        at, self._resume = self._resume, None
        if at is None:
            return self._open_source, 0
        self._seek(self._open_source, at)
        return self._open_source, at.steps_in_epoch

    def _seek(self, source: Iterator, at: ResumeAt) -> None:
        state = at.data_states[jax.process_index()] if at.data_states else None
        if self.steps_per_epoch is None and at.steps_in_epoch == 0:
            return  # a new pass over the input begins: a fresh iterator is already there
        if state is not None and hasattr(source, "set_state"):
            source.set_state(state)
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
        _check_dtypes(x, f"batch {self.batches_seen}'s x")
        y = batch[1] if len(batch) > 1 else None
        if y is not None:
            y = jax.tree.map(np.asarray, y)
            _check_dtypes(y, f"batch {self.batches_seen}'s y")
        if y is None and self._with_labels:
            raise InputError(f"batch {self.batches_seen} has no labels; yield (x, y) tuples.")
        n = _length(x)
        if y is not None and _length(y) != n:
            raise InputError(f"batch {self.batches_seen}: x has {n} examples but y has "
                             f"{_length(y)}; they must match.")
        if n == 0:
            if self._template is None:
                raise InputError(f"batch {self.batches_seen} is empty.")
            return self._padding_batch()
        w = _combine(batch[2] if len(batch) > 2 else None,
                     class_weights(y, self._class_weight) if y is not None else None, n)
        w = np.ones(n, np.float32) if w is None else w
        mask = np.ones(n, np.float32)
        if not check:
            return x, y, w, mask
        if self._local_batch is None:
            check_divisible(n, self._divisor)
            self._local_batch = n
            self._template = jax.tree.map(lambda a: a[:1], (x, y))
        elif n > self._local_batch:
            raise InputError(
                f"batch {self.batches_seen} has {n} examples, more than the first batch's "
                f"{self._local_batch}; batches may shrink at the end but not grow (one shape, "
                "one compiled step).")
        if n < self._local_batch:  # pad the short tail batch with its own rows, masked out
            pad = self._local_batch - n
            cycle = np.resize(np.arange(n), pad)
            grow = lambda a: np.concatenate([a, a[cycle]])  # noqa: E731
            x = jax.tree.map(grow, x)
            y = jax.tree.map(grow, y) if y is not None else None
            w = np.concatenate([w, np.zeros(pad, np.float32)])
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
        return x, y, np.zeros(n, np.float32), np.zeros(n, np.float32)

    def _host_groups(self) -> Iterator[tuple[dict, int, int]]:
        source, taken = self._source()  # taken: batches of this epoch a resume skipped
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
                yield (*self._stack(group), _state_of(source))
                group = []
        if group:
            yield (*self._stack(group), _state_of(source))
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

    def _stack(self, group: list) -> tuple[dict, int, int]:
        stack = lambda *a: np.stack(a)  # noqa: E731
        xs = jax.tree.map(stack, *[g[0] for g in group])
        ys = jax.tree.map(stack, *[g[1] for g in group])
        sw = np.stack([g[2] for g in group])
        mask = np.stack([g[3] for g in group])
        if self._check is not None:  # one check for the group's k batches
            flat = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731
            self._check(jax.tree.map(flat, xs),
                        jax.tree.map(flat, ys) if self._with_labels else None)
        return {"x": xs, "y": ys, "sw": sw * mask, "mask": mask}, len(group), int(mask.sum())

    def epoch(self, epoch: int) -> Iterator[Execution]:
        def place(item):
            host, steps, samples, data_state = item
            # Every process contributes its real examples; the loop sums them globally later.
            return Execution(to_global(host, self._sharding), steps,
                             samples * jax.process_count(), data_state)

        return prefetch(self._host_groups(), place, on_stop=self.close)

    def close(self) -> None:
        """End the input now, workers included (the loop stopped: an error, Ctrl-C, the end),
        rather than leave a prefetch thread waiting on it."""
        source, self._open_source = self._open_source, None
        if self._persistent is source:
            self._persistent = None
        if source is not None and hasattr(source, "close"):
            source.close()


Feed = ArrayFeed | BatchFeed


# -- the factory ----------------------------------------------------------------------------------
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


def global_batch(batch_size: int | None, dp: int, remainder: str | None) -> int:
    """The global batch for arrays: Keras's default 32, divisible by the data-parallel size."""
    batch_size = 32 if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be a positive int.")
    if remainder not in (None, *REMAINDER_OPTIONS):
        raise ConfigError(f"remainder={remainder!r}; valid values: 'pad', 'drop'.")
    if batch_size % dp == 0:
        return batch_size
    lower, upper = (batch_size // dp) * dp, -(-batch_size // dp) * dp
    if remainder == "pad":
        return upper
    if remainder == "drop" and lower > 0:
        return lower
    raise InputError(
        f"global batch_size={batch_size} is not divisible by the data-parallel size {dp}; "
        f"use batch_size={upper}" + (f" or {lower}" if lower else "") + ", or pass "
        f"remainder='pad' (pad each batch with masked-out examples to {upper}) or "
        f"remainder='drop' (batches of {lower or dp}).")


def make_feed(x: Any, y: Any = None, *, strategy: Any, training: bool, with_labels: bool = True,
              batch_size: int | None = None, sample_weight: Any = None,
              class_weight: Mapping[int, float] | None = None, shuffle: bool = True,
              seed: int = 0, steps_per_epoch: int | None = None, steps_per_execution: int = 1,
              remainder: str | None = None, cache: StagingCache | None = None,
              role: str = "train") -> Feed:
    """The Feed for what the user passed (see the module docstring)."""
    from podkit import data

    if x is None:
        raise InputError("no data: pass x (arrays with y, a pk.data.Dataset, or an iterable of "
                         "(x, y) batches).")
    if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int)
                                        or steps_per_epoch < 1):
        raise ConfigError(f"steps={steps_per_epoch!r} must be a positive int.")
    batch_sharding = strategy.batch_sharding(leading=1)
    dp = strategy.data_parallel_size
    if (isinstance(x, list | tuple) and (y is not None or not with_labels) and not (
            x and all(isinstance(b, tuple) for b in x))) or is_arrays(x):
        x = as_arrays(x, "x")  # converts Python lists; checks dtypes once
    if is_arrays(x):
        y = as_arrays(y, "y")
        n = _length(x)
        if n == 0:
            raise InputError("the dataset is empty (x has 0 examples).")
        for what, tree in (("y", y), ("sample_weight", sample_weight)):
            for leaf in jax.tree.leaves(tree):
                if len(leaf) != n:
                    raise InputError(f"x has {n} examples but {what} has {len(leaf)}; they "
                                     "must match.")
        if with_labels and y is None:
            raise InputError("y is missing: pass the labels (fit(x, y)), or a Dataset / "
                             "iterable that yields (x, y) batches.")
        if y is None:
            y = np.zeros(n, np.float32)
        w = _combine(sample_weight, class_weights(y, class_weight), n)
        return ArrayFeed(x, y, w, batch_size=global_batch(batch_size, dp, remainder),
                         steps_per_execution=steps_per_execution, shuffle=shuffle and training,
                         seed=seed, steps_per_epoch=steps_per_epoch,
                         batch_sharding=batch_sharding, data_sharding=strategy.replicated(),
                         cache=cache, role=role)
    if y is not None:
        raise InputError(f"x is a {type(x).__name__} (an iterable of batches), so y must be "
                         "None: yield (x, y) tuples instead.")
    if sample_weight is not None:
        raise InputError(
            "sample_weight applies to arrays only; with a Dataset or an iterable of batches, "
            "put the weights in its elements: (x, y, sample_weight) (as Keras).")
    if batch_size is not None:
        raise InputError("batch_size does not apply to a Dataset or an iterable of batches; "
                         "batch it (ds.batch(n)).")
    if not isinstance(x, Iterable):
        raise InputError(f"x of type {type(x).__name__} is neither arrays nor an iterable of "
                         "(x, y) batches.")
    kwargs = dict(steps_per_execution=steps_per_execution, batch_sharding=batch_sharding)
    if isinstance(x, data.Dataset):
        staged = _in_memory_feed(x, with_labels, class_weight, steps_per_epoch, strategy,
                                 cache, role, steps_per_execution)
        if staged is not None:
            return staged
        x, steps_per_epoch = dataset_input(x, steps_per_epoch, training=training)
        first = x.peek()  # in this process, without using up an iteration
        if first is None:
            raise InputError("the dataset is empty (it produced no batches).")
    else:
        iterator = iter(x)
        first = next(iterator, None)
        if first is None:
            raise InputError("the input is empty (the iterable produced no batches).")
        if iterator is x:  # a one-shot iterator: put back the batch we looked at
            x = itertools.chain([first], iterator)
    local_dp = max(dp // jax.process_count(), 1)
    return BatchFeed(x, steps_per_epoch=steps_per_epoch, divisor=local_dp,
                     with_labels=with_labels, class_weight=class_weight, first=first, **kwargs)


def _in_memory_feed(ds: Any, with_labels: bool, class_weight: Any, steps_per_epoch: int | None,
                    strategy: Any, cache: StagingCache | None, role: str,
                    steps_per_execution: int) -> InMemoryDatasetFeed | None:
    """`from_tensor_slices(arrays) [.shuffle .take .skip .shard .repeat] .batch [.prefetch]`
    on one process, fed as arrays are. None for any other input."""
    if jax.process_count() > 1 or steps_per_epoch:
        return None
    plan = ds.in_memory_plan()
    if plan is None:
        return None
    parts = plan.tensors if isinstance(plan.tensors, tuple) else (plan.tensors,)
    if not 1 <= len(parts) <= 3 or (with_labels and len(parts) < 2):
        return None
    x = parts[0]
    y = parts[1] if len(parts) > 1 else np.zeros(_length(x), np.float32)
    if not is_arrays(x) or any(np.ndim(a) == 0 for a in jax.tree.leaves(y)):
        return None
    check_divisible(plan.batch_size, max(strategy.data_parallel_size, 1))
    w = _combine(parts[2] if len(parts) > 2 else None, class_weights(y, class_weight),
                 _length(x))
    return InMemoryDatasetFeed(
        _check_dtypes(x, "x"), _check_dtypes(y, "y"), w, plan.epoch_rows,
        batch_size=plan.batch_size, steps_per_execution=steps_per_execution,
        steps_per_epoch=ds.cardinality(), batch_sharding=strategy.batch_sharding(leading=1),
        data_sharding=strategy.replicated(), cache=cache, role=role)


def dataset_input(ds: Any, steps_per_epoch: int | None, *, training: bool,
                  process: tuple[int, int] | None = None) -> tuple[Any, int | None]:
    """A pk.data.Dataset for BatchFeed: this process's share, and the steps of an epoch.

    Each process gets a disjoint share (Dataset.for_process) and every process runs the same
    number of steps: a share one batch short is topped up with a masked-out batch. A finite
    dataset is wrapped in repeat() for training so that one iterator (and its worker
    processes) serves every epoch; each repetition reshuffles.
    """
    from podkit import data

    P, p = process or (jax.process_count(), jax.process_index())
    # Every process must draw the same random order: process 0's seeds win.
    if P > 1 and process is None and ds.shuffle_seeds():
        agreed = agree.process0_decides(np.asarray(ds.shuffle_seeds(), np.uint32))
        ds = ds.with_shuffle_seeds([int(s) for s in np.asarray(agreed)])
    n = ds.cardinality()
    if n == 0:
        raise InputError("the dataset is empty (cardinality 0).")
    if n == data.INFINITE_CARDINALITY and steps_per_epoch is None:
        raise ConfigError("the dataset is endless (repeat() without a count); pass "
                          "steps_per_epoch=N so that an epoch ends.")
    local = ds.for_process(P, p)
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
    """A batch of no examples, shaped like the dataset's: the feed turns it into a batch of
    padding, masked out, so a process whose share is one batch short still takes the step."""
    spec = ds.element_spec
    parts = list(spec) if isinstance(spec, tuple) else [spec]

    def zeros(s: Any) -> np.ndarray:
        return np.zeros((0, *s.shape[1:]), s.dtype)

    x = jax.tree.map(zeros, parts[0])
    y = jax.tree.map(zeros, parts[1]) if len(parts) > 1 else None
    return (x, y, np.zeros(0, np.float32))


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
