"""Layers of several inputs (the functional API): Concatenate, Add, Multiply, Subtract,
Average, Maximum, Minimum, Dot."""

from __future__ import annotations

import functools
import operator
from typing import Any

import flax.nnx as nnx
import jax.numpy as jnp
from jax import lax

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
        sizes = [s[dim] for s in shapes]
        out[dim] = None if None in sizes else sum(sizes)  # a varying length stays unknown
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


class _Elementwise(Merge):
    """Inputs of one shape combined elementwise."""

    count: int | None = None  # exactly this many inputs (Subtract: 2)

    def output_shape(self, input_shape: Any) -> Shape:
        shapes = self.shapes(input_shape)
        if self.count is not None and len(shapes) != self.count:
            raise ConfigError(f"{type(self).__name__} {self.name!r} takes exactly "
                              f"{self.count} inputs, got {len(shapes)}.")
        if len(set(shapes)) > 1:
            raise ConfigError(f"{type(self).__name__} {self.name!r}: inputs of shapes "
                              f"{[(None, *s) for s in shapes]} differ; it needs one shape.")
        return shapes[0]

    #: the binary operation folded over the inputs (Multiply, Maximum, Minimum)
    op: Any = None

    @classmethod
    def combine(cls, xs: tuple) -> Any:
        return functools.reduce(cls.op, xs)

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return Fn(lambda *xs: type(self).combine(xs))


class Multiply(_Elementwise):
    """`Multiply()([a, b, ...])`: the elementwise product."""

    op = staticmethod(operator.mul)


class Subtract(_Elementwise):
    """`Subtract()([a, b])`: a - b."""

    count = 2

    @staticmethod
    def combine(xs):
        return xs[0] - xs[1]


class Average(_Elementwise):
    """`Average()([a, b, ...])`: the elementwise mean."""

    @staticmethod
    def combine(xs):
        return sum(xs[1:], xs[0]) / len(xs)


class Maximum(_Elementwise):
    """`Maximum()([a, b, ...])`: the elementwise maximum."""

    op = staticmethod(jnp.maximum)


class Minimum(_Elementwise):
    """`Minimum()([a, b, ...])`: the elementwise minimum."""

    op = staticmethod(jnp.minimum)


class Dot(Merge):
    """`Dot(axes, normalize=False)([a, b])`: Keras's batch dot product of two inputs over
    `axes` (an int for both, or a pair; counting the batch as 0); `normalize=True` takes
    cosine similarities. (batch, n) . (batch, n) gives (batch, 1)."""

    def __init__(self, axes: Any, normalize: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        axes_ = (axes, axes) if isinstance(axes, int) else tuple(axes) \
            if isinstance(axes, list | tuple) else None
        if axes_ is None or len(axes_) != 2 or not all(
                isinstance(a, int) and not isinstance(a, bool) for a in axes_):
            raise ConfigError(f"Dot(axes={axes!r}): an int or a pair of ints.")
        if not isinstance(normalize, bool):
            raise ConfigError(f"Dot(normalize={normalize!r}) must be True or False.")
        self.axes, self.normalize = axes_, normalize

    def get_config(self) -> dict:
        return {"axes": list(self.axes), "normalize": self.normalize, **super().get_config()}

    def _dims(self, shapes: list[Shape]) -> tuple[int, int]:
        out = []
        for axis, shape in zip(self.axes, shapes, strict=True):
            rank = len(shape) + 1
            a = axis % rank
            if a == 0:
                raise ConfigError(f"Dot {self.name!r}: axes {self.axes} include the batch dim.")
            out.append(a)
        return out[0], out[1]

    def output_shape(self, input_shape: Any) -> Shape:
        shapes = self.shapes(input_shape)
        if len(shapes) != 2:
            raise ConfigError(f"Dot {self.name!r} takes exactly 2 inputs.")
        a, b = self._dims(shapes)
        if shapes[0][a - 1] != shapes[1][b - 1]:
            raise ConfigError(f"Dot {self.name!r}: dims {shapes[0][a - 1]} and "
                              f"{shapes[1][b - 1]} on axes {self.axes} differ.")
        rest = [d for i, d in enumerate(shapes[0]) if i != a - 1] + \
            [d for i, d in enumerate(shapes[1]) if i != b - 1]
        return tuple(rest) if rest else (1,)

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        a, b = self._dims(self.shapes(input_shape))
        normalize = self.normalize

        def dot(x: Any, y: Any) -> Any:
            if normalize:
                x = x / jnp.maximum(jnp.linalg.norm(x, axis=a, keepdims=True), 1e-12)
                y = y / jnp.maximum(jnp.linalg.norm(y, axis=b, keepdims=True), 1e-12)
            out = lax.dot_general(x, y, (((a,), (b,)), ((0,), (0,))))
            return out[:, None] if out.ndim == 1 else out
        return Fn(dot)
