"""Other libraries' model files, each format its own module: Keras 3's `.keras` and
`.weights.h5` (keras_archive, keras_weights, keras_config, keras_compile; keras_objects the
user's registered classes, keras_builtins Keras's own layer names, keras_text a model's
TextVectorization split off) and tf.keras's legacy `.h5` (keras_h5). `Model.save` /
`save_weights` / `load_weights` and `pk.models.load_model` dispatch here by the path's suffix
(`suffix_format`)."""

from __future__ import annotations

from typing import Any

from podkit.interop.keras_objects import register_keras_serializable

__all__ = ["is_keras_config", "load_model", "load_text_vectorization", "load_weights",
           "model_from_keras_config", "register_keras_serializable", "save_model",
           "save_weights", "suffix_format"]


def suffix_format(path: Any) -> str | None:
    """"keras" (a `.keras` file), "weights.h5" (Keras 3's weights file), "h5" (tf.keras's
    legacy HDF5 file), or None: podkit's own directory format."""
    name = str(path).rstrip("/").lower()
    if name.endswith(".keras"):
        return "keras"
    if name.endswith(".weights.h5"):
        return "weights.h5"
    if name.endswith((".h5", ".hdf5")):
        return "h5"
    return None


def is_keras_config(config: Any) -> bool:
    """Whether a model config is Keras's (`keras_model.get_config()`, or a `.keras` file's
    config.json) rather than podkit's own: Keras lists InputLayers and graph nodes."""
    body = config.get("config", config) if isinstance(config, dict) else None
    if not isinstance(body, dict):
        return False
    layers = body.get("layers")
    return "input_layers" in body or (isinstance(layers, list) and any(
        isinstance(e, dict) and ("module" in e or e.get("class_name") == "InputLayer")
        for e in layers))


def model_from_keras_config(config: dict, custom_objects: dict[str, Any] | None = None
                            ) -> Any:
    """A new podkit model from Keras's model config, `{"class_name", "config"}` or the
    inner dict of a functional model (with `input_layers`) or a Sequential."""
    from podkit.interop import keras_config

    if "class_name" not in config:
        kind = "Functional" if "input_layers" in config else "Sequential"
        config = {"class_name": kind, "config": config}
    return keras_config.model_from_keras(config, custom_objects)


def load_model(path: Any, compile: bool = True,
               custom_objects: dict[str, Any] | None = None) -> Any:
    """A `.keras` or legacy `.h5` model file as a podkit model."""
    from podkit.interop import keras_archive, keras_h5

    kind = suffix_format(path)
    if kind == "keras":
        return keras_archive.load_model(path, compile, custom_objects)
    if kind == "h5":
        return keras_h5.load_model(path, compile, custom_objects)
    from podkit.errors import ConfigError

    raise ConfigError(f"{path} is a weights file (.weights.h5): build the model in code and "
                      "call model.load_weights(path), as in Keras.")


def load_text_vectorization(path: Any, name: str | None = None) -> Any:
    """The TextVectorization of the Keras model saved at `path` (a `.keras` file), as
    podkit's pk.layers.TextVectorization with the file's vocabulary, for the input
    pipeline: load_model splits it off the model, which takes its ids (strings never enter
    XLA). `name` picks one where the model has several."""
    from podkit.errors import ConfigError
    from podkit.interop import keras_archive

    if suffix_format(path) != "keras":
        raise ConfigError(f"load_text_vectorization({str(path)!r}) reads a .keras file (Keras "
                          "3 keeps an adapted vocabulary in its assets).")
    return keras_archive.load_text_vectorization(path, name)


def load_weights(model: Any, path: Any) -> None:
    from podkit.interop import keras_archive, keras_h5

    if suffix_format(path) == "h5":
        keras_h5.load_weights(model, path)
    else:
        keras_archive.load_weights(model, path)


def save_model(model: Any, path: Any) -> None:
    from podkit.errors import ConfigError
    from podkit.interop import keras_archive

    if suffix_format(path) != "keras":
        raise ConfigError(f"model.save({str(path)!r}): podkit writes Keras's .keras format "
                          "(or its own directory for a path without a suffix), not the "
                          "legacy HDF5 model format; save to a .keras path (Keras 3 "
                          "recommends it too).")
    keras_archive.save_model(model, path)


def save_weights(model: Any, path: Any) -> None:
    from podkit.errors import ConfigError
    from podkit.interop import keras_archive

    if suffix_format(path) != "weights.h5":
        raise ConfigError(f"model.save_weights({str(path)!r}): a Keras weights file's name "
                          "ends in .weights.h5 (as Keras 3 requires); a path without a "
                          "suffix is podkit's own directory.")
    keras_archive.save_weights(model, path)
