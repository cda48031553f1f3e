"""Keras 3's model configs (a `.keras` file's config.json) as podkit layers and back.

Keras serializes each object as `{"module", "class_name", "config", "registered_name"}`
(keras/src/saving/serialization_lib.py); a functional model lists its layers with their
`inbound_nodes`, each argument a `__keras_tensor__` naming `[layer, node, tensor]`. Reading,
each Keras layer becomes podkit's layer of the same class name, its arguments checked one by
one: an argument podkit's layer takes is passed on (initializers and regularizers converted),
one it lacks is dropped when Keras's value is its "off" value (None, False, float32) and is an
error naming it otherwise. The graph is rebuilt by calling the layers on `pk.Input`s, as a
user would, so podkit's own checks run. Writing, podkit's layer configs are wrapped in Keras's
envelope and the graph becomes Keras's `inbound_nodes`.

This module imports no model class: `podkit.model` sits beside it (layer 5) and calls in; models
are made through `architectures.MODELS_FROM_CONFIG`, where Model and Sequential register.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from podkit import initializers, regularizers, serialization
from podkit.architectures import MODELS_FROM_CONFIG, ModelLayer
from podkit.errors import ConfigError
from podkit.functional import graph_config, trace
from podkit.interop import keras_builtins, keras_text
from podkit.layers import CLASSES as LAYER_CLASSES
from podkit.layers import Item, Layer
from podkit.layers import deserialize as deserialize_layer
from podkit.layers.symbolic import STRINGS, Input, SymbolicTensor, input_dtype

MODEL_CLASSES = ("Functional", "Sequential", "Model")

# podkit layers that are not Keras layers (or bases): never read from a Keras file.
_PODKIT_ONLY = {"Item", "Shape", "ModelLayer", "Layer", "WeightedLayer", "RNN", "Merge",
                "ImageLayer", "RandomLayer"}
# podkit layers a Keras file cannot give: why.
_UNREADABLE = {
    "Lambda": "a Lambda layer is Python code (Keras pickles its bytecode); podkit runs no code "
              "from files: build the model in code and load_weights() the file",
    "TextVectorization": "podkit runs TextVectorization in the input pipeline, never in a "
                         "model (strings never enter XLA), and splits it off a Keras model "
                         "only where it reads the model's string input: save the Keras model "
                         "from the layer's output on, and vectorize in the pipeline with "
                         "pk.layers.TextVectorization (`ds.map(lambda x, y: (vectorize(x), "
                         "y))`)",
}

# Keras arguments podkit's layers do not take, whose Keras value here changes nothing (besides
# None and False, which are "off" for every Keras argument podkit lacks).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "renorm_momentum": (0.99,),
    "autocast": (True,),
    "axis": (-1, [-1]),
    "center": (True,),
    "scale": (True,),
    "use_cudnn": ("auto",),
    "data_format": ("channels_last",),
    "groups": (1,),
    "depth_multiplier": (1,),
    "dilation_rate": (1, [1], [1, 1], (1,), (1, 1)),
    "attention_axes": ([1], (1,), 1),  # the time axis: the default for (batch, time, dim) inputs
}
# Layers that normalize the last axis only: tf.keras 2 names it by number ([1]).
_LAST_AXIS = ("BatchNormalization", "LayerNormalization")
_axis_of: dict[int, int] = {}
_last_axis: dict[int, tuple[int, str]] = {}  # layer id -> (axis it was saved with, owner)

# tf.keras 2 arguments that change how a layer runs on TF, not what it computes.
_IGNORED = {"implementation", "input_length"}


def keras_layer_names() -> list[str]:
    """The Keras layer classes a `.keras` file may hold: podkit's layers of those names."""
    return sorted(n for n in LAYER_CLASSES if n not in _PODKIT_ONLY and n not in _UNREADABLE)


# -- reading ---------------------------------------------------------------------------------
def _accepted(cls: type) -> set[str] | None:
    """The keyword arguments `cls(...)` takes, following **kwargs up the bases (None: any)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        names |= {n for n, p in params.items()
                  if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return names
    return names


def _is_float32_policy(value: Any) -> bool:
    try:
        return serialization.dtype_name(value) in (None, "float32")
    except ConfigError:
        return False


def kwargs_for(cls: type, config: dict, owner: str,
               convert: Callable[[str, Any], Any] = lambda key, value: value) -> dict:
    """`config` (Keras's arguments) as the keyword arguments podkit's `cls` takes; an
    argument it lacks with a value that matters is a ConfigError naming it."""
    accepted = _accepted(cls) or set()
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key == "dtype":
            if not _is_float32_policy(value):
                try:
                    name = serialization.dtype_name(value)
                except ConfigError:
                    name = value
                raise ConfigError(f"{owner} has dtype policy {name!r}; podkit's layers "
                                  "compute in float32 (mixed precision is the model's "
                                  "policy, not a layer's): save the Keras model in float32.")
            continue
        if key in accepted:
            out[key] = convert(key, value)
        elif value is None or value is False or value in _NEUTRAL.get(key, ()) or \
                key in _IGNORED:
            continue
        elif key.endswith("_initializer"):
            continue  # how fresh weights start: a loaded model's weights come from the file
        else:
            takes = ", ".join(sorted(accepted - {"input_shape", "input_dim"}))
            raise ConfigError(f"{owner} has {key}={value!r}, which podkit's {cls.__name__} "
                              f"does not support; it takes: {takes}.")
    return out


def _object(entry: Any, classes: dict[str, type], what: str, owner: str) -> Any:
    """A Keras initializer / regularizer (a name or a serialized dict) as podkit's."""
    if entry is None or isinstance(entry, str):
        return entry
    name = entry.get("class_name") if isinstance(entry, dict) else None
    cls = classes.get(name or "")
    if cls is None:
        raise ConfigError(f"{owner}: {what} {name or entry!r} is not one podkit has "
                          f"({', '.join(sorted(n for n in classes if not n.startswith('_')))}).")
    config = entry.get("config") or {}
    config = {k: v for k, v in config.items() if k != "seed" or v is not None}
    return cls(**kwargs_for(cls, config, f"{owner}'s {name}"))


def _converter(owner: str, custom: dict[str, Any]) -> Callable[[str, Any], Any]:
    def convert(key: str, value: Any) -> Any:
        if key.endswith("_initializer"):
            return _object(value, initializers.CLASSES, "initializer", owner)
        if key.endswith("_regularizer"):
            return _object(value, regularizers.CLASSES, "regularizer", owner)
        if isinstance(value, dict) and value.get("class_name") == "__numpy__":
            # an array argument (Rescaling's per-channel scale), as Keras serializes it
            config = value.get("config") or {}
            return np.asarray(config.get("value"), config.get("dtype") or "float32")
        if isinstance(value, dict) and "class_name" in value and "config" in value:
            return layer_from_keras(value, custom)  # a wrapper's layer
        return value
    return convert


def _custom_class(entry: dict, custom: dict[str, Any]) -> Any:
    from podkit.interop.keras_objects import registered

    for key in (entry.get("registered_name"), entry.get("class_name")):
        if key and key in custom:
            return custom[key]
    return registered(entry.get("registered_name") or entry.get("class_name"))


def layer_from_keras(entry: dict, custom: dict[str, Any] | None = None) -> Layer:
    """One Keras layer's serialized config as podkit's layer (not yet called)."""
    custom = custom or {}
    name = entry.get("class_name")
    config = dict(entry.get("config") or {})
    owner = f"Keras layer {config.get('name', '?')!r} ({name})"
    if name in MODEL_CLASSES:
        return ModelLayer(_model_from_keras(entry, custom))
    cls = _custom_class(entry, custom)
    if cls is not None:  # a registered class of the user's
        return cls.from_config(config)
    if name in _UNREADABLE:
        raise ConfigError(f"{owner}: {_UNREADABLE[name]}.")
    # A class of the user's (Keras names its module, not Keras's) is not podkit's layer of
    # the same name; a legacy file names no module, so there the name decides.
    own = "module" in entry and not keras_builtins.is_builtin(entry)
    cls = LAYER_CLASSES.get(name or "") if name not in _PODKIT_ONLY and not own else None
    if cls is None:
        raise ConfigError(_missing_layer(entry, owner))
    axis = config.get("axis")
    if name in _LAST_AXIS and axis not in _NEUTRAL["axis"]:
        # tf.keras 2 writes the last axis as its number ([1] for (batch, features)); it is
        # checked against the input's rank where the layer is called (_call)
        single = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
        if isinstance(single, int) and single > 0:
            config.pop("axis")
            _axis_of[id(config)] = single
    if "batch_input_shape" in config:  # tf.keras 2's first layer of a Sequential
        shape = config.pop("batch_input_shape")
        config.setdefault("input_shape", None if shape is None else list(shape[1:]))
    kwargs = kwargs_for(cls, config, owner, _converter(owner, custom))
    axis = _axis_of.pop(id(config), None)
    if name == "MultiHeadAttention" and "output_shape" in kwargs:
        shape = kwargs["output_shape"]
        if shape is not None and not isinstance(shape, int) and len(shape) == 1:
            kwargs["output_shape"] = shape[0]
    layer = cls(**kwargs)
    if name == "Normalization" and kwargs.get("mean") is None:
        layer.set_statistics(**_statistics(entry, kwargs.get("axis", -1)))
    if axis is not None:
        _last_axis[id(layer)] = (axis, owner)
    return layer


def _missing_layer(entry: dict, owner: str) -> str:
    """Why a layer podkit has no class for cannot load, and what to do: registering a class
    of the user's helps for the user's own classes, not for one of Keras's."""
    has = f"podkit reads these Keras layers: {', '.join(keras_layer_names())}."
    if not keras_builtins.is_builtin(entry):
        key = entry.get("registered_name") or entry.get("class_name")
        return (f"{owner} is not a layer podkit has. {has} For a class of your own, register "
                "a pk.layers.Layer subclass under its name with "
                "@pk.interop.register_keras_serializable(package=, name=), or pass "
                f"custom_objects={{{key!r}: cls}} to load_model.")
    if entry.get("class_name") in keras_builtins.PREPROCESSING:
        what = ("It transforms the data, so it can run in the input pipeline instead: save "
                "the Keras model without it (the model from the layer's output on) and apply "
                "it to the data, ds.map(...).")
    else:
        what = ("Build the model in podkit without it (or save the Keras model without it) "
                "and load_weights() the file.")
    return (f"{owner} is a Keras built-in layer that podkit does not have yet (registering a "
            f"class of your own does not stand in for one of Keras's). {what} {has}")


def _statistics(entry: dict, axis: Any) -> dict:
    """Placeholder statistics of an adapted Keras Normalization (shaped as its kept axes):
    its mean and variance are weights in the file, read into these once the model is
    built."""
    shape = (entry.get("build_config") or {}).get("input_shape")
    if shape is None:
        raise ConfigError(f"Keras Normalization {entry['config'].get('name')!r} has neither "
                          "statistics in its config nor a build_config: it was never adapted.")
    axes = [axis] if isinstance(axis, int) else list(axis or [])
    kept = [shape[a] for a in sorted(a % len(shape) for a in axes)]
    return {"mean": np.zeros(kept, np.float32), "variance": np.ones(kept, np.float32)}


def _is_tensor(value: Any) -> bool:
    return isinstance(value, dict) and value.get("class_name") == "__keras_tensor__"


def _history(value: dict) -> tuple[str, int, int]:
    layer, node, index = value["config"]["keras_history"]
    return layer, int(node), int(index)


def _legacy_node(node: Any) -> Any:
    """tf.keras 2's node, `[[layer, node, tensor, kwargs], ...]`, in Keras 3's form."""
    if not isinstance(node, list):
        return node
    tensors = [{"class_name": "__keras_tensor__", "config": {"keras_history": list(n[:3])}}
               for n in node]
    kwargs = node[0][3] if node and len(node[0]) > 3 else {}
    return {"args": [tensors[0] if len(tensors) == 1 else tensors], "kwargs": kwargs}


def _refs(value: Any) -> list[tuple[str, int, int]]:
    if _is_tensor(value):
        return [_history(value)]
    if isinstance(value, list | tuple):
        return [r for v in value for r in _refs(v)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _refs(v)]
    return []


def _resolve(value: Any, tensors: dict) -> Any:
    if _is_tensor(value):
        return tensors[_history(value)]
    if isinstance(value, list | tuple):
        return [_resolve(v, tensors) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, tensors) for k, v in value.items()}
    return value


def _triples(value: Any) -> list[tuple[str, int, int]]:
    """Keras's `input_layers` / `output_layers`: one [name, node, index] or a list of them
    (a dict of them for dict inputs)."""
    if isinstance(value, dict):
        value = list(value.values())
    if len(value) == 3 and isinstance(value[0], str):
        return [(value[0], int(value[1]), int(value[2]))]
    return [(v[0], int(v[1]), int(v[2])) for v in value]


def _input(entry: dict) -> SymbolicTensor:
    config = entry.get("config") or {}
    shape = config.get("batch_shape") or config.get("batch_input_shape")
    if shape is None:
        raise ConfigError(f"Keras InputLayer {config.get('name')!r} has no batch_shape.")
    if config.get("sparse") or config.get("ragged"):
        raise ConfigError(f"Keras InputLayer {config.get('name')!r} is sparse or ragged; "
                          "podkit's inputs are dense arrays.")
    dtype = input_dtype(config.get("dtype") or "float32",
                        f"Keras InputLayer {config.get('name')!r}")
    return Input(tuple(shape[1:]), dtype, config.get("name"))


def _is_op(entry: dict) -> bool:
    """A keras.ops call Keras 3 records in a functional graph (the legacy .h5 writer leaves
    its module out): where a mask is made, `Embedding(mask_zero=True)`'s NotEqual,
    Masking's NotEqual and Any."""
    module = entry.get("module")
    return str(module).startswith("keras.src.ops") or (
        module is None and entry.get("class_name") in ("NotEqual", "Any"))


def _mask_ops(config: dict) -> set[str]:
    """The ops whose outputs reach the model only as layers' `mask=` arguments: podkit's
    layers carry masks themselves, so these are not rebuilt."""
    entries = {e.get("name") or e["config"]["name"]: e for e in config["layers"]}

    def refs(entry: dict) -> set[str]:
        out = set()
        for node in entry.get("inbound_nodes") or []:
            node = _legacy_node(node)
            kwargs = {k: v for k, v in (node.get("kwargs") or {}).items() if k != "mask"}
            out |= {r[0] for r in _refs([node.get("args") or [], kwargs])}
        return out

    needed = {t[0] for t in _triples(config["output_layers"])}
    todo = list(needed)
    while todo:
        entry = entries.get(todo.pop())
        for name in refs(entry) if entry is not None else ():
            if name not in needed:
                needed.add(name)
                todo.append(name)
    return {name for name, e in entries.items() if _is_op(e) and name not in needed}


def _call(layer: Layer, args: list, kwargs: dict) -> Any:
    if id(layer) in _last_axis:
        axis, owner = _last_axis[id(layer)]
        rank = len(args[0].shape) if isinstance(args[0], SymbolicTensor) else None
        if rank is not None and axis != rank - 1:
            raise ConfigError(f"{owner} normalizes axis {axis} of a rank-{rank} input; "
                              "podkit's normalizes the last axis only.")
    kwargs = {k: v for k, v in kwargs.items() if v is not None and k != "mask"}
    if kwargs.get("training") is False:
        kwargs.pop("training")
    return layer(*args, **kwargs)


def _recorded(config: dict, history: tuple[str, int, int]) -> dict | None:
    """The shape and dtype Keras recorded for a tensor where a layer reads it."""
    for entry in config["layers"]:
        for node in entry.get("inbound_nodes") or []:
            found = _find_tensor(_legacy_node(node), history)
            if found is not None:
                return found
    return None


def _find_tensor(value: Any, history: tuple[str, int, int]) -> dict | None:
    if _is_tensor(value):
        return value["config"] if _history(value) == history else None
    items = value.values() if isinstance(value, dict) else value \
        if isinstance(value, list | tuple) else ()
    for v in items:
        found = _find_tensor(v, history)
        if found is not None:
            return found
    return None


def _text_inputs(config: dict) -> dict[tuple[str, int, int], Any]:
    """A string input read by a TextVectorization (and nothing else) becomes an input of the
    layer's ids (keras_text): the tensors that stand for the input and the layer's output.
    Any other string input is a ConfigError."""
    readers: dict[str, list[dict]] = {}
    for entry in config["layers"]:
        if keras_text.is_string_input(entry):
            readers[keras_text.entry_name(entry)] = []
    if not readers:
        return {}
    for entry in config["layers"]:
        for node in entry.get("inbound_nodes") or []:
            for ref in _refs(_legacy_node(node)):
                if ref[0] in readers:
                    readers[ref[0]].append(entry)
    tensors: dict[tuple[str, int, int], Any] = {}
    for name, users in readers.items():
        text = users[0] if len(users) == 1 else None
        if text is None or text.get("class_name") != keras_text.CLASS or \
                len(text.get("inbound_nodes") or []) != 1:
            names = sorted({f"{keras_text.entry_name(u)} ({u.get('class_name')})"
                            for u in users})
            raise ConfigError(f"Keras InputLayer {name!r} holds strings and is read by "
                              f"{names or 'no layer'}; podkit splits a string input off the "
                              "model only where one TextVectorization alone reads it. "
                              + STRINGS)
        layer = keras_text.entry_name(text)
        shape, dtype = keras_text.ids_spec(text, _recorded(config, (layer, 0, 0)))
        keras_text.split_off(text, name, shape, dtype)
        tensors[(name, 0, 0)] = tensors[(layer, 0, 0)] = Input(shape, dtype, name)
    return tensors


def _functional(config: dict, custom: dict[str, Any]) -> tuple[list, list]:
    """The inputs and outputs (pk.Input tensors) of a Keras functional model's config."""
    tensors = _text_inputs(config)
    pending: list[tuple[Layer | None, dict, int]] = []
    mask_ops = _mask_ops(config)
    for entry in config["layers"]:
        key = (entry.get("name") or entry["config"]["name"], 0, 0)
        if key in tensors:
            continue  # a string input and its TextVectorization: the ids' input
        if entry.get("class_name") == "InputLayer":
            tensors[key] = _input(entry)
            continue
        if (entry.get("name") or entry["config"]["name"]) in mask_ops:
            continue  # podkit's layers carry masks themselves
        layer = layer_from_keras(entry, custom)
        # A functional model's node 0 is its own making; its calls are nodes 1, 2, ...
        first = 1 if entry.get("class_name") == "Functional" else 0
        for i, node in enumerate(entry.get("inbound_nodes") or []):
            node = _legacy_node(node)
            if isinstance(node, dict):
                node = {**node, "kwargs": {k: v for k, v in (node.get("kwargs") or {}).items()
                                           if k != "mask"}}
            pending.append((layer, node, first + i))
    while pending:  # a shared layer's later call may read a layer listed after it
        ready = [p for p in pending if all(r in tensors for r in _refs(p[1]))]
        if not ready:
            missing = sorted({r[0] for p in pending for r in _refs(p[1])
                              if r not in tensors})
            raise ConfigError(f"the Keras model's graph reads layers it never defines: "
                              f"{missing}.")
        for item in ready:
            pending.remove(item)
            layer, node, i = item
            out = _call(layer, _resolve(node.get("args") or [], tensors),
                        _resolve(node.get("kwargs") or {}, tensors))
            outs = out if isinstance(out, list | tuple) else [out]
            for k, t in enumerate(outs):
                tensors[(layer.name, i, k)] = t
    ins = [tensors[t] for t in _triples(config["input_layers"])]
    outs = [tensors[t] for t in _triples(config["output_layers"])]
    return ins, outs


def _make(kind: str, config: dict) -> Any:
    make = MODELS_FROM_CONFIG.get(kind)
    if make is None:
        raise ConfigError(f"podkit's {kind} model class is not loaded; import podkit's "
                          f"pk.{kind} first (pk.models.load_model does).")
    return make({"class_name": kind, "config": config})


def model_from_keras(entry: dict, custom: dict[str, Any] | None = None) -> Any:
    """A new (uncompiled, unbuilt) podkit model from a Keras model's serialized config:
    Sequential, Functional, or a registered subclass."""
    try:
        model = _model_from_keras(entry, custom or {})
        _keep_class_names(model, entry)
        return model
    finally:
        _last_axis.clear()  # the layers' checks are done once their graph is made
        _axis_of.clear()


def _keep_class_names(model: Any, entry: dict) -> None:
    """A layer of the user's whose podkit class is named otherwise than the Keras class the
    file names keeps the file's name: Keras names the layer's weight group after it."""
    if model.kind not in ("Functional", "Sequential"):
        return
    by_name = {layer.name: layer for layer in model.layers if not isinstance(layer, ModelLayer)}
    for layer_entry in (entry.get("config") or {}).get("layers") or []:
        layer = by_name.get(keras_text.entry_name(layer_entry))
        if layer is not None and layer_entry.get("class_name") != type(layer).__name__:
            layer.keras_class_name = layer_entry.get("class_name")


def _model_from_keras(entry: dict, custom: dict[str, Any]) -> Any:
    kind = entry.get("class_name")
    config = entry.get("config") or {}
    name = config.get("name", "model")
    if kind == "Sequential":
        layers = list(config.get("layers") or [])
        shape = None
        strings = bool(layers) and keras_text.is_string_input(layers[0])
        if layers and layers[0].get("class_name") == "InputLayer":
            first = layers.pop(0)
            if not strings:
                _input(first)  # its checks
            shape = list(first["config"].get("batch_shape")
                         or first["config"]["batch_input_shape"])[1:]
        elif config.get("build_input_shape"):
            shape = list(config["build_input_shape"][1:])
        if layers and layers[0].get("class_name") == keras_text.CLASS:
            text = layers.pop(0)  # split off: the Sequential takes its ids (keras_text)
            after = (layers[0].get("build_config") or {}).get("input_shape") if layers \
                else None
            ids, dtype = keras_text.ids_spec(text, {"shape": after} if after else None)
            keras_text.split_off(text, None, ids, dtype)
            shape = list(ids)
        elif strings:
            raise ConfigError(f"the Keras Sequential {name!r} takes strings and does not "
                              "start with a TextVectorization. " + STRINGS)
        built = [layer_from_keras(e, custom) for e in layers]
        return _make("Sequential", {"name": name, "input_shape": shape,
                                    "layers": [_serialize(layer) for layer in built]})
    if kind in ("Functional", "Model") and "layers" in config and "input_layers" in config:
        ins, outs = _functional(config, custom)
        graph = graph_config(trace(ins, outs if len(outs) > 1 else outs[0]))
        return _make("Functional", {**graph, "name": name})
    cls = _custom_class(entry, custom)
    if cls is None:
        raise ConfigError(f"the Keras model {name!r} is a subclass ({kind}, registered as "
                          f"{entry.get('registered_name')!r}) that podkit does not know: "
                          "register your pk.Model subclass with "
                          "pk.interop.register_keras_serializable(package=, name=) under "
                          "that name, or pass custom_objects={name: cls} to load_model.")
    return cls.from_config(config)


def _serialize(layer: Layer) -> dict:
    from podkit.layers import serialize

    return serialize(layer)


# -- writing ---------------------------------------------------------------------------------
def _policy() -> dict:
    return serialization.keras_dtype_policy()


def keras_object(module: str, entry: Any) -> Any:
    """podkit's `{"class_name", "config"}` in Keras's envelope (nested ones too)."""
    if not isinstance(entry, dict) or "class_name" not in entry:
        return entry
    return {"module": module, "class_name": entry["class_name"],
            "config": entry.get("config") or {}, "registered_name": None}


# podkit-only arguments, left out of what Keras reads (Keras would refuse them).
_PODKIT_ARGS = {"kernel_axes", "sharded", "sparse_updates", "attention",
                "statistics"}  # an adapted Normalization's: Keras reads them as weights
# Keras layers whose constructor lacks one of podkit's common arguments.
_NOT_KERAS = {"SpatialDropout1D": ("trainable",), "SpatialDropout2D": ("trainable",),
              "SimpleRNN": ("recurrent_activation", "unit_forget_bias", "reset_after"),
              "GRU": ("unit_forget_bias",), "LSTM": ("reset_after",)}


def keras_layer_config(layer: Layer) -> dict:
    """podkit's layer as Keras's serialized layer (without its graph nodes)."""
    if isinstance(layer, ModelLayer):
        return keras_model_config(layer.model)
    if LAYER_CLASSES.get(type(layer).__name__) is not type(layer):
        return _own_layer_config(layer)
    config = {}
    for key, value in layer.get_config().items():
        if key in _PODKIT_ARGS:
            continue
        if key.endswith("_initializer"):
            value = keras_object("keras.initializers", value)
            if value and value["class_name"] in ("Zeros", "Ones"):
                value["config"] = {}
        elif key.endswith("_regularizer"):
            value = keras_object("keras.regularizers", value)
        elif isinstance(value, Layer):
            value = keras_layer_config(value)
        elif isinstance(value, dict) and "class_name" in value and key in (
                "layer", "backward_layer"):
            value = keras_layer_config(deserialize_layer(value))
        config[key] = value
    if type(layer).__name__ == "MultiHeadAttention":
        config["output_shape"] = config.pop("output_dims", config.get("output_shape"))
    for key in _NOT_KERAS.get(type(layer).__name__, ()):
        config.pop(key, None)
    config["dtype"] = _policy()
    return {"module": "keras.layers", "class_name": type(layer).__name__, "config": config,
            "registered_name": None}


def _own_layer_config(layer: Layer) -> dict:
    """A layer class of the user's, as Keras writes a custom class: its get_config() as it
    is (with Keras's dtype policy, which Keras's base get_config holds too), its module
    (None for __main__), and the name it is registered under, which Keras's
    `register_keras_serializable` (or custom_objects) must give when Keras loads it."""
    from podkit.interop.keras_objects import registered_name

    cls = type(layer)
    return {"module": None if cls.__module__ == "__main__" else cls.__module__,
            "class_name": layer.keras_class_name or cls.__name__,
            "config": {"dtype": _policy(), **layer.get_config()},
            "registered_name": registered_name(cls) or cls.__name__}


def _tensor(shape: Any, dtype: str, history: tuple[str, int, int]) -> dict:
    return {"class_name": "__keras_tensor__",
            "config": {"shape": [None, *shape], "dtype": dtype,
                       "keras_history": list(history)}}


def keras_model_config(model: Any) -> dict:
    """A podkit Sequential or functional model as Keras 3's serialized model."""
    kind = model.kind
    config = model.get_config()
    name = model.name
    if kind == "Sequential":
        layers = [keras_layer_config(layer) for layer in model.layers]
        shape = model.input_shape
        if shape is not None:
            shape = list(shape) if not isinstance(shape, list) else shape
            layers.insert(0, {"module": "keras.layers", "class_name": "InputLayer",
                              "config": {"batch_shape": [None, *shape[1:]],
                                         "dtype": "float32", "sparse": False,
                                         "ragged": False, "name": f"{name}_input"},
                              "registered_name": None})
        return {"module": "keras", "class_name": "Sequential",
                "config": {"name": name, "trainable": True, "dtype": _policy(),
                           "layers": layers},
                "registered_name": None}
    if kind == "Subclass":
        from podkit.interop.keras_objects import registered_name

        registered = registered_name(type(model))
        if registered is not None:  # as Keras writes a registered subclass
            shape = model.input_shape
            return {"module": None, "class_name": type(model).__name__, "config": config,
                    "registered_name": registered,
                    **({"build_config": {"input_shape": list(shape)}}
                       if isinstance(shape, tuple) else {})}
    if kind != "Functional":
        raise ConfigError(f"model {name!r} is a {kind} model: only Sequential and functional "
                          "models, and pk.Model subclasses registered with "
                          "pk.interop.register_keras_serializable, are written as .keras "
                          "files; save_weights('x.weights.h5') writes its weights.")
    return _functional_config(model, config)


def _functional_config(model: Any, config: dict) -> dict:
    layers = model.architecture.graph.layers
    inputs = {s["id"]: s for s in config["inputs"]}
    where: dict[int, tuple[str, int, int]] = {}  # tensor id -> keras_history
    shapes: dict[int, Any] = {i: s["shape"] for i, s in inputs.items()}
    dtypes = {i: s["dtype"] for i, s in inputs.items()}
    entries: dict[int, dict] = {}
    calls: dict[int, int] = {}
    out = []
    for i, spec in inputs.items():
        where[i] = (spec["name"], 0, 0)
        out.append({"module": "keras.layers", "class_name": "InputLayer",
                    "config": {"batch_shape": [None, *spec["shape"]], "dtype": spec["dtype"],
                               "sparse": False, "ragged": False, "name": spec["name"],
                               "optional": False},
                    "registered_name": None, "name": spec["name"], "inbound_nodes": []})
    order = [k for k, _ in model.architecture.layer_items()]
    for op in config["ops"]:
        layer = layers[op["layer"]]
        if isinstance(layer, Item):  # an output of a layer of several outputs
            name, node, _ = where[op["reads"][0]]
            where[op["writes"]] = (name, node, layer.index)
            continue
        entry = entries.get(op["layer"])
        if entry is None:
            entry = entries[op["layer"]] = {**keras_layer_config(layer), "name": layer.name,
                                            "inbound_nodes": []}
        args = [_tensor(shapes.get(r, []), dtypes.get(r, "float32"), where[r])
                for r in op["reads"]]
        options = dict(op.get("options") or {})
        kind = type(layer).__name__
        if kind == "MultiHeadAttention":
            node = {"args": args[:2], "kwargs": {"key": args[2], **options,
                                                 **({"attention_mask": args[3]}
                                                    if len(args) > 3 else {})}}
        elif kind in ("LSTM", "GRU", "SimpleRNN") and len(args) > 1:
            node = {"args": args[:1], "kwargs": {"initial_state": args[1:], **options}}
        elif layer.inputs == "many" and not isinstance(layer, ModelLayer):
            node = {"args": [args], "kwargs": options}
        else:
            node = {"args": args if len(args) == 1 else [args], "kwargs": options}
        entry["inbound_nodes"].append(node)
        # A functional model's node 0 is its own making (Keras); its calls are 1, 2, ...
        first = 1 if isinstance(layer, ModelLayer) and layer.model.kind == "Functional" else 0
        index = calls[op["layer"]] = calls.get(op["layer"], first - 1) + 1
        where[op["writes"]] = (layer.name, index, 0)
    out += [entries[k] for k in order if k in entries]
    outs = [list(where[t]) for t in config["outputs"]]
    ins = [list(where[i]) for i in inputs]
    return {"module": "keras.src.models.functional", "class_name": "Functional",
            "registered_name": "Functional",  # as Keras 3 writes it
            "config": {"name": model.name, "trainable": True, "layers": out,
                       "input_layers": ins[0] if len(ins) == 1 else ins,
                       "output_layers": outs[0] if len(outs) == 1 else outs}}
