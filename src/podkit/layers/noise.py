"""Regularizing noise, Keras 3's: GaussianNoise, SpatialDropout1D and SpatialDropout2D.
Active while training only (evaluation and prediction pass inputs through), drawing from the
model's dropout random stream (or the layer's own `seed`)."""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax

from podkit.errors import ConfigError
from podkit.layers.base import Layer, Shape


class NoiseModule(nnx.Module):
    """Additive Gaussian noise while training (nnx's train()/eval() set `deterministic`)."""

    def __init__(self, stddev: float, rngs: nnx.Rngs) -> None:
        self.stddev = stddev
        self.deterministic = False
        self.rngs = rngs["dropout"].fork()

    def __call__(self, x: jax.Array, deterministic: bool | None = None) -> jax.Array:
        off = self.deterministic if deterministic is None else deterministic
        if off or self.stddev == 0:
            return x
        return x + self.stddev * jax.random.normal(self.rngs(), x.shape, x.dtype)


class GaussianNoise(Layer):
    """`GaussianNoise(stddev, seed=None)`: adds N(0, stddev^2) noise while training."""

    keeps_mask = True

    def __init__(self, stddev: float, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(stddev, bool) or not isinstance(stddev, int | float) or stddev < 0:
            raise ConfigError(f"GaussianNoise(stddev={stddev!r}) must be a number >= 0.")
        self.stddev, self.seed = float(stddev), seed

    def get_config(self) -> dict:
        return {"stddev": self.stddev, "seed": self.seed, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return NoiseModule(self.stddev, rngs if self.seed is None else
                           nnx.Rngs(dropout=self.seed))


class _SpatialDropout(Layer):
    rank = 3
    keeps_mask = True

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or \
                not 0.0 <= rate < 1.0:
            raise ConfigError(f"{type(self).__name__}(rate={rate!r}): rate must be in [0, 1).")
        self.rate, self.seed = float(rate), seed

    def get_config(self) -> dict:
        return {"rate": self.rate, "seed": self.seed, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (self.rank,))
        return input_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        # Whole channels dropped: one draw per (example, channel), shared by steps / pixels.
        return nnx.Dropout(self.rate, broadcast_dims=tuple(range(1, self.rank - 1)),
                           rngs=rngs if self.seed is None else nnx.Rngs(dropout=self.seed))


class SpatialDropout1D(_SpatialDropout):
    """`SpatialDropout1D(rate)`: drops whole channels of (batch, steps, channels)."""


class SpatialDropout2D(_SpatialDropout):
    """`SpatialDropout2D(rate)`: drops whole channels of NHWC images."""

    rank = 4



