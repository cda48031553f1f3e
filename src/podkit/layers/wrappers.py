"""TimeDistributed, Keras 3's: a layer applied to every step of (batch, time, ...) inputs, one
set of weights for all steps (the steps folded into the batch: one call of the layer)."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax

from podkit.errors import ConfigError
from podkit.layers.base import ACTIVATIONS, Layer, Shape, deserialize, serialize


class TimeDistributedModule(nnx.Module):
    def __init__(self, layer: nnx.Module, activation: str | None) -> None:
        self.layer = layer
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, steps = x.shape[:2]
        out = self.layer(x.reshape(batch * steps, *x.shape[2:]))
        if self.activation is not None:
            out = ACTIVATIONS[self.activation](out)
        return out.reshape(batch, steps, *out.shape[1:])


class TimeDistributed(Layer):
    """`TimeDistributed(layer)`: `layer` on each step; its weights are the inner layer's."""

    keeps_mask = True

    def __init__(self, layer: Layer, **kwargs: Any) -> None:
        if not isinstance(layer, Layer):
            raise ConfigError(f"TimeDistributed({layer!r}) wraps a podkit layer.")
        kwargs.setdefault("name", f"time_distributed_{layer.name}")
        super().__init__(**kwargs)
        self.layer = layer

    @property
    def weight_order(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"layer.{w}" for w in self.layer.weight_order)

    def keras_weight_path(self, path: str) -> str:
        """Keras's: the wrapped layer's name, then its path ("time_distributed/dense/kernel")."""
        return f"{self.layer.name}/{self.layer.keras_weight_path(path.split('.', 1)[1])}"

    def get_config(self) -> dict:
        return {"layer": serialize(self.layer), **super().get_config()}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        config = dict(config)
        config["layer"] = deserialize(config["layer"])
        return cls(**config)

    def output_shape(self, input_shape: Shape) -> Shape:
        if len(input_shape) < 2:
            raise ConfigError(f"TimeDistributed {self.name!r} takes (batch, time, ...) inputs; "
                              f"got {(None, *input_shape)}.")
        inner = self.layer.output_shape(tuple(input_shape[1:]))
        return (input_shape[0], *inner)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return TimeDistributedModule(self.layer.build(tuple(input_shape[1:]), rngs),
                                     self.layer.activation)
