"""Activation layers, Keras 3's: ReLU, LeakyReLU, PReLU, ELU (Softmax and Activation are in
core). Each acts on every value alone, so a timestep mask passes through."""

from __future__ import annotations

import warnings
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit import initializers, regularizers
from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape


def _number(value: Any, what: str, least: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            least is not None and value < least):
        raise ConfigError(f"{what}={value!r} must be a number" +
                          (f" >= {least}." if least is not None else "."))
    return float(value)


class ReLU(Layer):
    """`ReLU(max_value=None, negative_slope=0.0, threshold=0.0)`, Keras's: x for x >=
    threshold, negative_slope * (x - threshold) below it, capped at max_value."""

    keeps_mask = True

    def __init__(self, max_value: float | None = None, negative_slope: float = 0.0,
                 threshold: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_value = None if max_value is None else _number(max_value, "max_value", 0)
        self.negative_slope = _number(negative_slope, "negative_slope", 0)
        self.threshold = _number(threshold, "threshold")

    def get_config(self) -> dict:
        return {"max_value": self.max_value, "negative_slope": self.negative_slope,
                "threshold": self.threshold, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        cap, slope, t = self.max_value, self.negative_slope, self.threshold

        def relu(x: jax.Array) -> jax.Array:
            out = jnp.where(x >= t, x, slope * (x - t))
            return out if cap is None else jnp.minimum(out, cap)
        return Fn(relu)


class LeakyReLU(Layer):
    """`LeakyReLU(negative_slope=0.3)` (Keras 3's default slope)."""

    keeps_mask = True

    def __init__(self, negative_slope: float = 0.3, **kwargs: Any) -> None:
        if "alpha" in kwargs:  # Keras 3 still takes Keras 2's name, with a warning
            warnings.warn("LeakyReLU(alpha=...) is deprecated (as in Keras 3): use "
                          "negative_slope=.", DeprecationWarning, stacklevel=2)
            negative_slope = kwargs.pop("alpha")
        super().__init__(**kwargs)
        self.negative_slope = _number(negative_slope, "negative_slope", 0)

    def get_config(self) -> dict:
        return {"negative_slope": self.negative_slope, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        slope = self.negative_slope
        return Fn(lambda x: jnp.where(x >= 0, x, slope * x))


class ELU(Layer):
    """`ELU(alpha=1.0)`: x for x > 0, alpha * (exp(x) - 1) below."""

    keeps_mask = True

    def __init__(self, alpha: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alpha = _number(alpha, "alpha")

    def get_config(self) -> dict:
        return {"alpha": self.alpha, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        alpha = self.alpha
        return Fn(lambda x: jnp.where(x > 0, x, alpha * jnp.expm1(x)))


class PReLUModule(nnx.Module):
    def __init__(self, alpha: jax.Array) -> None:
        self.alpha = nnx.Param(alpha)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.where(x >= 0, x, self.alpha[...] * x)


class PReLU(Layer):
    """`PReLU(alpha_initializer="zeros", shared_axes=None)`: a learned slope below 0 per
    value (weight `alpha` of the input's shape, size 1 on `shared_axes`, counted from 1)."""

    keeps_mask = True
    weight_order = ("alpha",)
    initializer_keys = ("alpha_initializer",)
    regularizer_keys = ("alpha_regularizer",)

    def __init__(self, alpha_initializer: Any = "zeros", alpha_regularizer: Any = None,
                 shared_axes: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alpha_initializer = initializers.get(alpha_initializer)
        self.alpha_regularizer = regularizers.get(alpha_regularizer)
        if self.alpha_regularizer is not None:
            self.regularized = (("alpha", self.alpha_regularizer),)
        axes = () if shared_axes is None else (
            (shared_axes,) if isinstance(shared_axes, int) else tuple(shared_axes))
        if not all(isinstance(a, int) and not isinstance(a, bool) and a >= 1 for a in axes):
            raise ConfigError(f"PReLU(shared_axes={shared_axes!r}): ints >= 1 (axis 0 is the "
                              "batch).")
        self.shared_axes = axes

    def get_config(self) -> dict:
        return {"alpha_initializer": initializers.serialize(self.alpha_initializer),
                "alpha_regularizer": regularizers.serialize(self.alpha_regularizer),
                "shared_axes": list(self.shared_axes) or None, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        if any(a > len(input_shape) for a in self.shared_axes):
            raise ConfigError(f"PReLU {self.name!r}: shared_axes {self.shared_axes} beyond "
                              f"inputs of shape {(None, *input_shape)}.")
        shape = tuple(1 if i + 1 in self.shared_axes else d for i, d in enumerate(input_shape))
        return PReLUModule(self.alpha_initializer(rngs.params(), shape, jnp.float32))
