"""Reshaping layers, Keras 3's: UpSampling2D, ZeroPadding2D, Cropping2D, Permute,
RepeatVector (Flatten and Reshape are in core)."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape, pair


def _pairs(value: Any, what: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Keras's 2D padding / cropping: an int, (rows, cols), or ((top, bottom), (left,
    right)); non-negative."""
    if isinstance(value, int) and not isinstance(value, bool):
        out = ((value, value), (value, value))
    elif isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        out = ((value[0], value[0]), (value[1], value[1]))
    elif isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, list | tuple) and len(v) == 2 for v in value):
        out = (tuple(value[0]), tuple(value[1]))
    else:
        raise ConfigError(f"{what}={value!r}: an int, (rows, cols), or ((top, bottom), "
                          "(left, right)).")
    if any(not isinstance(v, int) or v < 0 for side in out for v in side):
        raise ConfigError(f"{what}={value!r}: amounts must be ints >= 0.")
    return out  # type: ignore[return-value]


class UpSampling2D(Layer):
    """`UpSampling2D(size=2, interpolation="nearest")`: rows and columns repeated (nearest) or
    interpolated ("bilinear"), on NHWC inputs."""

    def __init__(self, size: Any = 2, interpolation: str = "nearest", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = pair(size, "size")
        if interpolation not in ("nearest", "bilinear"):
            raise ConfigError(f"UpSampling2D(interpolation={interpolation!r}); valid values: "
                              "'nearest', 'bilinear'.")
        self.interpolation = interpolation

    def get_config(self) -> dict:
        return {"size": list(self.size), "interpolation": self.interpolation,
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        h, w, c = input_shape
        return (h * self.size[0], w * self.size[1], c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        (sh, sw), out = self.size, self.output_shape(input_shape)
        if self.interpolation == "nearest":
            return Fn(lambda x: jnp.repeat(jnp.repeat(x, sh, axis=1), sw, axis=2))
        return Fn(lambda x: jax.image.resize(x, (x.shape[0], *out), method="bilinear",
                                             antialias=False))


class ZeroPadding2D(Layer):
    """`ZeroPadding2D(padding=1)`: zero rows and columns around NHWC images."""

    def __init__(self, padding: Any = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.padding = _pairs(padding, "ZeroPadding2D(padding")

    def get_config(self) -> dict:
        return {"padding": [list(p) for p in self.padding], **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        (t, b), (left, r) = self.padding
        h, w, c = input_shape
        return (h + t + b, w + left + r, c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        rows, cols = self.padding
        return Fn(lambda x: jnp.pad(x, ((0, 0), rows, cols, (0, 0))))


class Cropping2D(Layer):
    """`Cropping2D(cropping=((0, 0), (0, 0)))`: rows and columns cut from NHWC images."""

    def __init__(self, cropping: Any = ((0, 0), (0, 0)), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cropping = _pairs(cropping, "Cropping2D(cropping")

    def get_config(self) -> dict:
        return {"cropping": [list(p) for p in self.cropping], **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        (t, b), (left, r) = self.cropping
        h, w, c = input_shape
        if h - t - b < 1 or w - left - r < 1:
            raise ConfigError(f"Cropping2D {self.name!r}: cropping {self.cropping} leaves "
                              f"nothing of images {h}x{w}.")
        return (h - t - b, w - left - r, c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        h, w, _ = self.output_shape(input_shape)
        (t, _), (left, _) = self.cropping
        return Fn(lambda x: x[:, t:t + h, left:left + w, :])


class Permute(Layer):
    """`Permute(dims)`: the non-batch dims reordered; `dims` counts from 1 (as Keras)."""

    def __init__(self, dims: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        dims = tuple(dims) if isinstance(dims, list | tuple) else None
        if dims is None or sorted(dims) != list(range(1, len(dims) + 1)):
            raise ConfigError(f"Permute(dims={dims!r}): a permutation of 1..rank-1 (the "
                              "batch dim is 0 and stays first).")
        self.dims = dims

    def get_config(self) -> dict:
        return {"dims": list(self.dims), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) != len(self.dims):
            raise ConfigError(f"Permute {self.name!r} reorders {len(self.dims)} dims; inputs "
                              f"of shape {(None, *input_shape)} have {len(input_shape)}.")
        return tuple(input_shape[d - 1] for d in self.dims)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        order = (0, *self.dims)
        return Fn(lambda x: jnp.transpose(x, order))


class RepeatVector(Layer):
    """`RepeatVector(n)`: (batch, features) -> (batch, n, features)."""

    def __init__(self, n: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"RepeatVector(n={n!r}) must be a positive int.")
        self.n = n

    def get_config(self) -> dict:
        return {"n": self.n, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (2,))
        return (self.n, input_shape[0])

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        n = self.n
        return Fn(lambda x: jnp.repeat(x[:, None, :], n, axis=1))
