"""Preprocessing layers, Keras 3's: Normalization (with `adapt`) and CategoryEncoding.

    norm = pk.layers.Normalization()
    norm.adapt(x_train)                 # the mean and variance of each feature
    model = pk.Sequential([norm, pk.layers.Dense(10)])

Normalization's statistics are non-trainable variables (`mean`, `variance`, `count`, as Keras
keeps them), so they are saved and checkpointed with the model and its optimizer never moves
them; `adapt` reads arrays or a pk.data.Dataset before the model is built.
"""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape

EPSILON = 1e-7  # Keras's backend.epsilon(): the floor of the standard deviation


class Statistic(nnx.BatchStat):
    """A non-trainable variable of a preprocessing layer (in the state's `rest`)."""


class NormalizationModule(nnx.Module):
    def __init__(self, mean: np.ndarray, variance: np.ndarray, count: float,
                 invert: bool) -> None:
        self.mean = Statistic(jnp.asarray(mean, jnp.float32))
        self.variance = Statistic(jnp.asarray(variance, jnp.float32))
        self.count = Statistic(jnp.asarray(count, jnp.int32))
        self.invert = invert

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        std = jnp.maximum(jnp.sqrt(self.variance[...]), EPSILON)
        if self.invert:
            return x * std + self.mean[...]
        return (x - self.mean[...]) / std


class Normalization(Layer):
    """`Normalization(axis=-1, mean=None, variance=None, invert=False)`: (x - mean) /
    sqrt(variance) per index of `axis` (the features), from `mean`/`variance` given or from
    `adapt(data)`."""

    keeps_mask = True
    weight_order = ("mean", "variance", "count")

    def __init__(self, axis: Any = -1, mean: Any = None, variance: Any = None,
                 invert: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        axes = (axis,) if isinstance(axis, int) else tuple(axis) if axis is not None else ()
        if not all(isinstance(a, int) and not isinstance(a, bool) and a != 0 for a in axes):
            raise ConfigError(f"Normalization(axis={axis!r}): ints other than 0 (the batch), "
                              "or None (one mean and variance for all values).")
        if (mean is None) != (variance is None):
            raise ConfigError("Normalization(mean=..., variance=...): give both or neither "
                              "(then call adapt(data)).")
        if not isinstance(invert, bool):
            raise ConfigError(f"Normalization(invert={invert!r}) must be True or False.")
        self.axis, self.invert = axes, invert
        self.mean = None if mean is None else np.asarray(mean, np.float32)
        self.variance = None if variance is None else np.asarray(variance, np.float32)
        self.count = 0

    def get_config(self) -> dict:
        return {"axis": list(self.axis), "invert": self.invert,
                "mean": None if self.mean is None else self.mean.tolist(),
                "variance": None if self.variance is None else self.variance.tolist(),
                **super().get_config()}

    def _kept(self, rank: int) -> tuple[int, ...]:
        """The kept axes, counted with the batch as 0."""
        kept = tuple(a % rank for a in self.axis)
        if any(a == 0 for a in kept):
            raise ConfigError(f"Normalization {self.name!r}: axis {self.axis} is the batch.")
        return kept

    def adapt(self, data: Any, batch_size: int | None = None, steps: int | None = None) -> None:
        """The mean and variance of `data` (an array, or a pk.data.Dataset of batches) over
        every axis but `axis`, as Keras's adapt: run before the model is built."""
        if self._store is not None:
            raise ConfigError(f"Normalization {self.name!r}.adapt() after its model was built: "
                              "adapt first, then build or fit the model (or set_weights).")
        total, total_sq, n, kept_shape = None, None, 0, None
        for i, batch in enumerate(_batches(data)):
            if steps is not None and i >= steps:
                break
            x = np.asarray(batch, np.float64)
            kept = self._kept(x.ndim)
            reduce = tuple(a for a in range(x.ndim) if a not in kept)
            shape = tuple(x.shape[a] for a in kept)
            if kept_shape is not None and shape != kept_shape:
                raise ConfigError(f"Normalization.adapt: batches of shape {x.shape} after "
                                  f"batches whose axis {self.axis} had size {kept_shape}.")
            kept_shape = shape
            count = int(np.prod([x.shape[a] for a in reduce]))
            s, sq = x.sum(axis=reduce), (x * x).sum(axis=reduce)
            total = s if total is None else total + s
            total_sq = sq if total_sq is None else total_sq + sq
            n += count
        if n == 0:
            raise ConfigError("Normalization.adapt got no data.")
        mean = total / n
        self.mean = mean.astype(np.float32)
        self.variance = np.maximum(total_sq / n - mean * mean, 0.0).astype(np.float32)
        self.count = n

    def _stat_shape(self, input_shape: Shape) -> tuple[int, ...]:
        rank = len(input_shape) + 1
        kept = self._kept(rank)
        return tuple(input_shape[a - 1] if a in kept else 1 for a in range(1, rank))

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        if self.mean is None:
            raise ConfigError(f"Normalization {self.name!r} has no statistics: call "
                              "layer.adapt(data) before building the model, or pass mean= and "
                              "variance=.")
        shape = self._stat_shape(input_shape)
        try:
            mean = np.broadcast_to(self.mean.reshape(-1) if self.mean.size > 1 else self.mean,
                                   [d for d in shape if d != 1] or ()).reshape(shape)
            variance = np.broadcast_to(
                self.variance.reshape(-1) if self.variance.size > 1 else self.variance,
                [d for d in shape if d != 1] or ()).reshape(shape)
        except ValueError:
            raise ConfigError(f"Normalization {self.name!r}: statistics of shape "
                              f"{self.mean.shape} do not fit inputs of shape "
                              f"{(None, *input_shape)} on axis {self.axis}.") from None
        return NormalizationModule(mean, variance, self.count, self.invert)


def _batches(data: Any) -> Any:
    if isinstance(data, np.ndarray | jax.Array | list | tuple):
        yield np.asarray(data)
        return
    for batch in data:  # a pk.data.Dataset or any iterable of batches
        if isinstance(batch, tuple | list):  # (x, y) batches: adapt reads x
            batch = batch[0]
        yield batch


class CategoryEncoding(Layer):
    """`CategoryEncoding(num_tokens, output_mode="multi_hot")`: integer ids to a vector of
    `num_tokens`: "one_hot" (one id per example), "multi_hot" (1 where an id occurs) or
    "count" (how often)."""

    input_kind = "int"

    def __init__(self, num_tokens: int, output_mode: str = "multi_hot",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ConfigError(f"CategoryEncoding(num_tokens={num_tokens!r}) must be a positive "
                              "int.")
        if output_mode not in ("one_hot", "multi_hot", "count"):
            raise ConfigError(f"CategoryEncoding(output_mode={output_mode!r}); valid values: "
                              "'one_hot', 'multi_hot', 'count'.")
        self.num_tokens, self.output_mode = num_tokens, output_mode

    def input_range(self) -> tuple[int, int]:
        return (0, self.num_tokens)

    def get_config(self) -> dict:
        return {"num_tokens": self.num_tokens, "output_mode": self.output_mode,
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        if self.output_mode == "one_hot":
            if input_shape not in ((), (1,)):
                return (*input_shape, self.num_tokens)
            return (self.num_tokens,)
        if len(input_shape) > 1:
            raise ConfigError(f"CategoryEncoding {self.name!r} ({self.output_mode}) takes "
                              f"(batch, ids); got {(None, *input_shape)}.")
        return (self.num_tokens,)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        n, mode = self.num_tokens, self.output_mode
        squeeze = input_shape == (1,)

        def encode(ids: jax.Array) -> jax.Array:
            ids = ids.astype(jnp.int32)
            if mode == "one_hot":
                return jax.nn.one_hot(ids[:, 0] if squeeze else ids, n)
            ids = ids if ids.ndim > 1 else ids[:, None]
            counts = jax.nn.one_hot(ids, n).sum(axis=1)
            return counts if mode == "count" else jnp.minimum(counts, 1.0)
        return Fn(encode)
