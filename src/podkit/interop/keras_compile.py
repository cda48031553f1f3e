"""Keras 3's `compile_config` (in a `.keras` file's config.json) as podkit's compile() and
back: the optimizer (with a learning-rate schedule), the losses and metrics, by class name.

As Keras's own loader, a class podkit lacks is an error when the model is loaded compiled
(`compile=True`, the default), naming it and what podkit has; `compile=False` loads the
architecture and weights without it.
"""

from __future__ import annotations

from typing import Any

from podkit import losses, metrics, optimizers
from podkit.errors import ConfigError
from podkit.interop.keras_config import keras_object, kwargs_for
from podkit.optimizers import schedules

# Keras arguments of optimizers, losses and metrics podkit lacks, at values that change
# nothing (besides None and False).
_NEUTRAL = {"reduction": ("sum_over_batch_size", "auto"), "axis": (-1,),
            "label_smoothing": (0.0, 0), "ema_momentum": (0.99,), "dtype": ("float32",)}


def _neutral(config: dict) -> dict:
    return {k: v for k, v in config.items() if v not in _NEUTRAL.get(k, ())}


def _from(entry: Any, classes: dict[str, type], what: str) -> Any:
    if not isinstance(entry, dict):
        return entry  # a name: podkit's compile() reads Keras's names
    name = entry.get("class_name")
    if isinstance(name, str) and name.startswith("Custom>"):  # tf.keras 2's optimizers
        name = name.removeprefix("Custom>")
    cls = classes.get(name or "")
    if cls is None:
        raise ConfigError(f"the Keras model was compiled with {what} {name!r}, which podkit "
                          f"does not have (podkit's: {', '.join(sorted(classes))}); load it "
                          "with compile=False and compile() it with one of those.")
    config = _neutral(dict(entry.get("config") or {}))

    def convert(key: str, value: Any) -> Any:
        if key == "learning_rate" and isinstance(value, dict):
            return _from(value, schedules.CLASSES, "learning-rate schedule")
        return value
    return cls(**kwargs_for(cls, config, f"the Keras {what} {name!r}", convert))


def _each(value: Any, classes: dict[str, type], what: str) -> Any:
    if isinstance(value, list):
        return [_each(v, classes, what) for v in value]
    if isinstance(value, dict) and "class_name" not in value:
        return {k: _each(v, classes, what) for k, v in value.items()}
    return None if value is None else _from(value, classes, what)


def compile_kwargs(config: dict) -> dict:
    """Keras's compile_config as the keyword arguments of podkit's compile()."""
    out = {"optimizer": _from(config.get("optimizer") or "rmsprop", optimizers.CLASSES,
                              "optimizer"),
           "loss": _each(config.get("loss"), losses.CLASSES, "loss"),
           "loss_weights": config.get("loss_weights"),
           "metrics": _each(config.get("metrics"), metrics.CLASSES, "metric"),
           "weighted_metrics": _each(config.get("weighted_metrics"), metrics.CLASSES,
                                     "metric")}
    steps = config.get("steps_per_execution")
    if isinstance(steps, int) and steps > 1:
        out["steps_per_execution"] = steps
    return out


def _to(entry: Any, module: str) -> Any:
    if isinstance(entry, list):
        return [_to(v, module) for v in entry]
    if isinstance(entry, dict) and "class_name" not in entry:
        return {k: _to(v, module) for k, v in entry.items()}
    if not isinstance(entry, dict):
        return entry
    config = dict(entry.get("config") or {})
    rate = config.get("learning_rate")
    if isinstance(rate, dict) and "class_name" in rate:
        config["learning_rate"] = keras_object("keras.optimizers.schedules", rate)
    return keras_object(module, {"class_name": entry["class_name"], "config": config})


def keras_compile_config(config: dict | None) -> dict | None:
    """podkit's compile config (model.compile_config()) as Keras 3's."""
    if config is None:
        return None
    return {"optimizer": _to(config.get("optimizer"), "keras.optimizers"),
            "loss": _to(config.get("loss"), "keras.losses"),
            "loss_weights": config.get("loss_weights"),
            "metrics": _to(config.get("metrics"), "keras.metrics"),
            "weighted_metrics": _to(config.get("weighted_metrics"), "keras.metrics"),
            "run_eagerly": False,
            # Keras 3 takes a count only: podkit's "auto" is Keras's default, 1.
            "steps_per_execution": (config.get("steps_per_execution") if isinstance(
                config.get("steps_per_execution"), int) else 1),
            "jit_compile": True}
