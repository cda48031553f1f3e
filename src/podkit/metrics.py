"""Metrics by Keras name. Each returns one value per example; the step accumulates weighted sums
on the device, and the loop fetches them only when it logs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from podkit import losses as losses_lib
from podkit.errors import ConfigError


def sparse_categorical_accuracy(y: jax.Array, pred: jax.Array) -> jax.Array:
    if y.ndim == pred.ndim:
        y = y[..., 0]
    hit = (jnp.argmax(pred, axis=-1) == y.astype(jnp.int32)).astype(jnp.float32)
    return hit.reshape(hit.shape[0], -1).mean(axis=1)


def categorical_accuracy(y: jax.Array, pred: jax.Array) -> jax.Array:
    hit = (jnp.argmax(pred, axis=-1) == jnp.argmax(y, axis=-1)).astype(jnp.float32)
    return hit.reshape(hit.shape[0], -1).mean(axis=1)


def binary_accuracy(y: jax.Array, pred: jax.Array) -> jax.Array:
    hit = ((pred > 0.5) == (y.reshape(pred.shape) > 0.5)).astype(jnp.float32)
    return hit.reshape(hit.shape[0], -1).mean(axis=1)


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[jax.Array, jax.Array], jax.Array]


METRICS = {
    "sparse_categorical_accuracy": sparse_categorical_accuracy,
    "categorical_accuracy": categorical_accuracy,
    "binary_accuracy": binary_accuracy,
    "mse": lambda y, p: losses_lib.mean_squared_error(y, p),
    "mae": lambda y, p: losses_lib.mean_absolute_error(y, p),
}

# "accuracy" means the accuracy that fits the loss, as in Keras.
_ACCURACY_FOR_LOSS = {
    "sparse_categorical_crossentropy": "sparse_categorical_accuracy",
    "categorical_crossentropy": "categorical_accuracy",
    "binary_crossentropy": "binary_accuracy",
}


def get(names: Sequence[str] | None, loss: losses_lib.Loss) -> tuple[Metric, ...]:
    out = []
    for name in names or ():
        if not isinstance(name, str):
            raise ConfigError(f"metric {name!r} is not a name; valid names: {_valid()}.")
        if name in ("accuracy", "acc"):
            if loss.name not in _ACCURACY_FOR_LOSS:
                raise ConfigError(
                    f"metric {name!r} has no meaning for loss {loss.name!r}; name the metric "
                    f"explicitly, one of: {_valid()}."
                )
            out.append(Metric("accuracy", METRICS[_ACCURACY_FOR_LOSS[loss.name]]))
        elif name in METRICS:
            out.append(Metric(name, METRICS[name]))
        else:
            raise ConfigError(f"unknown metric {name!r}; valid names: {_valid()}.")
    return tuple(out)


def _valid() -> str:
    return ", ".join(["accuracy", *sorted(METRICS)])
