"""Losses as in Keras 3: classes (`SparseCategoricalCrossentropy(from_logits=True)`), names
("sparse_categorical_crossentropy") and functions (`sparse_categorical_crossentropy(y, p)`).

Every loss computes one value per example (`per_example`), so that padding (mask 0) can be
left out exactly. `reduction` is Keras's: "sum_over_batch_size" (the default; "mean" is the
same) divides the weighted sum by the number of (real) values, "sum" does not divide,
"mean_with_sample_weight" divides by the sum of the sample weights, and "none" (or None)
returns the values unreduced from a direct call (fit() needs one number: compile() refuses
it). fit() computes the division over the whole batch (podkit.train.step), so a batch split
into microbatches gives the whole batch's loss.

What a loss expects is stated, not guessed: `expects` says whether y_pred must be
probabilities ("softmax": rows summing to 1, "sigmoid": values in [0, 1]) unless
`from_logits=True`, and `labels` says what y_true must look like ("sparse": class ids, "dense":
the shape of y_pred, "any"). podkit.train.checks uses both to refuse a mismatch before XLA.

A language model (the GPT) returns `LMLogits` in training, not its (batch, time, vocab)
logits: `SparseCategoricalCrossentropy(from_logits=True)` computes its loss a vocabulary chunk
at a time (podkit.kernels.cross_entropy); a loss that cannot (`lazy_logits = False`) gets the
logits materialized.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from podkit import serialization
from podkit.errors import ConfigError

# LMLogits re-exported: pk.losses.LMLogits is what a language model returns in training.
from podkit.kernels.cross_entropy import LMLogits as LMLogits
from podkit.kernels.cross_entropy import materialize

# Keras clips probabilities to [eps, 1 - eps] before taking logs.
EPSILON = 1e-7


def per_example_mean(values: jax.Array) -> jax.Array:
    """Mean over every dim but the batch dim."""
    return values.reshape(values.shape[0], -1).mean(axis=1) if values.ndim > 1 else values


def _like(y: jax.Array, pred: jax.Array) -> jax.Array:
    """Labels of one value per output: (B,) or (B, 1) against (B, 1) outputs, as Keras."""
    return y.astype(pred.dtype).reshape(pred.shape)


# -- the functions (Keras's functional losses: one value per example) ---------------------------
def sparse_categorical_crossentropy(y_true: jax.Array, y_pred: jax.Array | LMLogits,
                                    from_logits: bool = False, ignore_class: int | None = None,
                                    vocab_chunk: int | None = None) -> jax.Array:
    """`ignore_class`: labels of that value count 0 (Keras's; the class's reduction then
    divides by the labels that are not). `vocab_chunk` applies to LMLogits: the vocabulary
    entries per chunk (None: the model's own chunk; 0: materialize the logits and take the
    plain loss)."""
    return per_example_mean(sparse_crossentropy_values(y_true, y_pred, from_logits,
                                                       ignore_class, vocab_chunk))


def sparse_crossentropy_values(y_true: jax.Array, y_pred: jax.Array | LMLogits,
                               from_logits: bool = False, ignore_class: int | None = None,
                               vocab_chunk: int | None = None) -> jax.Array:
    """The unreduced sparse cross-entropy, one value per label (Keras's functional loss):
    shape y_true's without a trailing 1, 0 where the label is `ignore_class`."""
    if y_true.ndim == y_pred.ndim:  # Keras accepts (batch, 1) labels
        y_true = y_true[..., 0]
    valid = None if ignore_class is None else y_true != ignore_class
    y = y_true.astype(jnp.int32) if valid is None else jnp.where(valid, y_true, 0).astype(
        jnp.int32)
    if isinstance(y_pred, LMLogits):
        if from_logits and vocab_chunk != 0 and y_pred.activation is None:
            values = y_pred.cross_entropy(y, vocab_chunk)
            return values if valid is None else jnp.where(valid, values, 0.0)
        y_pred = y_pred.materialize()
    if from_logits:
        values = optax.softmax_cross_entropy_with_integer_labels(y_pred, y)
    else:
        p = jnp.take_along_axis(y_pred, y[..., None], axis=-1)[..., 0]
        values = -jnp.log(jnp.clip(p, EPSILON, 1.0))
    return values if valid is None else jnp.where(valid, values, 0.0)


def categorical_crossentropy(y_true: jax.Array, y_pred: jax.Array, from_logits: bool = False,
                             label_smoothing: float = 0.0) -> jax.Array:
    y = y_true.astype(y_pred.dtype)
    if label_smoothing:
        y = y * (1.0 - label_smoothing) + label_smoothing / y_pred.shape[-1]
    if from_logits:
        logp = jax.nn.log_softmax(y_pred)
    else:  # Keras renormalizes, then clips
        p = y_pred / jnp.sum(y_pred, axis=-1, keepdims=True)
        logp = jnp.log(jnp.clip(p, EPSILON, 1.0))
    return per_example_mean(-(y * logp).sum(axis=-1))


def binary_crossentropy(y_true: jax.Array, y_pred: jax.Array, from_logits: bool = False,
                        label_smoothing: float = 0.0) -> jax.Array:
    y = _like(y_true, y_pred)
    if label_smoothing:
        y = y * (1.0 - label_smoothing) + 0.5 * label_smoothing
    if from_logits:
        return per_example_mean(optax.sigmoid_binary_cross_entropy(y_pred, y))
    p = jnp.clip(y_pred, EPSILON, 1.0 - EPSILON)
    return per_example_mean(-(y * jnp.log(p) + (1 - y) * jnp.log(1 - p)))


def mean_squared_error(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    return per_example_mean((y_pred - _like(y_true, y_pred)) ** 2)


def mean_absolute_error(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    return per_example_mean(jnp.abs(y_pred - _like(y_true, y_pred)))


def huber(y_true: jax.Array, y_pred: jax.Array, delta: float = 1.0) -> jax.Array:
    return per_example_mean(optax.huber_loss(y_pred, _like(y_true, y_pred), delta=delta))


# -- the classes ------------------------------------------------------------------------------
class Loss:
    """Base class: Keras's `Loss(name)`; `loss(y_true, y_pred, sample_weight=None)` -> scalar.

    Subclasses implement `per_example(y_true, y_pred, from_logits)`.
    """

    expects: str | None = None  # "softmax" | "sigmoid": y_pred must be probabilities
    labels: str = "dense"  # "sparse" | "dense" | "any"
    from_logits: bool = False
    lazy_logits: bool = False  # per_example takes LMLogits (else they are materialized first)

    def __init__(self, name: str | None = None,
                 reduction: str | None = "sum_over_batch_size") -> None:
        self.name = name or serialization.snake_case(type(self).__name__)
        self.reduction = check_reduction(reduction, type(self).__name__)

    def per_example(self, y_true: jax.Array, y_pred: jax.Array,
                    from_logits: bool | None = None) -> jax.Array:
        raise NotImplementedError

    def values_per_example(self, y_true: Any, y_pred: Any) -> float:
        """How many values Keras's loss function gives per example, which `per_example`
        averages: Keras's functions reduce the last axis, so an output (B, T, C) gives T.
        "sum" and "mean_with_sample_weight" scale by it (Keras sums the values)."""
        return math.prod(y_pred.shape[1:-1])

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> jax.Array:
        if not (self.lazy_logits and isinstance(y_pred, LMLogits)):
            y_pred = jnp.asarray(materialize(y_pred))
        y_true = jnp.asarray(y_true)
        weights = None if sample_weight is None else jnp.asarray(sample_weight, jnp.float32)
        if weights is not None and weights.ndim > 1:
            # One weight per value (Keras's (batch, time)): each value is a row of its own.
            lead = weights.ndim
            y_true = y_true.reshape(-1, *y_true.shape[lead:])
            y_pred = y_pred.reshape(-1, *y_pred.shape[lead:])
            weights = weights.reshape(-1)
        values = self.per_example(y_true, y_pred)
        n = self.values_per_example(y_true, y_pred)
        if weights is not None:
            weights = weights.astype(values.dtype).reshape(values.shape)
        if weights is not None:
            values = values * weights
        if self.reduction in (None, "none"):
            return values
        if self.reduction == "sum":
            return values.sum() * n
        if self.reduction == "mean_with_sample_weight" and weights is not None:
            # Keras refuses one weight per example when an example holds several values;
            # here each of its values takes the example's weight.
            divisor = weights.sum()
        else:
            divisor = jnp.asarray(values.shape[0], values.dtype)
        ok = divisor != 0
        return jnp.where(ok, values.sum() / jnp.where(ok, divisor, 1.0), 0.0)

    def get_config(self) -> dict:
        return {"name": self.name, "reduction": self.reduction}

    @classmethod
    def from_config(cls, config: dict) -> Loss:
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items()
                         if k != "name" and (k, v) != ("reduction", "sum_over_batch_size"))
        return f"{type(self).__name__}({args})"


class _Crossentropy(Loss):
    def __init__(self, from_logits: bool = False, name: str | None = None,
                 reduction: str | None = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
        if not isinstance(from_logits, bool):
            raise ConfigError(f"from_logits={from_logits!r} must be True or False.")
        self.from_logits = from_logits

    def get_config(self) -> dict:
        return {"from_logits": self.from_logits, **super().get_config()}


class SparseCategoricalCrossentropy(_Crossentropy):
    """Integer class ids against one probability (or logit) per class.

    `ignore_class`: labels of that value are left out, as Keras's: the loss is the mean over
    the labels that are not (-100 is Hugging Face's convention for prompt and padding
    tokens). In fit() the positions it leaves out are a timestep mask: the output's metrics
    leave them out too (Keras's count them: a difference, see docs/keras.md).

    On a language model's LMLogits (the GPT in training) with `from_logits=True` the loss is
    computed `vocab_chunk` vocabulary entries at a time: None takes the model's chunk (GPT:
    `vocab_chunk` in its config), an int overrides it, 0 materializes the whole logits.
    Outputs that are plain arrays are never chunked.
    """

    expects, labels = "softmax", "sparse"
    lazy_logits = True

    def __init__(self, from_logits: bool = False, ignore_class: int | None = None,
                 vocab_chunk: int | None = None, name: str | None = None,
                 reduction: str | None = "sum_over_batch_size") -> None:
        super().__init__(from_logits, name, reduction)
        if ignore_class is not None and (isinstance(ignore_class, bool)
                                         or not isinstance(ignore_class, int)):
            raise ConfigError(f"ignore_class={ignore_class!r} must be None or the int label "
                              "to leave out (e.g. -100 for prompt and padding tokens).")
        if vocab_chunk is not None and (isinstance(vocab_chunk, bool)
                                        or not isinstance(vocab_chunk, int) or vocab_chunk < 0):
            raise ConfigError(f"vocab_chunk={vocab_chunk!r} must be None (the model's chunk), "
                              "0 (whole logits) or a positive number of vocabulary entries.")
        self.ignore_class, self.vocab_chunk = ignore_class, vocab_chunk

    def per_example(self, y_true, y_pred, from_logits=None):
        logits = self.from_logits if from_logits is None else from_logits
        return sparse_categorical_crossentropy(y_true, y_pred, logits, self.ignore_class,
                                               self.vocab_chunk)

    def values(self, y_true: jax.Array, y_pred: Any, from_logits: bool | None = None
               ) -> jax.Array:
        """One value per label, unreduced (fit()'s masked path takes them from LMLogits
        without materializing the logits)."""
        logits = self.from_logits if from_logits is None else from_logits
        return sparse_crossentropy_values(y_true, y_pred, logits, self.ignore_class,
                                          self.vocab_chunk)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> jax.Array:
        if self.ignore_class is None:
            return super().__call__(y_true, y_pred, sample_weight)
        y = jnp.asarray(y_true)
        if not isinstance(y_pred, LMLogits):
            y_pred = jnp.asarray(y_pred)
        values = self.values(y, y_pred)
        keep = (y[..., 0] if y.ndim == y_pred.ndim else y) != self.ignore_class
        weights = keep.astype(values.dtype)
        if sample_weight is not None:  # (batch,) or one per label
            w = jnp.asarray(sample_weight, values.dtype)
            weights = weights * w.reshape(w.shape + (1,) * (values.ndim - w.ndim))
        # Keras's apply_mask: the ignored labels are a mask; the mean reductions divide by
        # the labels not ignored, "mean_with_sample_weight" by their weights; none gives 0.
        if self.reduction in (None, "none"):
            return values * weights
        total = (values * weights).sum()
        if self.reduction == "sum":
            return total
        divisor = (weights.sum() if self.reduction == "mean_with_sample_weight"
                   else keep.sum().astype(values.dtype))
        return jnp.where(divisor != 0, total / jnp.where(divisor != 0, divisor, 1.0), 0.0)

    def get_config(self) -> dict:
        extra = {} if self.vocab_chunk is None else {"vocab_chunk": self.vocab_chunk}
        return {"ignore_class": self.ignore_class, **extra, **super().get_config()}


class _SmoothedCrossentropy(_Crossentropy):
    def __init__(self, from_logits: bool = False, label_smoothing: float = 0.0,
                 name: str | None = None,
                 reduction: str | None = "sum_over_batch_size") -> None:
        super().__init__(from_logits, name, reduction)
        self.label_smoothing = _smoothing(label_smoothing)

    def get_config(self) -> dict:
        return {"label_smoothing": self.label_smoothing, **super().get_config()}


class CategoricalCrossentropy(_SmoothedCrossentropy):
    """One-hot (or soft) labels against one probability (or logit) per class."""

    expects, labels = "softmax", "dense"

    def per_example(self, y_true, y_pred, from_logits=None):
        logits = self.from_logits if from_logits is None else from_logits
        return categorical_crossentropy(y_true, y_pred, logits, self.label_smoothing)


class BinaryCrossentropy(_SmoothedCrossentropy):
    """0/1 labels against one probability (or logit) per output."""

    expects, labels = "sigmoid", "dense"

    def per_example(self, y_true, y_pred, from_logits=None):
        logits = self.from_logits if from_logits is None else from_logits
        return binary_crossentropy(y_true, y_pred, logits, self.label_smoothing)


class MeanSquaredError(Loss):
    def per_example(self, y_true, y_pred, from_logits=None):
        return mean_squared_error(y_true, y_pred)


class MeanAbsoluteError(Loss):
    def per_example(self, y_true, y_pred, from_logits=None):
        return mean_absolute_error(y_true, y_pred)


class Huber(Loss):
    def __init__(self, delta: float = 1.0, name: str | None = None,
                 reduction: str | None = "sum_over_batch_size") -> None:
        super().__init__(name, reduction)
        if not isinstance(delta, int | float) or delta <= 0:
            raise ConfigError(f"Huber(delta={delta!r}): delta must be a positive number.")
        self.delta = float(delta)

    def per_example(self, y_true, y_pred, from_logits=None):
        return huber(y_true, y_pred, self.delta)

    def get_config(self) -> dict:
        return {"delta": self.delta, **super().get_config()}


class LossFunctionWrapper(Loss):
    """A user callable `(y_true, y_pred) -> per-example losses (or a scalar)`."""

    labels = "any"

    def __init__(self, fn: Callable[..., jax.Array], name: str | None = None,
                 reduction: str | None = "sum_over_batch_size") -> None:
        super().__init__(name or getattr(fn, "__name__", "custom"), reduction)
        self.fn = fn

    def values_per_example(self, y_true, y_pred):
        shape = jax.eval_shape(self.fn, y_true, y_pred).shape
        if not shape:  # one number for the batch: Keras reduces nothing, "sum" included
            return 1.0 / y_pred.shape[0]
        return math.prod(shape[1:])

    def per_example(self, y_true, y_pred, from_logits=None):
        out = jnp.asarray(self.fn(y_true, y_pred))
        if out.ndim == 0:
            return jnp.broadcast_to(out, (y_pred.shape[0],))
        return per_example_mean(out)

    def get_config(self) -> dict:
        raise ConfigError(f"loss {self.name!r} is a Python function: it cannot be saved as a "
                          "config; compile the loaded model with it again.")


REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", "none")


def check_reduction(value: Any, owner: str) -> str | None:
    """Keras's reductions ("auto", tf.keras 2's name for the default, is taken as it)."""
    if value == "auto":
        return "sum_over_batch_size"
    if value is not None and value not in REDUCTIONS:
        raise ConfigError(f"{owner}(reduction={value!r}): valid reductions are "
                          f"{', '.join(REDUCTIONS)} or None (Keras's).")
    return value


def _smoothing(value: Any) -> float:
    if not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ConfigError(f"label_smoothing={value!r} must be in [0, 1).")
    return float(value)


# Keras's names; the value builds a fresh object (losses carry their own settings).
LOSSES: dict[str, Callable[[], Loss]] = {
    "sparse_categorical_crossentropy": SparseCategoricalCrossentropy,
    "categorical_crossentropy": CategoricalCrossentropy,
    "binary_crossentropy": BinaryCrossentropy,
    "mean_squared_error": MeanSquaredError,
    "mse": lambda: MeanSquaredError(name="mse"),
    "mean_absolute_error": MeanAbsoluteError,
    "mae": lambda: MeanAbsoluteError(name="mae"),
    "huber": Huber,
}
CLASSES: dict[str, type[Loss]] = {c.__name__: c for c in (
    SparseCategoricalCrossentropy, CategoricalCrossentropy, BinaryCrossentropy,
    MeanSquaredError, MeanAbsoluteError, Huber)}


def get(loss: str | Loss | Callable[..., jax.Array]) -> Loss:
    """A Keras loss name, a Loss object, or a callable `(y_true, y_pred) -> losses`."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, type) and issubclass(loss, Loss):
        return loss()
    if isinstance(loss, str):
        make = LOSSES.get(loss) or CLASSES.get(loss)
        if make is None:
            raise ConfigError(f"unknown loss {loss!r}; valid names: {', '.join(sorted(LOSSES))}, "
                              "or a pk.losses object, or a callable (y_true, y_pred) -> losses.")
        return make()
    if callable(loss):
        return LossFunctionWrapper(loss)
    raise ConfigError(f"loss={loss!r} is neither a loss name, a pk.losses object nor a callable.")


def serialize(loss: Loss) -> dict:
    return serialization.to_config(loss, CLASSES, "loss")


def deserialize(config: dict) -> Loss:
    return serialization.from_config(config, CLASSES, "loss")
