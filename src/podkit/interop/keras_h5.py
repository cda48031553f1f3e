"""tf.keras's legacy HDF5 files (`.h5`): `model.save("x.h5")` and `save_weights("x.h5")` of
tf.keras 2, which Keras 3 still writes (keras/src/legacy/saving/legacy_h5_format.py).

A whole model's file holds `attrs["model_config"]` (the config as JSON), `attrs[
"training_config"]` (compile) and its weights under `model_weights/`; a weights file holds
them at its root. Weights are grouped by layer: `layer_names` lists the layers, each layer's
`weight_names` its variables (`dense/kernel:0` in tf.keras 2, `dense/kernel` in Keras 3), in
the layer's own order. As Keras's legacy loader, the layers that hold weights are matched in
order (`model.layers`), not by name.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from podkit import paths
from podkit.errors import ConfigError
from podkit.interop import keras_compile, keras_config


def _text(value: Any) -> str:
    return value.decode("utf8") if isinstance(value, bytes) else str(value)


def _weight_groups(group: Any) -> list[tuple[str, list[np.ndarray]]]:
    """(layer name, its arrays) for each saved layer that holds weights, in order."""
    out = []
    for name in (_text(n) for n in group.attrs["layer_names"]):
        layer = group[name]
        names = [_text(n) for n in layer.attrs.get("weight_names", [])]
        if names:
            out.append((name, [np.asarray(layer[n]) for n in names]))
    return out


def read_into(model: Any, group: Any, source: str) -> None:
    """Set the model's weights from a legacy weights group (layer by layer, in order)."""
    if "layer_names" not in group.attrs:
        raise ConfigError(f"{source} has no 'layer_names': not a tf.keras HDF5 weights file. "
                          "A Keras 3 weights file ends in .weights.h5.")
    saved = _weight_groups(group)
    layers = [layer for layer in model.layers if layer.weight_source() is not None
              and layer.get_weights()]
    if len(saved) != len(layers):
        raise ConfigError(f"{source} holds weights of {len(saved)} layers "
                          f"({[n for n, _ in saved]}); the model has {len(layers)} layers "
                          f"with weights ({[layer.name for layer in layers]}).")
    for (name, arrays), layer in zip(saved, layers, strict=True):
        current = layer.get_weights()
        shapes = [a.shape for a in arrays]
        if shapes != [c.shape for c in current]:
            raise ConfigError(f"{source}: layer {name!r} holds weights of shapes {shapes}; "
                              f"the model's layer {layer.name!r} ({type(layer).__name__}) "
                              f"holds {[c.shape for c in current]}.")
        layer.set_weights([a.astype(c.dtype) for a, c in zip(arrays, current, strict=True)])


def load_weights(model: Any, path: Any) -> None:
    """`model.load_weights("x.h5")`: a tf.keras weights file, or a whole model's."""
    import h5py

    with paths.local_copy(path) as local, h5py.File(local, "r") as f:
        group = f["model_weights"] if "model_weights" in f else f
        read_into(model, group, str(path))


def load_model(path: Any, compile: bool = True,
               custom_objects: dict[str, Any] | None = None) -> Any:
    """`load_model("x.h5")`: a whole tf.keras model (architecture, weights, compile)."""
    import h5py

    with paths.local_copy(path) as local, h5py.File(local, "r") as f:
        if "model_config" not in f.attrs:
            raise ConfigError(f"{path} holds weights only (no model_config): build the model "
                              "in code and call model.load_weights(path).")
        config = json.loads(_text(f.attrs["model_config"]))
        training = f.attrs.get("training_config")
        model = keras_config.model_from_keras(config, custom_objects)
        if not model.built:
            model.build()
        read_into(model, f["model_weights"], str(path))
    if compile and training is not None:
        training = json.loads(_text(training))
        training["optimizer"] = training.pop("optimizer_config", None)
        model.compile(**keras_compile.compile_kwargs(training))
    return model
