"""Objects as JSON configs by class name: what `model.save` writes for layers, losses,
metrics, optimizers and schedules.

Only classes of a fixed registry are read back, by name, from their constructor arguments: a
saved model never runs code from its files.
"""

from __future__ import annotations

import re
from typing import Any

from podkit.errors import ConfigError

_REGISTERED: dict[str, type] = {}


def register(key: str, cls: type) -> None:
    """Register a class of the user's under `key` ("package>Name"): Keras's
    `register_keras_serializable` (pk.interop's decorator calls this). A saved config names
    it by that key, and loading finds it here: code the user imported, never a file's."""
    _REGISTERED[key] = cls


def registered(key: str | None) -> Any:
    """The class registered under `key` ("package>Name"), or None."""
    return _REGISTERED.get(key or "")


def registered_name(cls: type) -> str | None:
    """The key a registered class is saved under, or None."""
    for key, value in _REGISTERED.items():
        if value is cls:
            return key
    return None


def to_config(obj: Any, classes: dict[str, type], what: str) -> dict:
    name = type(obj).__name__
    if classes.get(name) is not type(obj):
        key = registered_name(type(obj))
        if key is not None:  # a class of the user's, by its registered name (as Keras)
            return {"class_name": name, "registered_name": key, "config": obj.get_config()}
        raise ConfigError(
            f"{what} {getattr(obj, 'name', obj)!r} ({name}) is not one of podkit's "
            f"({', '.join(sorted(classes))}), so it cannot be saved as a config: register "
            "your class with @pk.interop.register_keras_serializable(package=...), or build "
            "and compile the model with it in code, then load_weights().")
    return {"class_name": name, "config": obj.get_config()}


def from_config(config: Any, classes: dict[str, type], what: str) -> Any:
    name = config.get("class_name") if isinstance(config, dict) else None
    key = config.get("registered_name") if isinstance(config, dict) else None
    cls = registered(key) if key else classes.get(name or "")
    if cls is None and key:
        raise ConfigError(f"the saved config's {what} {name!r} is the class registered as "
                          f"{key!r}, and no class is registered under that name here: import "
                          "the code that registers it (@pk.interop.register_keras_serializable"
                          ") before loading.")
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


#: Keras's serialized dtype policies (keras/src/dtype_policies): `DTypePolicy` in Keras 3,
#: `FloatDTypePolicy` in Keras 3.0-3.3, `Policy` in tf.keras 2's mixed precision.
DTYPE_POLICIES = ("DTypePolicy", "FloatDTypePolicy", "Policy")


def dtype_name(value: Any) -> Any:
    """A dtype as Keras writes one: a name ("float32"), a numpy/JAX dtype, or a serialized
    dtype policy (`{"module": "keras", "class_name": "DTypePolicy", "config": {"name":
    "float32"}, ...}`, what every Keras 3 layer's config holds) as the policy's name
    ("mixed_bfloat16" for a mixed one); anything else as it is. Another dict (a quantized
    policy, a policy map) is a ConfigError naming it."""
    if not isinstance(value, dict):
        return value
    name = (value.get("config") or {}).get("name")
    if value.get("class_name") not in DTYPE_POLICIES or not isinstance(name, str):
        raise ConfigError(f"dtype {value!r} is not a Keras dtype policy podkit reads (a "
                          f"{', '.join(DTYPE_POLICIES)} holding a name such as 'float32').")
    return name


def keras_dtype_policy(name: str = "float32") -> dict:
    """Keras 3's serialized `DTypePolicy(name)`, as its layers' configs hold it."""
    return {"module": "keras", "class_name": "DTypePolicy", "config": {"name": name},
            "registered_name": None}
