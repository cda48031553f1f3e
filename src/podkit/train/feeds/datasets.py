"""A pk.data.Dataset as BatchFeed's input: this process's share and the steps of an epoch."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from podkit import agree, data
from podkit.errors import ConfigError, InputError


def dataset_input(ds: data.Dataset, steps_per_epoch: int | None, *, training: bool,
                  process: tuple[int, int] | None = None) -> tuple[data.Dataset, int | None]:
    """A pk.data.Dataset for BatchFeed: this process's share, and the steps of an epoch.

    Each process gets a disjoint share (Dataset.for_process) and every process runs the same
    number of steps: a share one batch short is topped up with a masked-out batch. A finite
    dataset is wrapped in repeat() for training so that one iterator (and its worker
    processes) serves every epoch; each repetition reshuffles.
    """
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


def _empty_batch(ds: data.Dataset) -> tuple:
    """A batch of no examples, shaped like the dataset's: the feed turns it into a batch of
    padding, masked out, so a process whose share is one batch short still takes the step."""
    spec = ds.element_spec
    parts = list(spec) if isinstance(spec, tuple) else [spec]

    def zeros(s: Any) -> np.ndarray:
        return np.zeros((0, *s.shape[1:]), s.dtype)

    x = jax.tree.map(zeros, parts[0])
    y = jax.tree.map(zeros, parts[1]) if len(parts) > 1 else None
    return (x, y, np.zeros(0, np.float32))
