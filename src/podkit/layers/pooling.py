"""Pooling, Keras 3's, on channels-last inputs: MaxPooling1D/2D, AveragePooling1D/2D and the
global poolings. Average pooling with padding "same" divides by the values inside the input
only (as Keras). GlobalAveragePooling1D reads a timestep mask: padding steps do not count."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape, one_int, padding_mode, pair
from podkit.layers.conv import spatial


def _window(op: str, window: tuple[int, ...], strides: tuple[int, ...], padding: str) -> Fn:
    """Max or average pooling over `window` (average: of the values inside the input)."""
    if op == "max":
        return Fn(lambda x: nnx.max_pool(x, window, strides=strides, padding=padding))
    return Fn(lambda x: nnx.avg_pool(x, window, strides=strides, padding=padding,
                                     count_include_pad=False))


class _Pooling2D(Layer):
    op = "max"

    def __init__(self, pool_size: int | Sequence[int] = 2,
                 strides: int | Sequence[int] | None = None, padding: str = "valid",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool_size = pair(pool_size, "pool_size")
        self.strides = pair(strides, "strides") if strides is not None else self.pool_size
        self.padding = padding_mode(padding)

    def get_config(self) -> dict:
        return {"pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding.lower(), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        h, w, c = input_shape
        return (*spatial((h, w), self.pool_size, self.strides, self.padding), c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return _window(self.op, self.pool_size, self.strides, self.padding)


class MaxPooling2D(_Pooling2D):
    """`MaxPooling2D(pool_size=2, strides=None, padding="valid")` on NHWC inputs."""


class AveragePooling2D(_Pooling2D):
    """`AveragePooling2D(pool_size=2, strides=None, padding="valid")` on NHWC inputs."""

    op = "avg"


class _Pooling1D(Layer):
    op = "max"

    def __init__(self, pool_size: Any = 2, strides: Any = None, padding: str = "valid",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool_size = one_int(pool_size, f"{type(self).__name__}(pool_size")
        self.strides = self.pool_size if strides is None else one_int(
            strides, f"{type(self).__name__}(strides")
        self.padding = padding_mode(padding)

    def get_config(self) -> dict:
        return {"pool_size": self.pool_size, "strides": self.strides,
                "padding": self.padding.lower(), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (3,))
        steps, c = input_shape
        (out,) = spatial((steps,), (self.pool_size,), (self.strides,), self.padding)
        return (out, c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return _window(self.op, (self.pool_size,), (self.strides,), self.padding)


class MaxPooling1D(_Pooling1D):
    """`MaxPooling1D(pool_size=2, strides=None, padding="valid")` on (batch, steps, channels)."""


class AveragePooling1D(_Pooling1D):
    """`AveragePooling1D(pool_size=2, strides=None, padding="valid")`."""

    op = "avg"


class _Global(Layer):
    rank = 3
    op = "avg"

    def __init__(self, keepdims: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(keepdims, bool):
            raise ConfigError(f"{type(self).__name__}(keepdims={keepdims!r}) must be True or "
                              "False.")
        self.keepdims = keepdims

    def get_config(self) -> dict:
        return {"keepdims": self.keepdims, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (self.rank,))
        c = input_shape[-1]
        return (*(1,) * (self.rank - 2), c) if self.keepdims else (c,)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        axes, keep = tuple(range(1, self.rank - 1)), self.keepdims
        if self.op == "max":
            return Fn(lambda x: jnp.max(x, axis=axes, keepdims=keep))

        def average(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
            if mask is None:
                return jnp.mean(x, axis=axes, keepdims=keep)
            w = mask.astype(x.dtype)[..., None]  # Keras: padding steps do not count
            return jnp.sum(x * w, axis=axes, keepdims=keep) / jnp.sum(w, axis=axes,
                                                                       keepdims=keep)
        return Fn(average)


class GlobalAveragePooling1D(_Global):
    """`GlobalAveragePooling1D(keepdims=False)`: the mean over steps (masked steps left
    out)."""

    supports_masking = True


class GlobalMaxPooling1D(_Global):
    """`GlobalMaxPooling1D(keepdims=False)`: the max over steps."""

    op = "max"


class GlobalAveragePooling2D(_Global):
    """`GlobalAveragePooling2D(keepdims=False)`: the mean over height and width."""

    rank = 4


class GlobalMaxPooling2D(_Global):
    """`GlobalMaxPooling2D(keepdims=False)`: the max over height and width."""

    rank = 4
    op = "max"
