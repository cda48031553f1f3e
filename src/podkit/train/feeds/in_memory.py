"""A pk.data.Dataset that only reorders and batches in-memory arrays, fed as arrays are."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from podkit import data
from podkit.train.feeds.arrays import (
    ArrayFeed,
    check_dtypes,
    class_weights,
    combine_weights,
    is_arrays,
    length,
)
from podkit.train.feeds.placement import check_divisible
from podkit.train.feeds.staging import StagingCache


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

    def _step_rows(self, epoch: int) -> np.ndarray:
        # An epoch is one pass of the Dataset's plan (its cardinality), whose row count
        # shuffle/skip/shard/take decide, not the arrays' length: never a continued stream.
        return self._pass_rows(epoch)


def in_memory_feed(ds: data.Dataset, with_labels: bool, class_weight: Mapping | None,
                   steps_per_epoch: int | None, strategy: Any, cache: StagingCache | None,
                   role: str, steps_per_execution: int) -> InMemoryDatasetFeed | None:
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
    y = parts[1] if len(parts) > 1 else np.zeros(length(x), np.float32)
    if not is_arrays(x) or any(np.ndim(a) == 0 for a in jax.tree.leaves(y)):
        return None
    check_divisible(plan.batch_size, max(strategy.data_parallel_size, 1))
    w = combine_weights(parts[2] if len(parts) > 2 else None, class_weights(y, class_weight),
                        length(x))
    return InMemoryDatasetFeed(
        check_dtypes(x, "x"), check_dtypes(y, "y"), w, plan.epoch_rows,
        batch_size=plan.batch_size, steps_per_execution=steps_per_execution,
        steps_per_epoch=ds.cardinality(), batch_sharding=strategy.batch_sharding(leading=1),
        data_sharding=strategy.replicated(), cache=cache, role=role)
