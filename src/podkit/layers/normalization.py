"""Normalization layers: BatchNormalization, LayerNormalization."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx

from podkit.layers.base import Layer, Shape


class BatchNormalization(Layer):
    """Normalizes over the batch while training (the global batch across devices; padding
    rows are masked out); running statistics in evaluation, and always when the layer is
    frozen (`trainable=False`), as in Keras. Keras's defaults: momentum 0.99, epsilon 1e-3."""

    weight_order = ("scale", "bias", "mean", "var")  # gamma, beta, moving mean and variance
    keeps_mask = True

    def __init__(self, momentum: float = 0.99, epsilon: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.momentum, self.epsilon = float(momentum), float(epsilon)

    def get_config(self) -> dict:
        return {"momentum": self.momentum, "epsilon": self.epsilon, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.BatchNorm(input_shape[-1], momentum=self.momentum, epsilon=self.epsilon,
                             rngs=rngs, scale_metadata={"out_sharding": ("embed",)},
                             bias_metadata={"out_sharding": ("embed",)})


class LayerNormalization(Layer):
    """Normalizes each example over its last dim. Keras's default epsilon 1e-3."""

    weight_order = ("scale", "bias")  # gamma, beta
    keeps_mask = True

    def __init__(self, epsilon: float = 1e-3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def get_config(self) -> dict:
        return {"epsilon": self.epsilon, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.LayerNorm(input_shape[-1], epsilon=self.epsilon, rngs=rngs,
                             scale_metadata={"out_sharding": ("embed",)},
                             bias_metadata={"out_sharding": ("embed",)})
