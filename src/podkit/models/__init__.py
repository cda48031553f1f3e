"""Models by name (`[model] name = "mlp"` in a config) and Keras's `load_model`.

Each builder takes `(model config, data info, seed)` and returns an uncompiled pk.Model sized
by the data (classes, vocabulary, table rows come from `info`).
"""

from __future__ import annotations

import importlib
from typing import Any

from podkit.errors import ConfigError

# name -> (module, builder); modules load on use (the GPT's imports cost nothing to an MLP).
REGISTRY: dict[str, tuple[str, str]] = {
    "mlp": ("podkit.models.mlp", "build_mlp"),
    "gpt": ("podkit.models.gpt", "build_gpt"),
    "resnet": ("podkit.models.resnet", "build_resnet"),
    "dlrm": ("podkit.models.dlrm", "build_dlrm"),
}

__all__ = ["REGISTRY", "build_model", "load_model"]


def build_model(config: Any, info: dict, seed: int = 0) -> Any:
    """The model a `[model]` section names, sized by the data's `info`."""
    if config.name not in REGISTRY:
        raise ConfigError(f"model.name = {config.name!r}; valid names: {', '.join(REGISTRY)}.")
    module, builder = REGISTRY[config.name]
    return getattr(importlib.import_module(module), builder)(config, info, seed=seed)


def _from_config(config: dict) -> Any:
    """A Sequential or functional model from `{"class_name", "config"}`."""
    from podkit.model import Model
    from podkit.sequential import Sequential

    kind = Sequential if config.get("class_name") == "Sequential" else Model
    return kind.from_config(config)


def load_model(path: Any, compile: bool = True) -> Any:  # Keras's name
    """The model saved by `model.save(path)`, on the current strategy and devices."""
    from podkit.saving import load_model as load

    return load(path, _from_config, compile=compile)


def model_from_json(json_string: str) -> Any:  # Keras's name
    """A new (uncompiled) model from `model.to_json()`: the architecture, fresh weights."""
    import json

    try:
        config = json.loads(json_string)
    except (TypeError, json.JSONDecodeError) as e:
        raise ConfigError(f"model_from_json takes what model.to_json() returned; this is not "
                          f"JSON ({e}).") from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise ConfigError("model_from_json takes what model.to_json() returned: a JSON object "
                          "with class_name and config.")
    return _from_config(config)


def clone_model(model: Any) -> Any:  # Keras's name
    """A new model of the same architecture with fresh weights and new layers (Keras's
    clone_model): Sequential and functional models from their config; a subclass through
    its get_config()/from_config."""
    from podkit.model import Model

    if not isinstance(model, Model):
        raise ConfigError(f"clone_model takes a pk.Model; got {type(model).__name__}.")
    if model.kind in ("Sequential", "Functional"):
        return _from_config({"class_name": model.kind, "config": model.get_config()})
    return type(model).from_config(model.get_config())
