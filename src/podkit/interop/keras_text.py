"""A Keras model's TextVectorization, split off when the model is read.

Keras's TextVectorization turns strings into ids with TensorFlow's string ops (Keras on JAX
refuses a string input, "Invalid dtype: str"); podkit's runs on the host, in the input
pipeline, because strings never enter XLA. So a Keras model whose string input is read by a
TextVectorization loads from the layer's output: its input (same name) takes the ids, shaped
and typed as Keras's layer gives them (the shape its next layer was built for), and a
`SplitOffWarning` says so and how to get the layer. `load_text_vectorization(path)` (in
keras_archive, which reads the zip) gives the layer with the file's vocabulary: Keras keeps an
adapted one in the file's assets (`assets/<group>/vocabulary.txt`, the group named as the
weights' are: `layers/text_vectorization`, `layers/text_vectorization_1`, ...).
"""

from __future__ import annotations

import warnings
from typing import Any

from podkit import serialization
from podkit.errors import ConfigError, user_stacklevel
from podkit.layers.text import TextVectorization

CLASS = "TextVectorization"


class SplitOffWarning(UserWarning):
    """A Keras model's TextVectorization was split off: the loaded model takes its ids."""


def is_string_input(entry: dict) -> bool:
    """Whether a Keras InputLayer entry holds strings (Keras's dtype "string")."""
    config = entry.get("config") or {}
    return entry.get("class_name") == "InputLayer" and \
        serialization.dtype_name(config.get("dtype")) == "string"


def entry_name(entry: dict) -> str:
    return entry.get("name") or (entry.get("config") or {}).get("name", "?")


def ids_spec(entry: dict, recorded: dict | None) -> tuple[tuple[int | None, ...], str]:
    """The (shape without the batch, dtype) of the layer's output: as the Keras graph
    recorded it where its next layer reads it (`recorded`: a `__keras_tensor__` config),
    else Keras's `compute_output_spec` from its config: (output_sequence_length,) int64 ids
    in "int" mode (None: the length varies), (depth,) float32 in the others."""
    config = entry.get("config") or {}
    ids = config.get("output_mode", "int") == "int"
    dtype = "int64" if ids else "float32"
    if recorded is not None and recorded.get("shape"):
        return tuple(recorded["shape"][1:]), recorded.get("dtype") or dtype
    if ids:
        return (config.get("output_sequence_length"),), dtype
    depth = config.get("max_tokens") if config.get("pad_to_max_tokens") else \
        config.get("vocabulary_size")
    if not isinstance(depth, int):
        raise ConfigError(f"Keras TextVectorization {entry_name(entry)!r} has no vocabulary "
                          "size in its config, so the width of its output is unknown.")
    return (depth,), dtype


def split_off(entry: dict, input_name: str | None, shape: tuple, dtype: str) -> None:
    """Say that the layer was split off: what the model takes now (through its input
    `input_name`; None: a Sequential's one input), how to vectorize."""
    name = entry_name(entry)
    takes = "it" if input_name is None else f"its input {input_name!r}"
    warnings.warn(
        f"podkit: the Keras model's TextVectorization {name!r} runs outside the model, in "
        "the input pipeline (strings never enter XLA): the model was loaded from the "
        f"layer's output, so {takes} takes ids of shape (batch, "
        f"{', '.join(map(str, shape))}) ({dtype}), not strings. Get the layer with the "
        "file's vocabulary, `vectorize = pk.interop.load_text_vectorization(path"
        f"{'' if name == 'text_vectorization' else f', name={name!r}'})`, and map the data: "
        "`ds.map(lambda x, y: (vectorize(x), y))`; model.save() writes the model from the "
        "ids.", SplitOffWarning, stacklevel=user_stacklevel())


def asset_groups(config: dict) -> dict[str, str]:
    """Each top-level TextVectorization's name -> its group in the file's assets (Keras
    numbers a class's layers in `model.layers` order: text_vectorization, _1, ...)."""
    out: dict[str, str] = {}
    for entry in (config.get("config") or {}).get("layers") or []:
        if entry.get("class_name") == CLASS:
            n = len(out)
            out[entry_name(entry)] = f"layers/text_vectorization{'' if n == 0 else f'_{n}'}"
    return out


def layer_from_keras(entry: dict, vocabulary: str | None, source: str) -> TextVectorization:
    """podkit's TextVectorization from Keras's serialized one and its assets' vocabulary
    file (`vocabulary`: its text, None when the config holds the vocabulary)."""
    config = dict(entry.get("config") or {})
    name = entry_name(entry)
    if config.get("vocabulary") is None and vocabulary is None:
        raise ConfigError(f"{source}: Keras TextVectorization {name!r} has no vocabulary in "
                          "its config and none in the file's assets: it was never adapted.")
    if config.get("vocabulary") is None and config.get("output_mode") == "tf_idf":
        raise ConfigError(f"{source}: Keras TextVectorization {name!r} (tf_idf) was adapted, "
                          "and Keras keeps no idf weights in the file: adapt podkit's layer "
                          "on the training texts, or give vocabulary= and idf_weights=.")
    size = config.pop("vocabulary_size", None)
    layer = TextVectorization.from_config(config)
    if vocabulary is not None:
        # Keras's IndexLookup.load_assets: the lines, trailing empty ones dropped
        lines = vocabulary.splitlines()
        while lines and lines[-1] == "":
            lines.pop()
        layer.set_vocabulary(lines)
    if size is not None and size != layer.vocabulary_size():
        raise ConfigError(f"{source}: Keras TextVectorization {name!r} had {size} terms; "
                          f"its vocabulary file holds {layer.vocabulary_size()}.")
    return layer


def choose(layers: dict[str, Any], name: str | None, source: str) -> Any:
    """The layer called `name`, or the only one."""
    if name is None and len(layers) == 1:
        return next(iter(layers.values()))
    if name in layers:
        return layers[name]
    raise ConfigError(f"{source} holds the TextVectorization layers {sorted(layers)}"
                      + (f", not {name!r}" if name is not None else "")
                      + ": name one, load_text_vectorization(path, name=...)."
                      if layers else f"{source} holds no TextVectorization layer at the top "
                      "of its model.")
