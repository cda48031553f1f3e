"""In-memory arrays as input: Keras's conversions and checks of what the user passed, class
weights, and `ArrayFeed`.

When the arrays fit the staging budget they are copied to the devices once (and kept there
across calls while unchanged: `StagingCache`); each execution then ships only row ids (k x B
int32) and the step gathers rows on the device. Otherwise batches are cut on the host.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from podkit.errors import ConfigError, InputError
from podkit.train.feeds.inputs import BatchInputs, StagedInputs
from podkit.train.feeds.placement import from_host_copy, to_global
from podkit.train.feeds.position import DataPosition
from podkit.train.feeds.protocol import Check, Execution
from podkit.train.feeds.staging import StagingCache, nbytes

REMAINDER_OPTIONS = ("pad", "drop")


def length(tree: Any) -> int:
    """The examples in a pytree of arrays (the leading dim of its first leaf)."""
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
        return check_dtypes(value, what)
    if isinstance(value, list | tuple):
        try:
            array = np.asarray(value)
        except ValueError as e:
            raise InputError(f"{what} is a ragged Python list ({e}); give every example the "
                             "same shape, or pad it.") from None
        return check_dtypes(array, what)
    return value


def check_dtypes(value: Any, what: str) -> Any:
    """`value` itself, once no leaf holds strings or objects (models take numbers)."""
    for leaf in jax.tree.leaves(value):
        dtype = np.asarray(leaf).dtype if not isinstance(leaf, jax.Array) else None
        # ml_dtypes' bfloat16 / float8 are kind "V" to numpy but numbers to JAX
        if dtype is not None and (dtype.kind in "OSU" or dtype.kind == "V"
                                  and not jax.numpy.issubdtype(dtype, jax.numpy.number)):
            raise InputError(
                f"{what} holds {np.asarray(leaf).dtype} values (e.g. strings); models take "
                "numbers. Map them to ids first: text with pk.layers.TextVectorization "
                "(adapt it, then ds.map(lambda x, y: (vectorize(x), y))), class labels with "
                "np.unique(values, return_inverse=True)[1].")
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


def combine_weights(sample_weight: Any, extra: np.ndarray | None, n: int) -> np.ndarray | None:
    """sample_weight x class weights, float32 (None when neither is given): one per example
    (n,), or one per timestep (n, T) as Keras takes them for per-step labels."""
    if sample_weight is None and extra is None:
        return None
    w = np.ones(n, np.float32) if sample_weight is None else np.asarray(sample_weight,
                                                                          np.float32)
    if w.ndim == 2 and w.shape[1] == 1:  # Keras's (n, 1): one per example
        w = w[:, 0]
    if w.ndim not in (1, 2) or w.shape[0] != n:
        raise InputError(f"sample_weight has shape {w.shape}; it needs one weight per example, "
                         f"shape ({n},), or one per timestep of per-step labels, ({n}, time).")
    if extra is None:
        return w
    return w * extra.reshape(n, *(1,) * (w.ndim - 1))


def times_mask(sw: Any, mask: Any) -> Any:
    """Sample weights (..., B) or per-step (..., B, T) times the padding mask (..., B)."""
    return sw * mask.reshape(mask.shape + (1,) * (sw.ndim - mask.ndim))


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


# -- the feed -------------------------------------------------------------------------------------
class ArrayFeed:
    """In-memory (x, y[, w]) arrays, shuffled each epoch from a seed, cut into global batches."""

    def __init__(self, x: Any, y: Any, sample_weight: np.ndarray | None, *, batch_size: int,
                 steps_per_execution: int, shuffle: bool, seed: int,
                 steps_per_epoch: int | None, batch_sharding: NamedSharding,
                 data_sharding: NamedSharding, cache: StagingCache | None = None,
                 role: str = "train") -> None:
        self.x, self.y, self.w = x, y, sample_weight
        self.n = length(x)
        self.batch_size = batch_size
        self.k = steps_per_execution
        self.shuffle, self.seed = shuffle, seed
        self.steps_per_epoch = steps_per_epoch or -(-self.n // batch_size)
        self._step_sharding = batch_sharding  # (k, B) arrays: B on the data axes
        self._data_sharding = data_sharding
        self._cache = cache if cache is not None else StagingCache()
        self.staged = nbytes((x, y)) <= self._cache.budget
        if not self.staged:
            self._cache.release(role)
        self._role = role
        self._data: dict | None = None
        self._resume: DataPosition | None = None
        self._rows_ahead: dict[int, np.ndarray] = {}  # the next epoch's rows, made early
        self.source_s = 0.0  # seconds spent producing host inputs (see loop.input_wait)

    def first(self) -> tuple[Any, Any]:
        return jax.tree.map(lambda a: np.asarray(a[:8]), (self.x, self.y))

    @property
    def global_batch(self) -> int:
        return self.batch_size

    @property
    def batch_nbytes(self) -> int:
        return 0 if self.staged else nbytes((self.x, self.y)) * self.batch_size // self.n

    def resume(self, at: DataPosition) -> None:
        """Start `at.epoch` after its first `at.steps_in_epoch` steps: the epoch's order is a
        function of (seed, epoch), so any device or process count continues exactly."""
        self._resume = at

    def check(self, check: Check) -> None:
        check(self.x, self.y)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def _pass_rows(self, p: int) -> np.ndarray:
        """Row ids of every global batch of pass `p` over the data, (ceil(n / B), B). The
        last batch is padded with -(r + 1): masked out, but a real row r (the pass's first
        rows again), so batch statistics see real data. One vectorized pass."""
        order = self._order(p).astype(np.int32)
        B = self.batch_size
        steps = -(-len(order) // B)
        rows = np.resize(order, steps * B)  # padding repeats the pass's first rows...
        rows[len(order):] = -rows[len(order):] - 1  # ...marked as padding
        return rows.reshape(steps, B)

    def _step_rows(self, epoch: int) -> np.ndarray:
        """Row ids of this epoch's global batches, (steps_per_epoch, B). The data is one
        stream: an epoch of `steps_per_epoch` steps continues where the last one ended, and
        a pass that runs out is followed by the next, shuffled anew (Keras 3 continues its
        iterator across epochs when steps_per_epoch is given; it ends the epoch early where
        the data runs out, podkit goes on into the next pass). Without steps_per_epoch an
        epoch is one pass."""
        per_pass = -(-self.n // self.batch_size)
        steps = self.steps_per_epoch
        if steps == per_pass:
            return self._pass_rows(epoch)
        stream = epoch * steps + np.arange(steps)  # global step numbers of this epoch
        passes = stream // per_pass
        out = np.empty((steps, self.batch_size), np.int32)
        for p in np.unique(passes):
            here = passes == p
            out[here] = self._pass_rows(int(p))[stream[here] % per_pass]
        return out

    def _staged_data(self) -> dict:
        if self._data is None:
            tree = {"x": self.x, "y": self.y}
            if self.w is not None:
                tree["sw"] = self.w
            self._data = self._cache.stage(self._role, tree, self._data_sharding,
                                           rows=self.batch_size)
        return self._data

    def epoch(self, epoch: int, more: bool = False) -> Iterator[Execution]:
        t0 = time.perf_counter()
        rows = self._rows_ahead.pop(epoch, None)
        if rows is None:
            rows = self._step_rows(epoch)
        self._rows_ahead.clear()
        data = self._staged_data() if self.staged else None
        self.source_s += time.perf_counter() - t0
        first, execution = 0, 0
        if self._resume is not None and self._resume.epoch == epoch:
            at, self._resume = self._resume, None
            first, execution = at.steps_in_epoch, at.execution
        # Per step, once per epoch (not a numpy reduction per execution: with one step per
        # execution the loop's per-execution work is a share of a small model's step).
        real_rows = np.cumsum((rows >= 0).sum(axis=1)).tolist()
        one_process = jax.process_count() == 1
        for s in range(first, self.steps_per_epoch, self.k):
            idx = rows[s:s + self.k]
            real = len(idx)
            samples = real_rows[s + real - 1] - (real_rows[s - 1] if s else 0)
            if real < self.k and self._role != "train":
                # Evaluation and prediction: the short last execution runs k steps, the
                # extra ones wholly masked (row 0, marked as padding), so one program serves
                # the whole pass instead of a second compile. (A train step would still
                # update on a masked batch: training compiles the short one.)
                idx = np.concatenate([idx, np.full((self.k - real, idx.shape[1]), -1,
                                                   idx.dtype)])
            if data is not None:
                # One process: the row ids go into the step call as numpy (the jitted call
                # transfers them in its fast path, ~10x cheaper than a device_put first).
                ids = idx if one_process else from_host_copy(idx, self._step_sharding)
                inputs = StagedInputs(data, ids)
            else:
                inputs = self._host_batches(idx)
            execution += 1
            yield Execution(inputs, real, samples, DataPosition(epoch, execution, s + real))
        if self._role == "train":
            # The next epoch's order, while the devices still run this epoch's last steps: at
            # the epoch's end the loop drains them, and the devices then wait on whatever
            # the host does before the next dispatch.
            self._rows_ahead[epoch + 1] = self._step_rows(epoch + 1)

    def _host_batches(self, idx: np.ndarray) -> BatchInputs:
        # Each process cuts and ships only its own rows of every global batch.
        p, P = jax.process_index(), jax.process_count()
        per = idx.shape[1] // P
        local = idx[:, p * per:(p + 1) * per]
        mask = (local >= 0).astype(np.float32)
        flat = np.where(local >= 0, local, -local - 1).reshape(-1)
        x, y = jax.tree.map(lambda a: np.asarray(a)[flat].reshape(local.shape + a.shape[1:]),
                            (self.x, self.y))
        sw = mask if self.w is None else times_mask(
            self.w[flat].reshape(local.shape + self.w.shape[1:]), mask)
        return to_global(BatchInputs(x, y, sw, mask), self._step_sharding)

    def close(self) -> None:
        pass
