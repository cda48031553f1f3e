"""Handwritten digits: 1,797 8x8 grey images of the digits 0-9, written by 43 people.

The file is the UCI "Optical Recognition of Handwritten Digits" test set (E. Alpaydin,
C. Kaynak, 1998; CC BY 4.0), as scikit-learn ships it: 64 pixel counts in 0..16, then the label.
"""

from __future__ import annotations

import gzip
from importlib import resources

import numpy as np


def load_digits(
    normalize: bool = True, validation_fraction: float = 0.2, seed: int = 0
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x_train, y_train), (x_val, y_val)): x float32 (n, 64) in [0, 1], y int32 in 0..9.

    The split is a seeded shuffle, the same on every machine and in every process.
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(
            f"validation_fraction={validation_fraction!r} must be in [0, 1)."
        )
    with resources.files(__package__).joinpath("digits.csv.gz").open("rb") as f:
        table = np.loadtxt(gzip.open(f), delimiter=",", dtype=np.float32)
    x, y = table[:, :-1], table[:, -1].astype(np.int32)
    if normalize:
        x = x / 16.0
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_val = int(round(len(x) * validation_fraction))
    cut = len(x) - n_val
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])
