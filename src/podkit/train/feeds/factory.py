"""`make_feed`: what the user passed to fit()/evaluate()/predict() -> the Feed that suits it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

from podkit import data
from podkit.errors import ConfigError, InputError
from podkit.train.feeds.arrays import (
    ArrayFeed,
    as_arrays,
    class_weights,
    combine_weights,
    global_batch,
    is_arrays,
    length,
)
from podkit.train.feeds.batches import BatchFeed
from podkit.train.feeds.datasets import dataset_input
from podkit.train.feeds.in_memory import in_memory_feed
from podkit.train.feeds.protocol import Feed
from podkit.train.feeds.staging import StagingCache


def make_feed(x: Any, y: Any = None, *, strategy: Any, training: bool, with_labels: bool = True,
              batch_size: int | None = None, sample_weight: Any = None,
              class_weight: Mapping[int, float] | None = None, shuffle: bool = True,
              seed: int = 0, steps_per_epoch: int | None = None, steps_per_execution: int = 1,
              remainder: str | None = None, cache: StagingCache | None = None,
              role: str = "train") -> Feed:
    """The Feed for what the user passed (see podkit.train.feeds)."""
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
        n = length(x)
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
        w = combine_weights(sample_weight, class_weights(y, class_weight), n)
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
        staged = in_memory_feed(x, with_labels, class_weight, steps_per_epoch, strategy,
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
