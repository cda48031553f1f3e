"""Objects as JSON configs by class name: what `model.save` writes for layers, losses,
metrics, optimizers and schedules.

Only classes of a fixed registry are read back, by name, from their constructor arguments: a
saved model never runs code from its files.
"""

from __future__ import annotations

import re
from typing import Any

from podkit.errors import ConfigError


def to_config(obj: Any, classes: dict[str, type], what: str) -> dict:
    name = type(obj).__name__
    if classes.get(name) is not type(obj):
        raise ConfigError(
            f"{what} {getattr(obj, 'name', obj)!r} ({name}) is not one of podkit's "
            f"({', '.join(sorted(classes))}), so it cannot be saved as a config: build and "
            "compile the model with it in code, then load_weights().")
    return {"class_name": name, "config": obj.get_config()}


def from_config(config: Any, classes: dict[str, type], what: str) -> Any:
    name = config.get("class_name") if isinstance(config, dict) else None
    cls = classes.get(name or "")
    if cls is None:
        raise ConfigError(f"unknown {what} {name!r} in a saved config; known: "
                          f"{', '.join(sorted(classes))}.")
    return cls.from_config(config.get("config") or {})


def snake_case(name: str) -> str:
    """Keras's default names: `SparseCategoricalAccuracy` -> `sparse_categorical_accuracy`,
    `Conv2D` -> `conv2d`."""
    # Keras's own rule (keras.src.utils.naming.to_snake_case): GlobalAveragePooling1D ->
    # global_average_pooling1d, SimpleRNN -> simple_rnn, PReLU -> p_re_lu.
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
