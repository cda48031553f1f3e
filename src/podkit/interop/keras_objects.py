"""Classes of the user's that Keras files name: Keras's `register_keras_serializable`.

Keras writes a registered class as `registered_name` "package>Name"; loading finds it in this
registry (or in load_model's `custom_objects`), and nowhere else: a file never names code to
import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_REGISTERED: dict[str, type] = {}


def register_keras_serializable(package: str = "Custom", name: str | None = None
                                ) -> Callable[[type], type]:
    """Keras's decorator: `@register_keras_serializable(package="my")` on a pk.Model
    subclass (or a layer) lets a `.keras` file that names it ("my>ClassName") load as it."""
    def register(cls: type) -> type:
        key = f"{package}>{name or cls.__name__}"
        _REGISTERED[key] = cls
        return cls
    return register


def registered(key: str | None) -> Any:
    """The class registered under `key` ("package>Name"), or None."""
    return _REGISTERED.get(key or "")


def registered_name(cls: type) -> str | None:
    """The name a registered class is saved under, or None."""
    for key, value in _REGISTERED.items():
        if value is cls:
            return key
    return None
