"""Models by name (`[model] name = "mlp"` in a config) and Keras's `load_model`."""

from __future__ import annotations

from typing import Any

from podkit.models.mlp import build_mlp

REGISTRY = {"mlp": build_mlp}

__all__ = ["REGISTRY", "build_mlp", "load_model"]


def load_model(path: Any, compile: bool = True) -> Any:  # noqa: A002 - Keras's name
    """The model saved by `model.save(path)`, on the current strategy and devices."""
    from podkit.saving import load_model as load

    return load(path, compile=compile)
