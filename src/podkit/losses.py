"""Loss functions by Keras name. Each returns one value per example so that padded examples
(weight 0) can be left out of the mean exactly."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from podkit.errors import ConfigError

# Keras clips probabilities to [eps, 1 - eps] before taking logs; we do the same when a model
# does not end in a softmax/sigmoid we can fuse with the loss.
_EPS = 1e-7


def _per_example(values: jax.Array) -> jax.Array:
    """Mean over every dim but the batch dim."""
    return values.reshape(values.shape[0], -1).mean(axis=1) if values.ndim > 1 else values


def sparse_categorical_crossentropy(y: jax.Array, pred: jax.Array, from_logits: bool) -> jax.Array:
    if y.ndim == pred.ndim:  # Keras accepts (batch, 1) labels
        y = y[..., 0]
    y = y.astype(jnp.int32)
    if from_logits:
        return _per_example(optax.softmax_cross_entropy_with_integer_labels(pred, y))
    p = jnp.take_along_axis(pred, y[..., None], axis=-1)[..., 0]
    return _per_example(-jnp.log(jnp.clip(p, _EPS, 1.0)))


def categorical_crossentropy(y: jax.Array, pred: jax.Array, from_logits: bool) -> jax.Array:
    logp = jax.nn.log_softmax(pred) if from_logits else jnp.log(jnp.clip(pred, _EPS, 1.0))
    return _per_example(-(y * logp).sum(axis=-1))


def binary_crossentropy(y: jax.Array, pred: jax.Array, from_logits: bool) -> jax.Array:
    y = y.astype(pred.dtype).reshape(pred.shape)
    if from_logits:
        return _per_example(optax.sigmoid_binary_cross_entropy(pred, y))
    p = jnp.clip(pred, _EPS, 1.0 - _EPS)
    return _per_example(-(y * jnp.log(p) + (1 - y) * jnp.log(1 - p)))


def mean_squared_error(y: jax.Array, pred: jax.Array, from_logits: bool = False) -> jax.Array:
    return _per_example((pred - y.astype(pred.dtype).reshape(pred.shape)) ** 2)


def mean_absolute_error(y: jax.Array, pred: jax.Array, from_logits: bool = False) -> jax.Array:
    return _per_example(jnp.abs(pred - y.astype(pred.dtype).reshape(pred.shape)))


@dataclasses.dataclass(frozen=True)
class Loss:
    """A resolved loss: its name, its function, and the final activation it can fuse with."""

    name: str
    fn: Callable[..., jax.Array]
    fuses_with: str | None = None  # "softmax" or "sigmoid": then the loss takes logits
    label_kind: str = "any"  # "sparse" labels are class ids, checked against the output width

    def __call__(self, y: jax.Array, pred: jax.Array, from_logits: bool = False) -> jax.Array:
        if self.name == "custom":  # user callables take (y_true, y_pred)
            out = self.fn(y, pred)
            return out if out.ndim else jnp.broadcast_to(out, (pred.shape[0],))
        return self.fn(y, pred, from_logits)


LOSSES = {
    "sparse_categorical_crossentropy": Loss(
        "sparse_categorical_crossentropy", sparse_categorical_crossentropy, "softmax", "sparse"
    ),
    "categorical_crossentropy": Loss(
        "categorical_crossentropy", categorical_crossentropy, "softmax"
    ),
    "binary_crossentropy": Loss("binary_crossentropy", binary_crossentropy, "sigmoid"),
    "mse": Loss("mse", mean_squared_error),
    "mean_squared_error": Loss("mse", mean_squared_error),
    "mae": Loss("mae", mean_absolute_error),
    "mean_absolute_error": Loss("mae", mean_absolute_error),
}


def get(loss: str | Callable[..., jax.Array]) -> Loss:
    """Resolve a Keras loss name or a callable `(y_true, y_pred) -> per-example losses`."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        if loss not in LOSSES:
            raise ConfigError(f"unknown loss {loss!r}; valid names: {', '.join(sorted(LOSSES))}.")
        return LOSSES[loss]
    if callable(loss):
        return Loss("custom", loss)
    raise ConfigError(f"loss={loss!r} is neither a loss name nor a callable.")
