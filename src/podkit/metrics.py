"""Metrics as in Keras 3, under their Keras names, kept as additive sums on the device.

A metric's state is a dict of sums (`update` returns one batch's contribution: totals and
counts, confusion counts, per-threshold histograms), so the compiled step only adds, a window
of steps is a difference of two sums, and `result(sums)` turns sums into the value on the host
when the loop logs. Nothing is fetched per step.

Names: `compile(metrics=["accuracy"])` logs "accuracy", `["acc"]` logs "acc" (as Keras: the key
is what you wrote), a metric object logs its `name`.

A language model's LMLogits (the GPT in training): the accuracies that only need the argmax
(`accuracy`, `sparse_categorical_accuracy`, `categorical_accuracy`: `lazy_logits = True`) take
it chunk by chunk over the vocabulary; every other metric gets the logits materialized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from podkit import losses as losses_lib
from podkit import serialization
from podkit.errors import ConfigError
from podkit.kernels.cross_entropy import LMLogits, materialize

Sums = dict[str, jax.Array]


def _argmax(y_pred: jax.Array | LMLogits) -> jax.Array:
    """argmax over the last dim; LMLogits chunk by chunk (the (..., vocab) never exists)."""
    return y_pred.argmax() if isinstance(y_pred, LMLogits) else jnp.argmax(y_pred, axis=-1)


# -- per-example metric functions ------------------------------------------------------------
def sparse_categorical_accuracy(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    if y_true.ndim == y_pred.ndim:
        y_true = y_true[..., 0]
    hit = _argmax(y_pred) == y_true.astype(jnp.int32)
    return losses_lib.per_example_mean(hit.astype(jnp.float32))


def categorical_accuracy(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    hit = _argmax(y_pred) == jnp.argmax(y_true, axis=-1)
    return losses_lib.per_example_mean(hit.astype(jnp.float32))


def binary_accuracy(y_true: jax.Array, y_pred: jax.Array, threshold: float = 0.5) -> jax.Array:
    hit = (y_pred > threshold) == (y_true.reshape(y_pred.shape) > 0.5)
    return losses_lib.per_example_mean(hit.astype(jnp.float32))


def accuracy(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
    """Keras 3's "accuracy": binary for one output unit, sparse for class-id labels,
    categorical for one-hot labels (decided from the shapes when the step is traced)."""
    if y_pred.shape[-1] == 1:
        return binary_accuracy(y_true, materialize(y_pred))
    if y_true.ndim < y_pred.ndim or y_true.shape[-1] == 1:
        return sparse_categorical_accuracy(y_true, y_pred)
    return categorical_accuracy(y_true, y_pred)


def sparse_top_k_categorical_accuracy(y_true: jax.Array, y_pred: jax.Array,
                                      k: int = 5) -> jax.Array:
    if y_true.ndim == y_pred.ndim:
        y_true = y_true[..., 0]
    top = jax.lax.top_k(y_pred, k)[1]
    hit = (top == y_true.astype(jnp.int32)[..., None]).any(axis=-1)
    return losses_lib.per_example_mean(hit.astype(jnp.float32))


def top_k_categorical_accuracy(y_true: jax.Array, y_pred: jax.Array, k: int = 5) -> jax.Array:
    return sparse_top_k_categorical_accuracy(jnp.argmax(y_true, axis=-1), y_pred, k)


# The functions that read predictions only through `_argmax` (and their shapes).
_ARGMAX_ONLY = (sparse_categorical_accuracy, categorical_accuracy, accuracy)


# -- the classes ------------------------------------------------------------------------------
class Metric:
    """Base class. `update(y_true, y_pred, weight) -> Sums` (one batch's additive
    contribution, weight 0 for padding) and `result(sums) -> float` on the host."""

    direction = "up"  # for EarlyStopping(mode="auto"): bigger is better
    labels = "dense"  # what y_true must look like: "sparse" | "dense" | "any"
    lazy_logits = False  # update() takes LMLogits (else they are materialized first)

    def __init__(self, name: str | None = None) -> None:
        self.name = name or serialization.snake_case(type(self).__name__)

    def zeros(self) -> dict[str, np.ndarray]:
        """The sums before any batch (shapes fixed by the metric, not by the data)."""
        return {"total": np.zeros((), np.float32), "count": np.zeros((), np.float32)}

    def update(self, y_true: jax.Array, y_pred: jax.Array, weight: jax.Array) -> Sums:
        raise NotImplementedError

    def result(self, sums: dict[str, Any]) -> float:
        raise NotImplementedError

    def get_config(self) -> dict:
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: dict) -> Metric:
        return cls(**config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class MeanMetricWrapper(Metric):
    """The weighted mean of a per-example function: accuracy, mae, ..."""

    def __init__(self, fn: Callable[[jax.Array, jax.Array], jax.Array], name: str,
                 direction: str = "up", labels: str = "dense") -> None:
        super().__init__(name)
        self.fn, self.direction, self.labels = fn, direction, labels
        self.lazy_logits = fn in _ARGMAX_ONLY

    def update(self, y_true, y_pred, weight):
        values = self.fn(y_true, y_pred)
        return {"total": (values * weight).sum(), "count": weight.sum()}

    def result(self, sums):
        return float(sums["total"]) / max(float(sums["count"]), 1e-12)


def _per_example(fn: Callable) -> Callable:
    """A user's metric function, its values reduced to one per example (Keras averages every
    value; a weighted mean over examples needs them per example)."""
    def per_example(y_true: jax.Array, y_pred: jax.Array) -> jax.Array:
        values = jnp.asarray(fn(y_true, y_pred), jnp.float32)
        if values.ndim == 0:
            return jnp.broadcast_to(values, y_pred.shape[:1])
        return values.reshape(values.shape[0], -1).mean(-1)
    per_example.__name__ = getattr(fn, "__name__", "metric")
    return per_example


class _Named(MeanMetricWrapper):
    """A Keras metric class over a function, its name defaulting to the class's."""

    fn_: Callable
    direction_ = "up"
    labels_ = "dense"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(type(self).fn_, name or serialization.snake_case(type(self).__name__),
                         self.direction_, self.labels_)


class SparseCategoricalAccuracy(_Named):
    fn_ = staticmethod(sparse_categorical_accuracy)
    labels_ = "sparse"


class CategoricalAccuracy(_Named):
    fn_ = staticmethod(categorical_accuracy)


class BinaryAccuracy(MeanMetricWrapper):
    def __init__(self, name: str | None = None, threshold: float = 0.5) -> None:
        self.threshold = float(threshold)
        super().__init__(lambda y, p: binary_accuracy(y, p, self.threshold),
                         name or "binary_accuracy")

    def get_config(self):
        return {"threshold": self.threshold, **super().get_config()}


class SparseTopKCategoricalAccuracy(MeanMetricWrapper):
    def __init__(self, k: int = 5, name: str | None = None) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"SparseTopKCategoricalAccuracy(k={k!r}): k must be a positive int.")
        self.k = k
        super().__init__(lambda y, p: sparse_top_k_categorical_accuracy(y, p, self.k),
                         name or "sparse_top_k_categorical_accuracy", labels="sparse")

    def get_config(self):
        return {"k": self.k, **super().get_config()}


class TopKCategoricalAccuracy(MeanMetricWrapper):
    def __init__(self, k: int = 5, name: str | None = None) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"TopKCategoricalAccuracy(k={k!r}): k must be a positive int.")
        self.k = k
        super().__init__(lambda y, p: top_k_categorical_accuracy(y, p, self.k),
                         name or "top_k_categorical_accuracy")

    def get_config(self):
        return {"k": self.k, **super().get_config()}


class MeanAbsoluteError(_Named):
    fn_ = staticmethod(losses_lib.mean_absolute_error)
    direction_ = "down"


class MeanSquaredError(_Named):
    fn_ = staticmethod(losses_lib.mean_squared_error)
    direction_ = "down"


class RootMeanSquaredError(Metric):
    direction = "down"

    def update(self, y_true, y_pred, weight):
        sq = losses_lib.mean_squared_error(y_true, y_pred)
        return {"total": (sq * weight).sum(), "count": weight.sum()}

    def result(self, sums):
        return float(np.sqrt(float(sums["total"]) / max(float(sums["count"]), 1e-12)))


def _binary_inputs(y_true: jax.Array, y_pred: jax.Array, weight: jax.Array):
    """Flatten (B, ...) labels and predictions to per-entry values with per-entry weights,
    as Keras's confusion metrics treat every entry as one binary decision."""
    pred = y_pred.reshape(y_pred.shape[0], -1)
    true = (y_true.reshape(pred.shape) > 0.5).astype(jnp.float32)
    w = jnp.broadcast_to(weight[:, None], pred.shape)
    return true.reshape(-1), pred.reshape(-1), w.reshape(-1)


class Precision(Metric):
    """tp / (tp + fp) at `thresholds` (default 0.5), every output entry a binary decision."""

    def __init__(self, thresholds: float | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.thresholds = 0.5 if thresholds is None else float(thresholds)

    def _counts(self, y_true, y_pred, weight):
        t, p, w = _binary_inputs(y_true, y_pred, weight)
        pos = (p > self.thresholds).astype(jnp.float32)
        return {"tp": (pos * t * w).sum(), "fp": (pos * (1 - t) * w).sum(),
                "fn": ((1 - pos) * t * w).sum()}

    def zeros(self):
        return {"tp": np.zeros((), np.float32), "fp": np.zeros((), np.float32)}

    def update(self, y_true, y_pred, weight):
        c = self._counts(y_true, y_pred, weight)
        return {"tp": c["tp"], "fp": c["fp"]}

    def result(self, sums):
        tp, fp = float(sums["tp"]), float(sums["fp"])
        return tp / (tp + fp) if tp + fp > 0 else 0.0

    def get_config(self):
        return {"thresholds": self.thresholds, **super().get_config()}


class Recall(Precision):
    """tp / (tp + fn) at `thresholds` (default 0.5)."""

    def zeros(self):
        return {"tp": np.zeros((), np.float32), "fn": np.zeros((), np.float32)}

    def update(self, y_true, y_pred, weight):
        c = self._counts(y_true, y_pred, weight)
        return {"tp": c["tp"], "fn": c["fn"]}

    def result(self, sums):
        tp, fn = float(sums["tp"]), float(sums["fn"])
        return tp / (tp + fn) if tp + fn > 0 else 0.0


def _two_class(y_true: Any, y_pred: Any) -> bool:
    """Class ids (batch, ...) or (batch, ..., 1) against two-class outputs (batch, ..., 2)."""
    return (y_pred.ndim >= 2 and y_pred.shape[-1] == 2
            and tuple(y_true.shape) in (y_pred.shape[:-1], (*y_pred.shape[:-1], 1)))


class AUC(Metric):
    """Area under the ROC (or PR) curve from confusion counts at `num_thresholds` thresholds,
    Keras's estimate (trapezoids for ROC, Davis & Goadrich interpolation for PR). With class
    ids and a two-class output (a softmax classifier), the positive class's probability is
    scored. `from_logits=True` reads the model's raw outputs and applies the sigmoid (the
    softmax's second column for two classes) itself, as Keras; without it the metric sees
    probabilities, which podkit derives from a `from_logits` loss.)"""

    labels = "two_class_or_dense"

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC", from_logits: bool = False,
                 name: str | None = None) -> None:
        super().__init__(name or "auc")
        if not isinstance(num_thresholds, int) or num_thresholds < 2:
            raise ConfigError(f"AUC(num_thresholds={num_thresholds!r}) must be an int > 1.")
        if curve not in ("ROC", "PR"):
            raise ConfigError(f"AUC(curve={curve!r}); valid values: 'ROC', 'PR'.")
        self.num_thresholds, self.curve, self.from_logits = num_thresholds, curve, from_logits
        eps = 1e-7
        inner = [(i + 1) / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self._thresholds = np.asarray([0.0 - eps, *inner, 1.0 + eps], np.float32)

    def zeros(self):
        return {k: np.zeros(self.num_thresholds, np.float32) for k in ("tp", "fp", "tn", "fn")}

    def update(self, y_true, y_pred, weight):
        if _two_class(y_true, y_pred):  # class ids against two columns: the positive class
            y_pred = (jax.nn.sigmoid(y_pred[..., 1] - y_pred[..., 0]) if self.from_logits
                      else y_pred[..., 1])
            y_true = y_true.reshape(y_pred.shape)
        elif self.from_logits:
            y_pred = jax.nn.sigmoid(y_pred)
        t, p, w = _binary_inputs(y_true, y_pred, weight)
        above = (p[:, None] > jnp.asarray(self._thresholds)[None, :]).astype(jnp.float32)
        tw, fw = (t * w)[:, None], ((1 - t) * w)[:, None]
        return {"tp": (above * tw).sum(0), "fp": (above * fw).sum(0),
                "tn": ((1 - above) * fw).sum(0), "fn": ((1 - above) * tw).sum(0)}

    def result(self, sums):
        tp, fp, tn, fn = (np.asarray(sums[k], np.float64) for k in ("tp", "fp", "tn", "fn"))
        div = lambda a, b: np.divide(a, b, out=np.zeros_like(a), where=b != 0)
        if self.curve == "PR":
            return _interpolated_pr_auc(tp, fp, fn, div)
        recall, fpr = div(tp, tp + fn), div(fp, fp + tn)
        return float(np.sum((fpr[:-1] - fpr[1:]) * (recall[:-1] + recall[1:]) / 2))

    def get_config(self):
        return {"num_thresholds": self.num_thresholds, "curve": self.curve,
                "from_logits": self.from_logits, **super().get_config()}


def _interpolated_pr_auc(tp, fp, fn, div) -> float:
    dtp = tp[:-1] - tp[1:]
    p = tp + fp
    dp = p[:-1] - p[1:]
    slope = div(dtp, np.maximum(dp, 0))
    intercept = tp[1:] - slope * p[1:]
    both = (p[:-1] > 0) & (p[1:] > 0)
    ratio = np.where(both, div(p[:-1], np.maximum(p[1:], 0)), np.ones_like(p[1:]))
    increments = slope * (dtp + intercept * np.log(np.maximum(ratio, 1e-300)))
    return float(np.sum(div(increments, np.maximum(tp[1:] + fn[1:], 0))))


class LossMean(Metric):
    """A loss as a logged value: the weighted total over the real examples."""

    direction = "down"

    def __init__(self, name: str = "loss") -> None:
        super().__init__(name)

    def result(self, sums):
        return float(sums["total"]) / max(float(sums["count"]), 1e-12)


# -- lookup -----------------------------------------------------------------------------------
_FUNCTIONS: dict[str, tuple[Callable[[jax.Array, jax.Array], jax.Array], str, str]] = {
    # name -> (per-example function, direction, labels)
    "sparse_categorical_accuracy": (sparse_categorical_accuracy, "up", "sparse"),
    "categorical_accuracy": (categorical_accuracy, "up", "dense"),
    "binary_accuracy": (binary_accuracy, "up", "dense"),
    "sparse_top_k_categorical_accuracy": (sparse_top_k_categorical_accuracy, "up", "sparse"),
    "top_k_categorical_accuracy": (top_k_categorical_accuracy, "up", "dense"),
    "mean_squared_error": (losses_lib.mean_squared_error, "down", "dense"),
    "mse": (losses_lib.mean_squared_error, "down", "dense"),
    "mean_absolute_error": (losses_lib.mean_absolute_error, "down", "dense"),
    "mae": (losses_lib.mean_absolute_error, "down", "dense"),
}
_OBJECTS: dict[str, Callable[[str], Metric]] = {
    "auc": lambda n: AUC(name=n), "precision": lambda n: Precision(name=n),
    "recall": lambda n: Recall(name=n), "rmse": lambda n: RootMeanSquaredError(name=n),
    "root_mean_squared_error": lambda n: RootMeanSquaredError(name=n),
}
CLASSES: dict[str, type[Metric]] = {c.__name__: c for c in (
    SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy,
    SparseTopKCategoricalAccuracy, TopKCategoricalAccuracy, MeanAbsoluteError,
    MeanSquaredError, RootMeanSquaredError, Precision, Recall, AUC)}

def get(metric: str | Metric | type) -> Metric:
    """One metric: a Keras name or alias (logged under that name), a class or an object."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, type) and issubclass(metric, Metric):
        return metric()
    if callable(metric) and not isinstance(metric, type) and not isinstance(metric, str):
        # As Keras: a function (y_true, y_pred) -> per-example values, averaged over the
        # examples (weighted), logged under the function's name.
        name = getattr(metric, "__name__", None)
        if not name or name == "<lambda>":
            raise ConfigError(f"metric {metric!r} has no name to log it under; define it with "
                              "def, or wrap it: pk.metrics.MeanMetricWrapper(fn, name=...).")
        direction = "up" if any(k in name for k in ("acc", "auc", "precision", "recall")) \
            else "down"
        wrapped = MeanMetricWrapper(_per_example(metric), name, direction, "any")
        wrapped.model_outputs = True  # y_pred is what the model outputs, as Keras hands it
        return wrapped
    if not isinstance(metric, str):
        raise ConfigError(f"metric {metric!r} is not a name or a pk.metrics object; valid "
                          f"names: {valid_names()}.")
    if metric in ("accuracy", "acc"):  # as Keras 3: chosen by the shapes, logged as written
        return MeanMetricWrapper(accuracy, metric, "up", "any")
    if metric in _FUNCTIONS:
        fn, direction, labels = _FUNCTIONS[metric]
        return MeanMetricWrapper(fn, metric, direction, labels)
    if metric in _OBJECTS:
        return _OBJECTS[metric](metric)
    if metric in CLASSES:
        return CLASSES[metric]()
    raise ConfigError(f"unknown metric {metric!r}; valid names: {valid_names()}.")


def get_all(metrics: Sequence[str | Metric] | None) -> tuple[Metric, ...]:
    if metrics is None:
        return ()
    if isinstance(metrics, str | Metric):
        raise ConfigError(f"metrics={metrics!r} must be a list, e.g. metrics=[{metrics!r}].")
    out = tuple(get(m) for m in metrics)
    names = [m.name for m in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"metrics {sorted(dup)} appear more than once; give each a distinct "
                          "name.")
    return out


def valid_names() -> str:
    return ", ".join(["accuracy", "acc", *sorted(_FUNCTIONS), *sorted(_OBJECTS)])


def serialize(metric: Metric, spelled: Any) -> Any:
    """What compile() was given, in a form that JSON keeps: the name, or a class config."""
    if isinstance(spelled, str):
        return spelled
    return serialization.to_config(metric, CLASSES, "metric")


def deserialize(config: Any) -> str | Metric:
    if isinstance(config, str):
        return config
    return serialization.from_config(config, CLASSES, "metric")
