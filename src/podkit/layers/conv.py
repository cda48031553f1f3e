"""Image layers on NHWC inputs: Conv2D, MaxPooling2D."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx

from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape, WeightedLayer, activation_name, padding_mode, pair


def spatial(hw: tuple[int, int], window: tuple[int, int], strides: tuple[int, int],
            padding: str) -> tuple[int, int]:
    if padding == "SAME":
        return tuple(-(-d // s) for d, s in zip(hw, strides, strict=True))  # type: ignore
    out = tuple((d - k) // s + 1 for d, k, s in zip(hw, window, strides, strict=True))
    if min(out) < 1:
        raise ConfigError(
            f"a window of {window} does not fit inputs of spatial size {hw} with padding "
            "'valid'; use padding='same' or larger inputs.")
    return out  # type: ignore[return-value]


class Conv2D(WeightedLayer):
    """`Conv2D(filters, kernel_size, strides=1, padding="valid")` on NHWC inputs."""

    def __init__(self, filters: int, kernel_size: int | Sequence[int],
                 strides: int | Sequence[int] = 1, padding: str = "valid",
                 activation: str | None = None, use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, **kwargs)
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ConfigError(f"Conv2D(filters={filters!r}): filters must be a positive int.")
        self.filters = filters
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.strides = pair(strides, "strides")
        self.padding = padding_mode(padding)
        self.activation = activation_name(activation)

    def get_config(self) -> dict:
        return {"filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding.lower(),
                "activation": self.activation, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        h, w, _ = input_shape
        return (*spatial((h, w), self.kernel_size, self.strides, self.padding), self.filters)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return nnx.Conv(
            input_shape[-1], self.filters, kernel_size=self.kernel_size, strides=self.strides,
            padding=self.padding, use_bias=self.use_bias, kernel_init=self.kernel_initializer,
            bias_init=self.bias_initializer, rngs=rngs,
            kernel_metadata={"out_sharding": (None, None, "embed", "mlp")},
            bias_metadata={"out_sharding": ("mlp",)})


class MaxPooling2D(Layer):
    """`MaxPooling2D(pool_size=2, strides=None, padding="valid")` on NHWC inputs."""

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
        window, strides, padding = self.pool_size, self.strides, self.padding
        return Fn(lambda x: nnx.max_pool(x, window, strides=strides, padding=padding))
