"""Classes of the user's that Keras files name: Keras's `register_keras_serializable`.

Keras writes a registered class as `registered_name` "package>Name"; loading finds it in the
registry (podkit.serialization's, which podkit's own saved configs read too) or in
load_model's `custom_objects`, and nowhere else: a file never names code to import.
"""

from __future__ import annotations

from collections.abc import Callable

from podkit.serialization import register, registered, registered_name

__all__ = ["register_keras_serializable", "registered", "registered_name"]


def register_keras_serializable(package: str = "Custom", name: str | None = None
                                ) -> Callable[[type], type]:
    """Keras's decorator: `@register_keras_serializable(package="my")` on a pk.Model
    subclass or a pk.layers.Layer subclass lets a `.keras` file that names it
    ("my>ClassName", as Keras's own decorator names the Keras class) load as it, and saves
    it under that name (in `.keras` files and in podkit's own directories)."""
    def decorate(cls: type) -> type:
        register(f"{package}>{name or cls.__name__}", cls)
        return cls
    return decorate
