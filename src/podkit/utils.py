"""Keras's small utilities: `to_categorical`, `set_random_seed`."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from podkit.errors import InputError


def to_categorical(y: Any, num_classes: int | None = None, dtype: Any = "float32") -> np.ndarray:
    """Class ids to one-hot rows, as `keras.utils.to_categorical`."""
    y = np.asarray(y)
    if y.size and not np.issubdtype(y.dtype, np.integer) and not np.all(np.mod(y, 1) == 0):
        raise InputError(f"to_categorical needs class ids, got values of dtype {y.dtype}.")
    ids = y.astype(np.int64)
    if ids.ndim > 1 and ids.shape[-1] == 1:
        ids = ids[..., 0]
    n = int(ids.max(initial=-1)) + 1 if num_classes is None else num_classes
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise InputError(f"to_categorical: ids range over [{ids.min()}, {ids.max()}] but "
                         f"num_classes={n}.")
    return np.eye(n, dtype=dtype)[ids]


def set_random_seed(seed: int) -> None:
    """Seed Python's and numpy's global generators, as Keras does. podkit's own randomness
    (initialization, dropout, shuffling) comes from each model's and dataset's `seed`."""
    random.seed(seed)
    np.random.seed(seed)
