"""Keras 3's weight file (`.weights.h5`, and `model.weights.h5` inside a `.keras`) for podkit
models.

Keras 3 walks a model's objects (keras/src/saving/saving_lib.py `_save_state`): a Sequential's
or functional model's layers go under `layers/<name>`, where the name is the layer's class in
snake case, numbered in `model.layers` order when it repeats (`dense`, `dense_1`; never the
layer's own name); each object's own variables are the datasets `vars/0`, `vars/1`, ... of its
group, in its own order, and its sublayers are groups named by the attribute that holds them
(an LSTM's `cell`, Bidirectional's `forward_layer`/`backward_layer`, TimeDistributed's `layer`,
MultiHeadAttention's `query_dense`, ...; a nested model's `layers/...`). Each `vars` group
carries the object's name (`attrs["name"]`). podkit's layers hold the same variables in the
same order (their `get_weights()` is Keras's), so a weight's group follows from its path in
the podkit layer.

The optimizer's variables (`optimizer/vars`) are not read: podkit's optimizer state starts
afresh (Keras restores its moments); none are written (Keras then warns that it skipped them
and starts its optimizer afresh too).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from podkit.architectures import ModelLayer
from podkit.errors import ConfigError
from podkit.layers import Layer
from podkit.serialization import snake_case

_RNN = ("LSTM", "GRU", "SimpleRNN")
_MHA = {"query": "query_dense", "key": "key_dense", "value": "value_dense",
        "output": "output_dense"}


def keras_class(layer: Layer) -> str:
    """The class Keras names the layer by (a nested model's: Sequential or Functional)."""
    if isinstance(layer, ModelLayer):
        kind = layer.model.kind
        return type(layer.model).__name__ if kind == "Subclass" else kind
    return layer.keras_class_name or type(layer).__name__


def layer_paths(layers: list[Layer], prefix: str = "layers") -> list[tuple[str, Layer]]:
    """Each layer's group, numbered as Keras numbers a list of saveables."""
    used: dict[str, int] = {}
    out = []
    for layer in layers:
        base = snake_case(keras_class(layer))
        if base in used:
            used[base] += 1
            name = f"{base}_{used[base]}"
        else:
            used[base] = 0
            name = base
        out.append((f"{prefix}/{name}", layer))
    return out


def _sub_group(layer: Layer, path: str) -> str:
    """The group (relative to the layer's) of the weight at module path `path`."""
    kind = type(layer).__name__
    if isinstance(layer, ModelLayer):
        _, key, rest = path.split(".", 2)
        inner = dict(layer.model.architecture.layer_items())[_key(key)]
        group = dict((id(lay), g) for g, lay in layer_paths(model_layers(layer.model)))[
            id(inner)]
        sub = _sub_group(inner, rest)
        return f"{group}/{sub}" if sub else group
    if kind in _RNN:
        return "cell"
    if kind == "Bidirectional":
        return f"{path.split('.', 1)[0]}/cell"
    if kind == "TimeDistributed":
        sub = _sub_group(layer.layer, path.split(".", 1)[1])  # type: ignore[attr-defined]
        return f"layer/{sub}" if sub else "layer"
    if kind == "MultiHeadAttention":
        return _MHA[path.split("_", 1)[0]]
    return ""


def _key(key: str) -> Any:
    return int(key) if key.isdigit() else key


def model_layers(model: Any) -> list[Layer]:
    """The model's layers in Keras's `model.layers` order (no InputLayer: it holds nothing)."""
    return [layer for _, layer in model.architecture.layer_items()]


def weight_slots(model: Any) -> Iterator[tuple[Layer, list[tuple[str, int]]]]:
    """Each layer with its weights' (group, index in the group), in get_weights() order."""
    groups = _subclass_groups(model) if model.kind == "Subclass" else \
        layer_paths(model_layers(model))
    for base, layer in groups:
        source = layer.weight_source()
        names = source.names() if source is not None else []
        counts: dict[str, int] = {}
        slots = []
        for path in names:
            sub = _sub_group(layer, path)
            group = f"{base}/{sub}" if sub else base
            slots.append((group, counts.get(group, 0)))
            counts[group] = counts.get(group, 0) + 1
        yield layer, slots


def _subclass_groups(model: Any) -> list[tuple[str, Layer]]:
    """A subclassed model's layers where Keras puts them: Keras visits the model's attributes
    in sorted order (private ones last), and its `layers` list among them, so a layer held
    by an attribute that sorts before "layers" gets the attribute's name (`hidden/vars`) and
    the others `layers/<class>_<n>`, numbered over all the model's layers."""
    items = model.architecture.layer_items()

    def key(name: str) -> str:
        return f"~{name}" if name.startswith("_") else name

    out, seen = [], set()
    for attr, layer in sorted(((str(k), lay) for k, lay in items), key=lambda a: key(a[0])):
        if "." not in attr and key(attr) < "layers" and id(layer) not in seen:
            out.append((attr, layer))
            seen.add(id(layer))
    out += [(path, layer) for path, layer in layer_paths([lay for _, lay in items])
            if id(layer) not in seen]
    return out


def _group(f: Any, path: str) -> Any:
    """The `vars` group at `path`, also under Keras 2.13's `_layer_checkpoint_dependencies`."""
    for candidate in (path, path.replace("layers", "_layer_checkpoint_dependencies")):
        if candidate in f and "vars" in f[candidate]:
            return f[candidate]["vars"]
    return None


def read_into(model: Any, f: Any, source: str) -> None:
    """Set the model's weights from an open Keras 3 weights file (h5py.File)."""
    for layer, slots in weight_slots(model):
        current = layer.get_weights()
        values = []
        for (group, index), now in zip(slots, current, strict=True):
            vars_ = _group(f, group)
            if vars_ is None or str(index) not in vars_:
                raise ConfigError(f"{source} has no weight {group}/vars/{index} for layer "
                                  f"{layer.name!r} ({type(layer).__name__}): it was saved "
                                  "from another architecture (Keras names a layer's group by "
                                  "its class and position among the model's layers).")
            value = np.asarray(vars_[str(index)])
            if value.shape != now.shape:
                raise ConfigError(f"{source}: {group}/vars/{index} has shape {value.shape}; "
                                  f"layer {layer.name!r} ({type(layer).__name__}) holds "
                                  f"{now.shape} there: the file was saved from another "
                                  "architecture.")
            values.append(value.astype(now.dtype))
        if values:
            layer.set_weights(values)


def write_from(model: Any, f: Any) -> None:
    """Write the model's weights into an open, empty h5py.File as Keras 3 lays them out."""
    for layer, slots in weight_slots(model):
        for (group, index), value in zip(slots, layer.get_weights(), strict=True):
            vars_ = f.require_group(group).require_group("vars")
            vars_.attrs.setdefault("name", layer.name)
            vars_.create_dataset(str(index), data=value)
    if model.kind != "Subclass":
        for group, layer in layer_paths(model_layers(model)):
            vars_ = f.require_group(group).require_group("vars")  # Keras writes them all
            vars_.attrs["name"] = layer.name
    f.require_group("vars").attrs["name"] = model.name
