"""Keras 3's `.keras` file and `.weights.h5` file, read into podkit models and written from
them.

A `.keras` file is a zip (keras/src/saving/saving_lib.py): `metadata.json` (Keras's version,
the date), `config.json` (the model's serialized config with its `compile_config`) and
`model.weights.h5` (the variables, laid out as keras_weights.py says). Files are read and
written through podkit.paths, so a `gs://` or `s3://` path works as a local one; a write is
put in place whole, or not at all.
"""

from __future__ import annotations

import datetime
import io
import json
import zipfile
from typing import Any

from podkit import paths
from podkit._version import __version__
from podkit.errors import ConfigError
from podkit.interop import keras_compile, keras_config, keras_text, keras_weights

CONFIG, METADATA, WEIGHTS = "config.json", "metadata.json", "model.weights.h5"
#: the Keras version whose files these are checked against (tests/interop)
KERAS_VERSION = "3.15.1"


def _h5() -> Any:
    import h5py  # only when a Keras file is read or written

    return h5py


def _built(model: Any, build_config: dict | None) -> Any:
    if not model.built:
        shape = (build_config or {}).get("input_shape")
        if shape is not None and model.kind == "Subclass":
            model.build(tuple(shape[1:]))  # Keras's shape has the batch dim, podkit's not
        else:
            model.build()
    return model


def _read_archive(path: Any) -> tuple[dict, bytes]:
    with paths.local_copy(path) as local:
        try:
            with zipfile.ZipFile(local) as z:
                names = z.namelist()
                if CONFIG not in names:
                    raise ConfigError(f"{path} is a zip without {CONFIG}: not a Keras 3 "
                                      ".keras file.")
                config = json.loads(z.read(CONFIG))
                if WEIGHTS not in names:
                    raise ConfigError(f"{path} holds no {WEIGHTS} (found: {names}); podkit "
                                      "reads .keras files with unsharded h5 weights, as "
                                      "model.save() writes them.")
                weights = z.read(WEIGHTS)
        except zipfile.BadZipFile as e:
            raise ConfigError(f"{path} is not a .keras file (a zip): {e}.") from e
    return config, weights


def load_model(path: Any, compile: bool = True,
               custom_objects: dict[str, Any] | None = None) -> Any:
    """The Keras 3 model saved at `path` (a `.keras` file) as a podkit model: its
    architecture, its weights, and (compile=True) compiled as it was, with a fresh
    optimizer state."""
    config, weights = _read_archive(path)
    model = keras_config.model_from_keras(config, custom_objects)
    _built(model, config.get("build_config"))
    with _h5().File(io.BytesIO(weights), "r") as f:
        keras_weights.read_into(model, f, f"{path} ({WEIGHTS})")
    compile_config = config.get("compile_config")
    if compile and compile_config:
        model.compile(**keras_compile.compile_kwargs(compile_config))
    return model


def load_text_vectorization(path: Any, name: str | None = None) -> Any:
    """The TextVectorization layer (the one called `name`, or the only one) of the Keras
    model saved at `path`, as podkit's, with the file's vocabulary: what load_model split
    off the model (podkit.interop.keras_text), for the input pipeline."""
    with paths.local_copy(path) as local:
        try:
            with zipfile.ZipFile(local) as z:
                config = json.loads(z.read(CONFIG))
                groups = keras_text.asset_groups(config)
                entries = {keras_text.entry_name(e): e
                           for e in (config.get("config") or {}).get("layers") or []
                           if e.get("class_name") == keras_text.CLASS}
                entry = keras_text.choose(entries, name, str(path))
                asset = f"assets/{groups[keras_text.entry_name(entry)]}/vocabulary.txt"
                vocabulary = z.read(asset).decode() if asset in z.namelist() else None
        except (zipfile.BadZipFile, KeyError) as e:
            raise ConfigError(f"{path} is not a Keras 3 .keras file (a zip with "
                              f"{CONFIG}): {e}.") from e
    return keras_text.layer_from_keras(entry, vocabulary, str(path))


def load_weights(model: Any, path: Any) -> None:
    """`model.load_weights("x.weights.h5")` (or a `.keras` file's weights), Keras's layout."""
    # interop.suffix_format's test (that package imports this module: no import back)
    if str(path).rstrip("/").lower().endswith(".keras"):
        _, weights = _read_archive(path)
        with _h5().File(io.BytesIO(weights), "r") as f:
            keras_weights.read_into(model, f, f"{path} ({WEIGHTS})")
        return
    with paths.local_copy(path) as local, _h5().File(local, "r") as f:
        keras_weights.read_into(model, f, str(path))


def save_weights(model: Any, path: Any) -> None:
    """`model.save_weights("x.weights.h5")`: a file Keras 3's `load_weights` reads."""
    with paths.staged(path) as local, _h5().File(local, "w") as f:
        keras_weights.write_from(model, f)


def keras_config_of(model: Any) -> dict:
    """config.json of the model: its Keras config, build and compile configs."""
    config = keras_config.keras_model_config(model)
    shape = model.input_shape
    if shape is not None:
        config["build_config"] = {"input_shape": [list(s) for s in shape]
                                  if isinstance(shape, list) else list(shape)}
    compiled = keras_compile.keras_compile_config(model.compile_config())
    if compiled is not None:
        config["compile_config"] = compiled
    return config


def save_model(model: Any, path: Any) -> None:
    """`model.save("x.keras")`: a file `keras.saving.load_model` reads."""
    config = keras_config_of(model)
    buffer = io.BytesIO()
    with _h5().File(buffer, "w") as f:
        keras_weights.write_from(model, f)
    metadata = {"keras_version": KERAS_VERSION, "podkit_version": __version__,
                "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")}
    with paths.staged(path) as local, zipfile.ZipFile(local, "w") as z:
        z.writestr(METADATA, json.dumps(metadata))
        z.writestr(CONFIG, json.dumps(config))
        z.writestr(WEIGHTS, buffer.getvalue())
