"""Optimizers as in Keras 3 (`pk.optimizers.Adam(learning_rate=1e-3 | schedule)`), over Optax.

An optimizer is a description; `transform()` builds the Optax transformation the compiled step
runs. Each computes Keras 3's update op for op (podkit.optimizers.apply: clipping, weight
decay, the optimizer's `update_step`, EMA, in Keras's order), so the weights match Keras's
in float32 (tests/test_optimizers_keras.py runs Keras itself). The learning rate lives in the
optimizer *state* (`optax.inject_hyperparams`), not in the compiled program, so
`model.optimizer.learning_rate = 1e-4` (what LearningRateScheduler and ReduceLROnPlateau do)
changes one number on the devices and never recompiles. A schedule is evaluated on the device
from the optimizer's step count.

Names work as in Keras: `compile(optimizer="adam")` is `Adam()` with Keras's defaults. A plain
`optax.GradientTransformation` is accepted too; its learning rate is reachable only when it was
built with `optax.inject_hyperparams`.
"""

from __future__ import annotations

import optax

from podkit import serialization
from podkit.errors import ConfigError
from podkit.optimizers import schedules
from podkit.optimizers.adafactor import Adafactor
from podkit.optimizers.adam import EPSILON_PLACEMENTS, Adam, Adamax, AdamW, Lamb, Nadam
from podkit.optimizers.adaptive import Adadelta, Adagrad, Ftrl, RMSprop
from podkit.optimizers.apply import finalized_params
from podkit.optimizers.base import OptaxOptimizer, Optimizer, StateAccess
from podkit.optimizers.lion import Lion
from podkit.optimizers.schedules import LearningRateSchedule
from podkit.optimizers.sgd import SGD, Lars
from podkit.optimizers.state import (
    inject_learning_rate,
    learning_rate_in,
    learning_rate_of,
    step_count_of,
    with_learning_rate,
)

__all__ = [
    "EPSILON_PLACEMENTS", "SGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax",
    "Ftrl", "Lamb", "Lars", "Lion", "Nadam", "OptaxOptimizer", "Optimizer", "RMSprop",
    "StateAccess", "finalized_params", "get", "inject_learning_rate", "learning_rate_in",
    "learning_rate_of", "schedules", "step_count_of", "with_learning_rate",
]

CLASSES: dict[str, type[Optimizer]] = {c.__name__: c for c in (
    SGD, Adam, AdamW, Nadam, Adamax, RMSprop, Adagrad, Adadelta, Ftrl, Lion, Lamb, Lars,
    Adafactor)}
NAMES: dict[str, type[Optimizer]] = {k.lower(): v for k, v in CLASSES.items()}


def get(optimizer: str | Optimizer | optax.GradientTransformation,
        learning_rate: float | LearningRateSchedule | None = None) -> Optimizer:
    """A Keras name (with an optional learning rate), an Optimizer, or an optax transform."""
    if isinstance(optimizer, str):
        cls = NAMES.get(optimizer.lower())
        if cls is None:
            raise ConfigError(f"unknown optimizer {optimizer!r}; valid names: "
                              f"{', '.join(sorted(NAMES))}, or a pk.optimizers object, or an "
                              "optax.GradientTransformation.")
        return cls() if learning_rate is None else cls(learning_rate=learning_rate)
    if learning_rate is not None:
        raise ConfigError("learning_rate= applies to optimizer names only; an optimizer object "
                          "carries its own (e.g. pk.optimizers.Adam(learning_rate=...)).")
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, type) and issubclass(optimizer, Optimizer):
        return optimizer()
    if isinstance(optimizer, optax.GradientTransformation):
        return OptaxOptimizer(optimizer)
    if type(optimizer).__module__.startswith(("keras.", "tf_keras.", "tensorflow.")):
        name = type(optimizer).__name__
        raise ConfigError(f"optimizer={optimizer!r} is Keras's own object; podkit compiles its "
                          f"own: pk.optimizers.{name}(...) with the same arguments "
                          f"(or the name {name.lower()!r}).")
    raise ConfigError(f"optimizer={optimizer!r} is neither a name ({', '.join(sorted(NAMES))}), "
                      "a pk.optimizers object nor an optax.GradientTransformation.")


def serialize(optimizer: Optimizer) -> dict:
    return serialization.to_config(optimizer, CLASSES, "optimizer")


def deserialize(config: dict) -> Optimizer:
    return serialization.from_config(config, CLASSES, "optimizer")
