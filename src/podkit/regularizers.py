"""Keras's weight regularizers: `Dense(64, kernel_regularizer="l2")` or `pk.regularizers.L2(1e-4)`.

A regularizer turns a parameter into a penalty that is added to the loss (and to the logged
"loss", as Keras does). They are frozen objects: part of the compiled step's structure.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from podkit import serialization
from podkit.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Regularizer:
    def __call__(self, w: jax.Array) -> jax.Array:
        raise NotImplementedError

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> Regularizer:
        return cls(**config)


@dataclasses.dataclass(frozen=True)
class L1L2(Regularizer):
    l1: float = 0.0
    l2: float = 0.0

    def __post_init__(self) -> None:
        for what, v in (("l1", self.l1), ("l2", self.l2)):
            if not isinstance(v, int | float) or v < 0:
                raise ConfigError(f"{type(self).__name__}({what}={v!r}) must be a number >= 0.")

    def __call__(self, w):
        out = jnp.zeros((), jnp.float32)
        if self.l1:
            out = out + self.l1 * jnp.sum(jnp.abs(w))
        if self.l2:
            out = out + self.l2 * jnp.sum(jnp.square(w))
        return out


@dataclasses.dataclass(frozen=True)
class L1(Regularizer):
    l1: float = 0.01

    def __post_init__(self) -> None:
        L1L2(l1=self.l1)  # the same checks

    def __call__(self, w):
        return L1L2(l1=self.l1)(w)


@dataclasses.dataclass(frozen=True)
class L2(Regularizer):
    l2: float = 0.01

    def __post_init__(self) -> None:
        L1L2(l2=self.l2)  # the same checks

    def __call__(self, w):
        return L1L2(l2=self.l2)(w)


CLASSES: dict[str, type[Regularizer]] = {c.__name__: c for c in (L1, L2, L1L2)}
NAMES = {"l1": L1, "l2": L2, "l1_l2": L1L2}


def get(identifier: str | Regularizer | None) -> Regularizer | None:
    if identifier is None or isinstance(identifier, Regularizer):
        return identifier
    if isinstance(identifier, str) and identifier in NAMES:
        return NAMES[identifier]()
    raise ConfigError(f"unknown regularizer {identifier!r}; valid names: l1, l2, l1_l2, or "
                      "pk.regularizers.L1(...), L2(...), L1L2(...).")


def serialize(regularizer: Regularizer | None) -> dict | None:
    if regularizer is None:
        return None
    return serialization.to_config(regularizer, CLASSES, "regularizer")


def deserialize(config: Any) -> Regularizer | None:
    if config is None or isinstance(config, str):
        return get(config)
    return serialization.from_config(config, CLASSES, "regularizer")
