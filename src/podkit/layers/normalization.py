"""Normalization layers: BatchNormalization, LayerNormalization, GroupNormalization."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit import initializers, regularizers
from podkit.errors import ConfigError
from podkit.layers.base import Layer, Shape, flag


def _epsilon(owner: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{owner}(epsilon={value!r}) must be a number > 0.")
    return float(value)


class BatchNormalization(Layer):
    """Normalizes over the batch while training (the global batch across devices; padding
    rows are masked out); running statistics in evaluation, and always when the layer is
    frozen (`trainable=False`), as in Keras. Keras's defaults: momentum 0.99, epsilon 1e-3."""

    weight_order = ("scale", "bias", "mean", "var")  # gamma, beta, moving mean and variance
    keras_names = {"scale": "gamma", "bias": "beta", "mean": "moving_mean",
                   "var": "moving_variance"}
    keeps_mask = True

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(momentum, bool) or not isinstance(momentum, int | float) or \
                not 0.0 <= momentum < 1.0:
            raise ConfigError(f"BatchNormalization(momentum={momentum!r}) must be in [0, 1) "
                              "(the share of the running statistics kept each step; Keras's "
                              "default 0.99).")
        self.momentum, self.epsilon = float(momentum), _epsilon("BatchNormalization", epsilon)

    def get_config(self) -> dict:
        return {"momentum": self.momentum, "epsilon": self.epsilon, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.BatchNorm(input_shape[-1], momentum=self.momentum, epsilon=self.epsilon,
                             rngs=rngs, scale_metadata={"out_sharding": ("embed",)},
                             bias_metadata={"out_sharding": ("embed",)})


class LayerNormalization(Layer):
    """Normalizes each example over its last dim. Keras's default epsilon 1e-3."""

    weight_order = ("scale", "bias")  # gamma, beta
    keras_names = {"scale": "gamma", "bias": "beta"}
    keeps_mask = True

    def __init__(self, epsilon: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epsilon = _epsilon("LayerNormalization", epsilon)

    def get_config(self) -> dict:
        return {"epsilon": self.epsilon, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.LayerNorm(input_shape[-1], epsilon=self.epsilon, rngs=rngs,
                             scale_metadata={"out_sharding": ("embed",)},
                             bias_metadata={"out_sharding": ("embed",)})


class GroupNormModule(nnx.Module):
    """Keras's GroupNormalization computation, op for op: the axis split into (groups,
    channels per group), the moments over every axis but the batch and the group,
    `x * inv + (beta - mean * inv)` with `inv = gamma / sqrt(var + epsilon)`."""

    def __init__(self, channels: int, groups: int, axis: int, epsilon: float,
                 gamma: Any, beta: Any, rngs: nnx.Rngs) -> None:
        self.groups, self.axis, self.epsilon = groups, axis, epsilon
        if gamma is not None:
            self.gamma = nnx.Param(gamma(rngs.params(), (channels,), jnp.float32),
                                   out_sharding=("embed",))
        if beta is not None:
            self.beta = nnx.Param(beta(rngs.params(), (channels,), jnp.float32),
                                  out_sharding=("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        axis = self.axis % x.ndim
        shape = list(x.shape)
        grouped = shape[:axis] + [self.groups, shape[axis] // self.groups] + shape[axis + 1:]
        h = x.reshape(grouped)
        reduce = tuple(a for a in range(1, h.ndim) if a != axis)
        mean = jnp.mean(h, axis=reduce, keepdims=True)
        variance = jnp.var(h, axis=reduce, keepdims=True)
        inv = jax.lax.rsqrt(variance + self.epsilon)
        broadcast = [1] * h.ndim
        broadcast[axis], broadcast[axis + 1] = self.groups, shape[axis] // self.groups
        if hasattr(self, "gamma"):
            inv = inv * self.gamma[...].reshape(broadcast)
        res = -mean * inv
        if hasattr(self, "beta"):
            res = res + self.beta[...].reshape(broadcast)
        return (h * inv + res).reshape(shape)


class GroupNormalization(Layer):
    """`GroupNormalization(groups=32, axis=-1, epsilon=1e-3, center=True, scale=True,
    beta_initializer="zeros", gamma_initializer="ones", beta_regularizer=None,
    gamma_regularizer=None)`: each example's channels (`axis`) in `groups` groups, each
    group normalized over its channels and every other non-batch axis (Keras 3's; -1 groups:
    one per channel, instance normalization). Weights gamma, beta (Keras's order)."""

    initializer_keys = ("beta_initializer", "gamma_initializer")
    regularizer_keys = ("beta_regularizer", "gamma_regularizer")

    weight_order = ("gamma", "beta")
    keeps_mask = True

    def __init__(self, groups: int = 32, axis: int = -1, epsilon: float = 1e-3,
                 center: bool = True, scale: bool = True, beta_initializer: Any = "zeros",
                 gamma_initializer: Any = "ones", beta_regularizer: Any = None,
                 gamma_regularizer: Any = None, beta_constraint: Any = None,
                 gamma_constraint: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = "GroupNormalization"
        if isinstance(groups, bool) or not isinstance(groups, int) or (groups < 1 and
                                                                      groups != -1):
            raise ConfigError(f"{owner}(groups={groups!r}): a positive int dividing the "
                              "channels, or -1 for one group per channel.")
        if isinstance(axis, bool) or not isinstance(axis, int) or axis == 0:
            raise ConfigError(f"{owner}(axis={axis!r}): the channels' axis, an int other "
                              "than 0 (the batch); -1 for channels-last.")
        for what, value in (("beta_constraint", beta_constraint),
                            ("gamma_constraint", gamma_constraint)):
            if value is not None:
                raise ConfigError(f"{owner}({what}={value!r}): podkit has no weight "
                                  "constraints; leave it out (a regularizer, "
                                  f"{what.split('_')[0]}_regularizer=, penalizes instead).")
        self.groups, self.axis = groups, axis
        self.epsilon = _epsilon(owner, epsilon)
        self.center, self.scale = flag(owner, "center", center), flag(owner, "scale", scale)
        self.beta_initializer = initializers.get(beta_initializer)
        self.gamma_initializer = initializers.get(gamma_initializer)
        self.beta_regularizer = regularizers.get(beta_regularizer)
        self.gamma_regularizer = regularizers.get(gamma_regularizer)
        self.regularized = tuple((attr, r) for attr, r, on in (
            ("gamma", self.gamma_regularizer, scale), ("beta", self.beta_regularizer, center))
            if r is not None and on)

    def get_config(self) -> dict:
        return {"groups": self.groups, "axis": self.axis, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale,
                "beta_initializer": initializers.serialize(self.beta_initializer),
                "gamma_initializer": initializers.serialize(self.gamma_initializer),
                "beta_regularizer": regularizers.serialize(self.beta_regularizer),
                "gamma_regularizer": regularizers.serialize(self.gamma_regularizer),
                "beta_constraint": None, "gamma_constraint": None,
                **super().get_config()}

    def _channels(self, input_shape: Shape) -> tuple[int, int]:
        """(channels, groups) for inputs of `input_shape` (batch excluded), checked."""
        rank = len(input_shape) + 1
        if not -rank <= self.axis < rank:
            raise ConfigError(f"GroupNormalization {self.name!r}: axis {self.axis} is out of "
                              f"range for inputs of shape {(None, *input_shape)}.")
        channels = input_shape[self.axis % rank - 1]
        if channels is None:
            raise ConfigError(f"GroupNormalization {self.name!r}: axis {self.axis} of inputs "
                              f"{(None, *input_shape)} must have a fixed size.")
        groups = channels if self.groups == -1 else self.groups
        if groups > channels or channels % groups:
            raise ConfigError(f"GroupNormalization {self.name!r}: groups={groups} must divide "
                              f"the {channels} channels of axis {self.axis}.")
        return channels, groups

    def output_shape(self, input_shape: Shape) -> Shape:
        self._channels(input_shape)
        return input_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        channels, groups = self._channels(input_shape)
        return GroupNormModule(channels, groups, self.axis % (len(input_shape) + 1),
                               self.epsilon, self.gamma_initializer if self.scale else None,
                               self.beta_initializer if self.center else None, rngs)
