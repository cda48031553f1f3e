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


def load_model(path: Any, compile: bool = True) -> Any:  # Keras's name
    """The model saved by `model.save(path)`, on the current strategy and devices."""
    from podkit.model import Model
    from podkit.saving import load_model as load
    from podkit.sequential import Sequential

    def from_config(config: dict) -> Model:
        kind = Sequential if config.get("class_name") == "Sequential" else Model
        return kind.from_config(config)

    return load(path, from_config, compile=compile)
