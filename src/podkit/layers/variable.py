"""Keras's variables as podkit shows them: `layer.weights` entries that name one variable of
a built model's state and read it when used.

podkit's variables live in the model's state, whose buffers each train step replaces (and
donates: the old buffer is deleted). A bare array taken from `layer.weights` before `fit`
would be deleted after it; a `Variable` reads the state each time, so it is never stale or
deleted, and has Keras's `name`, `path`, `shape`, `dtype`, `trainable`, `value`, `numpy()`
and `assign()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np

from podkit import agree
from podkit.errors import InputError


class WeightStore(Protocol):
    """Where a built layer's variables live (the model that built it; podkit.model)."""

    model: Any  # the model whose state holds the variables
    layer: Any  # the layer they are of

    def names(self) -> list[str]: ...  # each variable's path in the layer ("kernel"), in order

    def read(self) -> list[tuple[jax.Array, bool]]: ...  # (array, trainable), Keras's order

    def write(self, arrays: Sequence[Any]) -> None: ...

    def holds(self) -> bool: ...  # whether the variables exist (the model is built)

    def changed(self) -> None: ...  # written here: the other models that hold them follow


class Variable:
    """One variable of a layer in the model that holds it (Keras's `keras.Variable`)."""

    def __init__(self, store: WeightStore, index: int, path: str, layer_name: str) -> None:
        self._source, self._index = store, index
        path = path.replace(".", "/")
        self.path = f"{layer_name}/{path}"  # Keras's "dense/kernel", "lstm/lstm_cell/kernel"
        self.name = path.rpartition("/")[2]  # Keras's "kernel"

    @property
    def value(self) -> jax.Array:
        """The variable as it is now in the model's state."""
        return self._source.read()[self._index][0]

    @property
    def trainable(self) -> bool:
        """Whether the optimizer updates it: a parameter of a layer with trainable=True."""
        return self._source.read()[self._index][1] and self._source.layer.trainable

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numpy(self) -> np.ndarray:
        """The value as a numpy array (gathered to this host, a writable copy)."""
        return np.array(agree.gather(self.value))

    def assign(self, value: Any) -> None:
        """Set the variable (same shape), in this model and every model that shares it."""
        arrays = [a for a, _ in self._source.read()]
        value = np.asarray(value)
        if tuple(value.shape) != self.shape:
            raise InputError(f"{self.path}.assign(): the variable has shape {self.shape}; "
                             f"got {tuple(value.shape)}.")
        arrays[self._index] = value
        self._source.write(arrays)
        self._source.changed()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def __jax_array__(self) -> jax.Array:
        return self.value

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"<Variable path={self.path}, shape={self.shape}, dtype={self.dtype}, "
                f"trainable={self.trainable}>")

