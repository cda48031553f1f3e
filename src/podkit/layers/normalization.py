"""Normalization layers: BatchNormalization, LayerNormalization."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx

from podkit.errors import ConfigError
from podkit.layers.base import Layer, Shape


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
