"""Preprocessing layers, Keras 3's: Normalization (with `adapt`) and CategoryEncoding.

    norm = pk.layers.Normalization()
    norm.adapt(x_train)                 # the mean and variance of each feature
    model = pk.Sequential([norm, pk.layers.Dense(10)])

An adapted Normalization's statistics are non-trainable variables (`mean`, `variance`, `count`,
as Keras keeps them), so they are saved and checkpointed with the model and its optimizer never
moves them; `adapt` reads arrays or a pk.data.Dataset before the model is built. Statistics
given to the constructor are constants, as in Keras (no weights).
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
    """An adapted Normalization: its statistics are variables (shaped as the kept axes, as
    Keras's weights), broadcast over the input when used."""

    def __init__(self, mean: np.ndarray, variance: np.ndarray, count: int, invert: bool,
                 broadcast: tuple[int, ...]) -> None:
        self.mean = Statistic(jnp.asarray(mean, jnp.float32))
        self.variance = Statistic(jnp.asarray(variance, jnp.float32))
        self.count = Statistic(jnp.asarray(count, jnp.int32))
        self.invert, self.broadcast = invert, broadcast

    def __call__(self, x: jax.Array) -> jax.Array:
        return normalize(x, self.mean[...].reshape(self.broadcast),
                         self.variance[...].reshape(self.broadcast), self.invert)


def normalize(x: jax.Array, mean: jax.Array, variance: jax.Array, invert: bool) -> jax.Array:
    """Keras's Normalization.call: the standard deviation floored at Keras's epsilon."""
    x = x.astype(jnp.float32)
    std = jnp.maximum(jnp.sqrt(variance), EPSILON)
    return mean + x * std if invert else (x - mean) / std


class Normalization(Layer):
    """`Normalization(axis=-1, mean=None, variance=None, invert=False)`: (x - mean) /
    sqrt(variance) per index of `axis` (the kept axes), as Keras 3's.

    Given `mean` and `variance`, they are constants of the model (Keras's: the layer has no
    weights), broadcast as Keras broadcasts them (a number over everything; an array over
    the last kept axes). Otherwise `adapt(data)` computes them over every other axis, and
    they are the layer's weights `mean`, `variance` (shaped as the kept axes) and `count`
    (Keras's, which its adapt leaves at 0), saved and checkpointed with the model and never
    moved by the optimizer."""

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
        if self.mean is not None and self.variance is not None:
            if self.mean.shape != self.variance.shape:
                raise ConfigError(f"Normalization(mean=..., variance=...): shapes "
                                  f"{self.mean.shape} and {self.variance.shape} differ; give "
                                  "one value per kept index for both.")
            if self.mean.ndim > len(self.axis):
                raise ConfigError(f"Normalization(mean=...): rank {self.mean.ndim} is more "
                                  f"than the {len(self.axis)} kept axes {self.axis}.")
        self.adapted = False  # the statistics came from adapt() (or a file): weights

    def get_config(self) -> dict:
        config = {"axis": list(self.axis), "invert": self.invert,
                  "mean": None if self.adapted or self.mean is None else self.mean.tolist(),
                  "variance": None if self.adapted or self.variance is None
                  else self.variance.tolist(),
                  **super().get_config()}
        if self.adapted:  # podkit's own files: rebuilt with these as its weights
            config["statistics"] = {"mean": self.mean.tolist(),
                                    "variance": self.variance.tolist()}
        return config

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        config = dict(config)
        statistics = config.pop("statistics", None)
        layer = cls(**config)
        if statistics is not None:
            layer.set_statistics(statistics["mean"], statistics["variance"])
        return layer

    def set_statistics(self, mean: Any, variance: Any) -> None:
        """Adapted statistics (shaped as the kept axes), as adapt() sets them: the layer's
        weights once its model is built."""
        self.mean = np.asarray(mean, np.float32)
        self.variance = np.asarray(variance, np.float32)
        self.adapted = True

    def _kept(self, rank: int) -> tuple[int, ...]:
        """The kept axes, counted with the batch as 0, sorted (Keras's `_keep_axis`)."""
        if any(not -rank <= a < rank for a in self.axis):
            raise ConfigError(f"Normalization {self.name!r}: axis {self.axis} is out of range "
                              f"for inputs of rank {rank} (batch included).")
        kept = tuple(sorted(a % rank for a in self.axis))
        if any(a == 0 for a in kept):
            raise ConfigError(f"Normalization {self.name!r}: axis {self.axis} is the batch.")
        return kept

    def adapt(self, data: Any, batch_size: int | None = None, steps: int | None = None) -> None:
        """The mean and variance of `data` (an array, a list of batches, or a pk.data.Dataset
        of batches) over every axis but `axis`, as Keras's adapt: run before the model is
        built."""
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
        self.set_statistics(mean, np.maximum(total_sq / n - mean * mean, 0.0))

    def _shapes(self, input_shape: Shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the kept axes' sizes, the statistics' broadcast shape without the batch)."""
        rank = len(input_shape) + 1
        kept = self._kept(rank)
        if any(input_shape[a - 1] is None for a in kept):
            raise ConfigError(f"Normalization {self.name!r}: the kept axes {self.axis} of "
                              f"inputs {(None, *input_shape)} must have fixed sizes.")
        return (tuple(input_shape[a - 1] for a in kept),
                tuple(input_shape[a - 1] if a in kept else 1 for a in range(1, rank)))

    def output_shape(self, input_shape: Shape) -> Shape:
        self._shapes(input_shape)
        return input_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        if self.mean is None or self.variance is None:
            raise ConfigError(f"Normalization {self.name!r} has no statistics: call "
                              "layer.adapt(data) before building the model, or pass mean= and "
                              "variance=.")
        kept_shape, broadcast = self._shapes(input_shape)
        if self.adapted:
            if self.mean.shape != kept_shape:
                raise ConfigError(f"Normalization {self.name!r} was adapted to axis "
                                  f"{self.axis} of size {self.mean.shape}; inputs of shape "
                                  f"{(None, *input_shape)} have {kept_shape} there.")
            return NormalizationModule(self.mean, self.variance, 0, self.invert, broadcast)
        kept = self._kept(len(input_shape) + 1)
        mean, variance = (self._placed(v, kept, broadcast, input_shape)
                          for v in (self.mean, self.variance))
        invert = self.invert
        return Fn(lambda x: normalize(x, mean, variance, invert))

    def _placed(self, value: np.ndarray, kept: tuple[int, ...], broadcast: tuple[int, ...],
                input_shape: Shape) -> np.ndarray:
        """A given statistic broadcast as Keras's build does: a number everywhere, an
        array's dims on the last kept axes."""
        shape = [1] * len(broadcast)
        for i in range(1, value.ndim + 1):
            shape[kept[-i] - 1] = value.shape[-i]
        try:
            out = np.broadcast_to(value.reshape(shape), broadcast)
        except ValueError:
            raise ConfigError(f"Normalization {self.name!r}: statistics of shape "
                              f"{value.shape} do not fit inputs of shape "
                              f"{(None, *input_shape)} on axis {self.axis}.") from None
        # numpy, not a jax.Array: a constant of the program (a closed-over jax.Array would
        # become an argument of the compiled step that the state does not carry)
        return np.ascontiguousarray(out, np.float32)


def _batches(data: Any) -> Any:
    if isinstance(data, np.ndarray | jax.Array):
        yield np.asarray(data)
        return
    if isinstance(data, list | tuple) and not all(_is_batch(b) for b in data):
        yield np.asarray(data)  # nested lists of numbers: one array
        return
    for batch in data:  # a list of arrays, a pk.data.Dataset or any iterable of batches
        if isinstance(batch, tuple | list):  # (x, y) batches: adapt reads x
            batch = batch[0]
        yield batch


def _is_batch(value: Any) -> bool:
    """An array, or an (x, y) pair of them: a list of these is batches (Keras's adapt)."""
    return hasattr(value, "shape") or (isinstance(value, tuple | list) and len(value) > 0
                                       and hasattr(value[0], "shape"))


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
