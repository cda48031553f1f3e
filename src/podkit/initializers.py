"""Keras's initializers by name or object: `Dense(64, kernel_initializer="he_normal")`.

Each is a small frozen object — called as a JAX initializer `(key, shape, dtype) -> array`,
with a config so a model that uses it can be saved.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from podkit import serialization
from podkit.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Initializer:
    def __call__(self, key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32):
        raise NotImplementedError

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> Initializer:
        return cls(**config)


@dataclasses.dataclass(frozen=True)
class _VarianceScaling(Initializer):
    """Keras's variance-scaling family: each subclass fixes (scale, mode, distribution)."""

    kind = (1.0, "fan_avg", "uniform")

    def __call__(self, key, shape, dtype=jnp.float32):
        return jax.nn.initializers.variance_scaling(*self.kind)(key, shape, dtype)


@dataclasses.dataclass(frozen=True)
class GlorotUniform(_VarianceScaling):
    kind = (1.0, "fan_avg", "uniform")


@dataclasses.dataclass(frozen=True)
class GlorotNormal(_VarianceScaling):
    kind = (1.0, "fan_avg", "truncated_normal")


@dataclasses.dataclass(frozen=True)
class HeUniform(_VarianceScaling):
    kind = (2.0, "fan_in", "uniform")


@dataclasses.dataclass(frozen=True)
class HeNormal(_VarianceScaling):
    kind = (2.0, "fan_in", "truncated_normal")


@dataclasses.dataclass(frozen=True)
class LecunUniform(_VarianceScaling):
    kind = (1.0, "fan_in", "uniform")


@dataclasses.dataclass(frozen=True)
class LecunNormal(_VarianceScaling):
    kind = (1.0, "fan_in", "truncated_normal")


@dataclasses.dataclass(frozen=True)
class Orthogonal(Initializer):
    gain: float = 1.0

    def __call__(self, key, shape, dtype=jnp.float32):
        return jax.nn.initializers.orthogonal(self.gain)(key, shape, dtype)


@dataclasses.dataclass(frozen=True)
class RandomNormal(Initializer):
    mean: float = 0.0
    stddev: float = 0.05

    def __call__(self, key, shape, dtype=jnp.float32):
        return self.mean + self.stddev * jax.random.normal(key, shape, dtype)


@dataclasses.dataclass(frozen=True)
class TruncatedNormal(Initializer):
    mean: float = 0.0
    stddev: float = 0.05

    def __call__(self, key, shape, dtype=jnp.float32):
        return self.mean + self.stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


@dataclasses.dataclass(frozen=True)
class RandomUniform(Initializer):
    minval: float = -0.05
    maxval: float = 0.05

    def __call__(self, key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, self.minval, self.maxval)


@dataclasses.dataclass(frozen=True)
class Constant(Initializer):
    value: float = 0.0

    def __call__(self, key, shape, dtype=jnp.float32):
        return jnp.full(shape, self.value, dtype)


@dataclasses.dataclass(frozen=True)
class Zeros(Constant):
    value: float = 0.0


@dataclasses.dataclass(frozen=True)
class Ones(Constant):
    value: float = 1.0


CLASSES: dict[str, type[Initializer]] = {c.__name__: c for c in (
    GlorotUniform, GlorotNormal, HeUniform, HeNormal, LecunUniform, LecunNormal, Orthogonal,
    RandomNormal, TruncatedNormal, RandomUniform, Constant, Zeros, Ones)}
NAMES: dict[str, type[Initializer]] = {serialization.snake_case(k): v for k, v in CLASSES.items()}


def get(identifier: str | Initializer) -> Initializer:
    if isinstance(identifier, Initializer):
        return identifier
    if isinstance(identifier, str) and identifier in NAMES:
        return NAMES[identifier]()
    raise ConfigError(f"unknown initializer {identifier!r}; valid names: "
                      f"{', '.join(sorted(NAMES))}, or a pk.initializers object.")


def serialize(initializer: Initializer) -> dict:
    return serialization.to_config(initializer, CLASSES, "initializer")


def deserialize(config: Any) -> Initializer:
    return get(config) if isinstance(config, str) else serialization.from_config(
        config, CLASSES, "initializer")
