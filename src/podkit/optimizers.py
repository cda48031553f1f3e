"""Optimizers by Keras name, as Optax transforms with Keras's default hyper-parameters."""

from __future__ import annotations

from collections.abc import Callable

import optax

from podkit.errors import ConfigError

# name -> (constructor taking a learning rate, Keras's default learning rate)
OPTIMIZERS: dict[str, tuple[Callable[[float], optax.GradientTransformation], float]] = {
    "adam": (lambda lr: optax.adam(lr, eps=1e-7), 1e-3),
    "adamw": (lambda lr: optax.adamw(lr, eps=1e-7, weight_decay=0.004), 1e-3),
    "sgd": (lambda lr: optax.sgd(lr), 0.01),
    "rmsprop": (lambda lr: optax.rmsprop(lr, decay=0.9, eps=1e-7), 1e-3),
    "adagrad": (lambda lr: optax.adagrad(lr, initial_accumulator_value=0.1, eps=1e-7), 1e-3),
    "adamax": (lambda lr: optax.adamax(lr, eps=1e-7), 1e-3),
    "nadam": (lambda lr: optax.nadam(lr, eps=1e-7), 1e-3),
    "lion": (lambda lr: optax.lion(lr), 1e-3),
}


def get(
    optimizer: str | optax.GradientTransformation, learning_rate: float | None = None
) -> optax.GradientTransformation:
    """Resolve a Keras optimizer name (optionally with a learning rate) or pass an Optax
    transform through."""
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in OPTIMIZERS:
            raise ConfigError(
                f"unknown optimizer {optimizer!r}; valid names: {', '.join(sorted(OPTIMIZERS))}, "
                "or pass an optax.GradientTransformation."
            )
        make, default_lr = OPTIMIZERS[key]
        lr = default_lr if learning_rate is None else learning_rate
        if not lr > 0:
            raise ConfigError(f"learning_rate={lr!r} must be > 0.")
        return make(lr)
    if isinstance(optimizer, optax.GradientTransformation):
        if learning_rate is not None:
            raise ConfigError(
                "learning_rate= applies to optimizer names only; an optax transform carries its "
                "own learning rate."
            )
        return optimizer
    raise ConfigError(
        f"optimizer={optimizer!r} is neither a name ({', '.join(sorted(OPTIMIZERS))}) nor an "
        "optax.GradientTransformation."
    )
