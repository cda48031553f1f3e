"""Layers of several inputs (the functional API): Concatenate, Add."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape


class Merge(Layer):
    inputs = "many"

    def shapes(self, input_shape: Any) -> list[Shape]:
        if not isinstance(input_shape, list) or len(input_shape) < 2:
            raise ConfigError(f"{type(self).__name__} layer {self.name!r} takes a list of at "
                              "least two inputs.")
        return [tuple(s) for s in input_shape]


class Concatenate(Merge):
    """`Concatenate(axis=-1)([a, b])`: joins inputs along one axis (batch excluded)."""

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(axis, int) or axis == 0:
            raise ConfigError(f"Concatenate(axis={axis!r}): an int other than 0 (the batch).")
        self.axis = axis

    def get_config(self) -> dict:
        return {"axis": self.axis, **super().get_config()}

    def _dim(self, rank: int) -> int:
        dim = self.axis - 1 if self.axis > 0 else rank + self.axis
        if not 0 <= dim < rank:
            raise ConfigError(f"Concatenate {self.name!r}: axis {self.axis} is outside inputs "
                              f"of rank {rank + 1} (batch included).")
        return dim

    def output_shape(self, input_shape: Any) -> Shape:
        shapes = self.shapes(input_shape)
        dim = self._dim(len(shapes[0]))
        rest = {s[:dim] + s[dim + 1:] for s in shapes}
        if len({len(s) for s in shapes}) > 1 or len(rest) > 1:
            raise ConfigError(f"Concatenate {self.name!r} on axis {self.axis}: inputs of shapes "
                              f"{[(None, *s) for s in shapes]} differ outside that axis.")
        out = list(shapes[0])
        out[dim] = sum(s[dim] for s in shapes)
        return tuple(out)

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        axis = self.axis  # counts the batch dim, as in Keras
        return Fn(lambda *xs: jnp.concatenate(xs, axis=axis))


class Add(Merge):
    """`Add()([a, b, ...])`: the elementwise sum of inputs of one shape."""

    def output_shape(self, input_shape: Any) -> Shape:
        shapes = self.shapes(input_shape)
        if len(set(shapes)) > 1:
            raise ConfigError(f"Add {self.name!r}: inputs of shapes "
                              f"{[(None, *s) for s in shapes]} differ; Add needs one shape.")
        return shapes[0]

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return Fn(lambda *xs: sum(xs[1:], xs[0]))
