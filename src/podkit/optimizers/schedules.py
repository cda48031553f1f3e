"""Learning-rate schedules as in Keras 3: objects called with the optimizer's step count.

They are evaluated inside the compiled step (jax.numpy), from the count the optimizer state
keeps, so a schedule never recompiles and resumes exactly with the state. Each has a config, so
a model compiled with one can be saved and loaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from podkit import serialization
from podkit.errors import ConfigError


class LearningRateSchedule:
    """Base class: `__call__(step) -> learning rate` in jax.numpy; `get_config()`."""

    def __call__(self, step: jax.Array) -> jax.Array:
        raise NotImplementedError

    def get_config(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict) -> LearningRateSchedule:
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "name")
        return f"{type(self).__name__}({args})"


def _positive(owner: str, **values: Any) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ConfigError(f"{owner}({name}={v!r}) must be a number > 0.")


class CosineDecay(LearningRateSchedule):
    """Keras's CosineDecay: optional linear warmup from `initial_learning_rate` to
    `warmup_target` over `warmup_steps`, then cosine decay over `decay_steps` to
    `alpha` times the peak."""

    def __init__(self, initial_learning_rate: float, decay_steps: int, alpha: float = 0.0,
                 name: str = "CosineDecay", warmup_target: float | None = None,
                 warmup_steps: int = 0) -> None:
        _positive("CosineDecay", decay_steps=decay_steps)
        if initial_learning_rate < 0 or not 0.0 <= alpha <= 1.0 or warmup_steps < 0:
            raise ConfigError(
                f"CosineDecay(initial_learning_rate={initial_learning_rate!r}, alpha={alpha!r}, "
                f"warmup_steps={warmup_steps!r}): the rate must be >= 0, alpha in [0, 1], "
                "warmup_steps >= 0.")
        if warmup_steps and warmup_target is None:
            raise ConfigError("CosineDecay(warmup_steps=...) needs warmup_target, the rate the "
                              "warmup reaches.")
        self.initial_learning_rate, self.decay_steps = float(initial_learning_rate), decay_steps
        self.alpha, self.name = float(alpha), name
        self.warmup_target, self.warmup_steps = warmup_target, warmup_steps

    def _decay(self, step: jax.Array, peak: float) -> jax.Array:
        fraction = step / self.decay_steps
        cosine = 0.5 * (1.0 + jnp.cos(math.pi * fraction))
        return peak * ((1 - self.alpha) * cosine + self.alpha)

    def __call__(self, step):
        step = jnp.asarray(step, jnp.float32)
        if self.warmup_target is None:
            return self._decay(jnp.minimum(step, self.decay_steps), self.initial_learning_rate)
        step = jnp.minimum(step, self.decay_steps + self.warmup_steps)
        warm = self.initial_learning_rate + (self.warmup_target - self.initial_learning_rate) * (
            step / max(self.warmup_steps, 1))
        return jnp.where(step < self.warmup_steps, warm,
                         self._decay(step - self.warmup_steps, self.warmup_target))

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "alpha": self.alpha, "name": self.name,
                "warmup_target": self.warmup_target, "warmup_steps": self.warmup_steps}


class ExponentialDecay(LearningRateSchedule):
    """`initial_learning_rate * decay_rate ** (step / decay_steps)` (floored if staircase)."""

    def __init__(self, initial_learning_rate: float, decay_steps: int, decay_rate: float,
                 staircase: bool = False, name: str = "ExponentialDecay") -> None:
        _positive("ExponentialDecay", initial_learning_rate=initial_learning_rate,
                  decay_steps=decay_steps, decay_rate=decay_rate)
        self.initial_learning_rate, self.decay_steps = float(initial_learning_rate), decay_steps
        self.decay_rate, self.staircase, self.name = float(decay_rate), bool(staircase), name

    def __call__(self, step):
        p = jnp.asarray(step, jnp.float32) / self.decay_steps
        if self.staircase:
            p = jnp.floor(p)
        return self.initial_learning_rate * jnp.power(self.decay_rate, p)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "decay_rate": self.decay_rate,
                "staircase": self.staircase, "name": self.name}


class PiecewiseConstantDecay(LearningRateSchedule):
    """`values[i]` while `boundaries[i-1] < step <= boundaries[i]`, as Keras."""

    def __init__(self, boundaries: Sequence[int], values: Sequence[float],
                 name: str = "PiecewiseConstant") -> None:
        if len(values) != len(boundaries) + 1:
            raise ConfigError(f"PiecewiseConstantDecay: {len(values)} values for "
                              f"{len(boundaries)} boundaries; give one value more than "
                              "boundaries.")
        if list(boundaries) != sorted(boundaries):
            raise ConfigError(f"PiecewiseConstantDecay(boundaries={list(boundaries)}) must be "
                              "increasing.")
        self.boundaries, self.values = list(boundaries), [float(v) for v in values]
        self.name = name

    def __call__(self, step):
        step = jnp.asarray(step)
        index = jnp.sum(step > jnp.asarray(self.boundaries))
        return jnp.asarray(self.values, jnp.float32)[index]

    def get_config(self):
        return {"boundaries": self.boundaries, "values": self.values, "name": self.name}


class PolynomialDecay(LearningRateSchedule):
    """Keras's PolynomialDecay: from `initial_learning_rate` to `end_learning_rate` over
    `decay_steps` as `(1 - step / decay_steps) ** power` (power 1: linear), then constant.
    `warmup_steps` / `warmup_target` (as CosineDecay's, podkit's addition here): a linear
    warmup first, from `initial_learning_rate` to `warmup_target`, which the decay starts
    from."""

    def __init__(self, initial_learning_rate: float, decay_steps: int,
                 end_learning_rate: float = 0.0001, power: float = 1.0, cycle: bool = False,
                 name: str = "PolynomialDecay", warmup_target: float | None = None,
                 warmup_steps: int = 0) -> None:
        _positive("PolynomialDecay", decay_steps=decay_steps, power=power)
        if cycle:
            raise ConfigError("PolynomialDecay(cycle=True) is not supported; the decay ends "
                              "at end_learning_rate.")
        if initial_learning_rate < 0 or end_learning_rate < 0 or warmup_steps < 0:
            raise ConfigError("PolynomialDecay: the rates must be >= 0 and warmup_steps >= 0.")
        if warmup_steps and warmup_target is None:
            raise ConfigError("PolynomialDecay(warmup_steps=...) needs warmup_target.")
        self.initial_learning_rate, self.decay_steps = float(initial_learning_rate), decay_steps
        self.end_learning_rate, self.power = float(end_learning_rate), float(power)
        self.name, self.warmup_target, self.warmup_steps = name, warmup_target, warmup_steps

    def _decay(self, step: jax.Array, peak: float) -> jax.Array:
        fraction = jnp.minimum(step, self.decay_steps) / self.decay_steps
        return (peak - self.end_learning_rate) * (1 - fraction) ** self.power + \
            self.end_learning_rate

    def __call__(self, step):
        step = jnp.asarray(step, jnp.float32)
        if self.warmup_target is None:
            return self._decay(step, self.initial_learning_rate)
        warm = self.initial_learning_rate + (self.warmup_target - self.initial_learning_rate) * (
            step / max(self.warmup_steps, 1))
        return jnp.where(step < self.warmup_steps, warm,
                         self._decay(step - self.warmup_steps, self.warmup_target))

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "end_learning_rate": self.end_learning_rate,
                "power": self.power, "cycle": False, "name": self.name,
                "warmup_target": self.warmup_target, "warmup_steps": self.warmup_steps}


CLASSES: dict[str, type[LearningRateSchedule]] = {c.__name__: c for c in (
    CosineDecay, ExponentialDecay, PiecewiseConstantDecay, PolynomialDecay)}


def serialize(schedule: LearningRateSchedule) -> dict:
    return serialization.to_config(schedule, CLASSES, "schedule")


def deserialize(config: dict) -> LearningRateSchedule:
    return serialization.from_config(config, CLASSES, "schedule")
