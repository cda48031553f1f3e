"""The three ways a podkit model gets its network, behind one small interface.

  * SequentialArch  a list of podkit layers; input shape from the first batch (or given)
  * GraphArch       the functional API's graph (pk.Input ... pk.Model(inputs, outputs))
  * ModuleArch      any Flax NNX module, or a factory `rngs -> module`
  * SubclassArch    a pk.Model subclass: layers as attributes, a `call()`

Each says what the model takes and gives (input names and shapes, output names and final
activations), builds the module, and — for the first two — describes itself as a JSON config,
which is what `model.save` writes and `load_model` reads back: no code is stored or executed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit import layers as layers_lib
from podkit.errors import ConfigError, InputError
from podkit.functional import Graph, GraphModule, graph_config, graph_from_config
from podkit.layers import Layer, Shape, build_sequential
from podkit.layers.subclass import build_subclass, find_layers


@dataclasses.dataclass(frozen=True)
class InputSpec:
    names: tuple[str, ...]
    shapes: tuple[Shape, ...]
    dtypes: tuple[Any, ...]
    structure: str = "single"  # how x arrives: "single" array, "list" or "dict" of arrays

    def example(self, rows: int = 1) -> Any:
        """Zeros shaped like a batch of `rows`, in the structure the module takes (a dim
        that varies, None, at the smallest length bucket)."""
        # in the dtype JAX computes (int64 is int32 without jax_enable_x64: pk.Input notes
        # it once), so that no zeros() warns of the truncation
        xs = [jnp.zeros((rows, *concrete(s)), jax.dtypes.canonicalize_dtype(d))
              for s, d in zip(self.shapes, self.dtypes, strict=True)]
        if self.structure == "dict":
            return dict(zip(self.names, xs, strict=True))
        return xs[0] if self.structure == "single" else xs


VARIABLE_LENGTH_EXAMPLE = 8  # a None dim's length in example inputs (the smallest bucket)


def concrete(shape: Sequence[int | None]) -> tuple[int, ...]:
    """`shape` with a length for each None dim (what example inputs are traced with)."""
    return tuple(VARIABLE_LENGTH_EXAMPLE if d is None else d for d in shape)


class Architecture:
    logits_arg = True  # the module takes `logits=` and `mask=` (podkit-built modules do)
    built_module: nnx.Module | None = None  # a module the user built already

    def input_spec(self, x_sample: Any) -> InputSpec:
        raise NotImplementedError

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def output_names(self) -> tuple[str, ...]:
        return ("",)

    def input_ranges(self) -> tuple[tuple[str, int, int] | None, ...]:
        """Per input, (the reading layer's name, low, high) of the ids it may hold (an
        Embedding's rows), or None: checked on the host before XLA (Layer.input_range)."""
        return (None,) * len(self.input_names())

    def output_activations(self) -> tuple[str | None, ...]:
        return (None,)

    def config(self) -> dict | None:
        """The architecture as JSON, or None when it comes from Python code."""
        return None

    def summary_rows(self, spec: InputSpec, counts: dict[Any, int]
                     ) -> list[tuple[str, ...]] | None:
        """summary()'s rows (layer (type), output shape, param #[, connected to]) given each
        layer's weight count by key; None for an NNX module (summary lists its
        parameters)."""
        return None

    def layer_list(self) -> list[Layer]:
        """The podkit layers, in the order of the module's `layers` list (none for an NNX
        module)."""
        return [layer for _, layer in self.layer_items()]

    def layer_items(self) -> list[tuple[Any, Layer]]:
        """(key of the layer's weights under the module's `layers`, layer) pairs: the index
        for a Sequential or a graph, the attribute path for a subclassed model."""
        return []

    def normalize_x(self, x: Any) -> Any:
        """x as the module takes it: a one-input model takes `[x]`, `(x,)` and `{"name": x}`
        too, as Keras does."""
        if len(self.input_names()) == 1 and isinstance(x, list | tuple | dict) and len(x) == 1:
            inner = next(iter(x.values())) if isinstance(x, dict) else x[0]
            if isinstance(inner, np.ndarray | jax.Array):  # not a list holding one batch
                return inner
        return x

    def input_names(self) -> tuple[str, ...]:
        return ("input",)


def _spec_from_sample(x: Any) -> InputSpec:
    if isinstance(x, dict):
        names, structure = tuple(x), "dict"
        leaves = [np.asarray(x[n]) for n in names]
    elif isinstance(x, list | tuple):
        leaves, structure = [np.asarray(a) for a in x], "list"
        names = tuple(f"input_{i}" for i in range(len(leaves)))
    else:
        leaves, names, structure = [np.asarray(x)], ("input",), "single"
    return InputSpec(names, tuple(a.shape[1:] for a in leaves),
                     tuple(jnp.dtype(jnp.result_type(a)) for a in leaves), structure)


def param_labels(params: Any, items: list[tuple[Any, Layer]]) -> Any:
    """"frozen" for the parameters of layers with trainable=False, "train" for the rest (the
    optimizer updates only the latter). `items`: Architecture.layer_items(); a nested
    model's layer labels its own parameters (`param_labels` of the layer)."""
    by_key = dict(items)

    def label(key: Any, sub: Any) -> Any:
        layer = by_key.get(key)
        if layer is not None and not layer.trainable:
            return jax.tree.map(lambda _: "frozen", sub)
        nested = getattr(layer, "param_labels", None)
        if callable(nested):
            return nested(sub)
        return jax.tree.map(lambda _: "train", sub)

    return {key: ({k: label(k, sub) for k, sub in value.items()} if key == "layers" else
                  jax.tree.map(lambda _: "train", value))
            for key, value in params.items()}


class SequentialArch(Architecture):
    def __init__(self, layers: Sequence[Layer], input_shape: Sequence[int] | None) -> None:
        self.layers = list(layers)
        self.input_shape = None if input_shape is None else tuple(input_shape)
        self.layer_shapes: list[Shape] = []

    def input_spec(self, x_sample: Any) -> InputSpec:
        if x_sample is None:
            if self.declared_shape() is None:
                raise ConfigError("this Sequential model has no input shape yet: pass "
                                  "build(input_shape), or fit it (the first batch gives it).")
            kind = jnp.int32 if self.layers and self.layers[0].input_kind == "int" else \
                jnp.float32
            return InputSpec(("input",), (self.declared_shape(),), (jnp.dtype(kind),))
        spec = _spec_from_sample(x_sample)
        if len(spec.shapes) != 1:
            raise ConfigError(f"a Sequential model takes one input; x holds {len(spec.shapes)} "
                              "arrays. Use the functional API (pk.Input) for several inputs.")
        declared, got = self.declared_shape(), spec.shapes[0]
        if declared is not None and (len(got) != len(declared) or any(
                d is not None and d != g for d, g in zip(declared, got, strict=True))):
            def show(shape: Shape) -> str:
                return "(" + ", ".join(["batch", *map(str, shape)]) + ")"
            raise InputError(f"x of shape {show(got)} does not match the input shape this "
                             f"Sequential declares, {show(declared)} (pk.Input or "
                             "input_shape=): reshape the data, or declare the shape it has.")
        return dataclasses.replace(spec, structure="single")

    def input_ranges(self):
        first = self.layers[0] if self.layers else None
        if isinstance(first, ModelLayer):
            return first.model.architecture.input_ranges()[:1]
        span = first.input_range() if first is not None else None
        return ((first.name, *span),) if span else (None,)

    def declared_shape(self) -> Shape | None:
        """The input shape given up front (Sequential(input_shape=...), pk.Input(...) as
        the first entry, or input_shape= on the first layer), if any."""
        if self.input_shape is not None:
            return self.input_shape
        return self.layers[0].input_shape if self.layers else None

    def layer_items(self) -> list[tuple[Any, Layer]]:
        return list(enumerate(self.layers))

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        if not self.layers:
            raise ConfigError("this Sequential model has no layers; add some with "
                              "model.add(...) before building it.")
        module, self.layer_shapes = build_sequential(self.layers, spec.shapes[0], rngs)
        return module

    def output_activations(self):
        return (self.layers[-1].activation,) if self.layers else (None,)

    def config(self):
        return {"layers": [layers_lib.serialize(layer) for layer in self.layers],
                "input_shape": None if self.input_shape is None else list(self.input_shape)}

    def summary_rows(self, spec, counts):
        return [(f"{layer.name} ({_type(layer)})", str((None, *shape)),
                 f"{counts.get(i, 0):,}")
                for i, (layer, shape) in enumerate(zip(self.layers, self.layer_shapes,
                                                       strict=True))]


class GraphArch(Architecture):
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def input_spec(self, x_sample: Any) -> InputSpec:
        g = self.graph
        return InputSpec(g.input_names, tuple(s for s, _ in g.input_specs),
                         tuple(jnp.dtype(d) for _, d in g.input_specs),
                         "single" if len(g.input_names) == 1 else "list")

    def input_names(self) -> tuple[str, ...]:
        return self.graph.input_names

    def layer_items(self) -> list[tuple[Any, Layer]]:
        """In Keras's order (Graph.keras_order), keyed by the index of their weights."""
        return [(i, self.graph.layers[i]) for i in self.graph.keras_order()]

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        return GraphModule(self.graph, rngs)

    def output_names(self):
        return self.graph.output_names if len(self.graph.outputs) > 1 else ("",)

    def input_ranges(self):
        g, ranges = self.graph, []
        for node in g.inputs:  # the tightest range of the layers that read the input itself
            spans = []
            for op in g.ops:
                layer = g.layers[op.layer]
                if len(op.reads) != 1 or op.reads[0] != node:
                    continue
                if isinstance(layer, ModelLayer):
                    inner = layer.model.architecture.input_ranges()
                    spans += [inner[0]] if len(inner) == 1 and inner[0] else []
                elif layer.input_range():
                    spans.append((layer.name, *layer.input_range()))
            ranges.append(min(spans, key=lambda s: s[2]) if spans else None)
        return tuple(ranges)

    def output_activations(self):
        return self.graph.output_activations()

    def config(self):
        return graph_config(self.graph)

    def summary_rows(self, spec, counts):
        g = self.graph
        rows = [(f"{n} (InputLayer)", str((None, *s)), "0", "-")
                for n, (s, _) in zip(g.input_names, g.input_specs, strict=True)]
        # Keras's "Connected to": the layers (or inputs) each call reads.
        source = dict(zip(g.inputs, g.input_names, strict=True))
        source.update({op.writes: g.layers[op.layer].name for op in g.ops})
        # One row per layer, as Keras: a layer called several times (a shared encoder)
        # lists every call's inputs, and its weights once. An Item's output is its layer's.
        reads: dict[int, list[str]] = {}
        for op in g.ops:
            if isinstance(g.layers[op.layer], layers_lib.Item):
                source[op.writes] = source[op.reads[0]]
                continue
            reads.setdefault(op.layer, []).extend(source[r] for r in op.reads)
        for index in g.keras_order():
            connected = reads[index]
            layer = g.layers[index]
            shape = g.input_shapes[index]
            out = layer.output_shape(list(shape) if layer.inputs == "many" else shape)
            rows.append((f"{layer.name} ({_type(layer)})", str(_with_batch(
                tuple(out) if not isinstance(out, list) else [tuple(o) for o in out])),
                         f"{counts.get(index, 0):,}", ", ".join(connected)))
        return rows


class ModuleArch(Architecture):
    logits_arg = False

    def __init__(self, module: nnx.Module | Callable[[nnx.Rngs], nnx.Module]) -> None:
        if not isinstance(module, nnx.Module) and not callable(module):
            raise ConfigError("Model(module) needs a Flax nnx.Module, a callable rngs -> "
                              "nnx.Module, or pk.Input tensors (Model(inputs, outputs)).")
        self.module = module

    @property
    def built_module(self) -> nnx.Module | None:
        return self.module if isinstance(self.module, nnx.Module) else None

    def input_spec(self, x_sample: Any) -> InputSpec:
        return _spec_from_sample(x_sample)

    def normalize_x(self, x: Any) -> Any:
        return x  # the user's module decides what its input looks like

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        if isinstance(self.module, nnx.Module):
            return self.module
        out = self.module(rngs)
        if not isinstance(out, nnx.Module):
            raise ConfigError(f"the model factory returned {type(out).__name__}; it must "
                              "return a Flax nnx.Module.")
        return out


class SubclassArch(Architecture):
    """A pk.Model subclass: its layers are its attributes, its program its `call()`
    (podkit.layers.subclass)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.output_shapes: dict[str, Any] = {}  # per layer key, once built

    def layer_items(self) -> list[tuple[Any, Layer]]:
        return find_layers(self.owner)

    def input_spec(self, x_sample: Any) -> InputSpec:
        if x_sample is None:
            raise ConfigError(f"{type(self.owner).__name__} has no input shape yet: call "
                              "model.build(input_shape), or fit it (the "
                              "first batch gives it).")
        return _spec_from_sample(x_sample)

    def normalize_x(self, x: Any) -> Any:
        return x  # call() takes x as the user passes it

    def input_names(self) -> tuple[str, ...]:
        return ("input",)

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        # Built on a batch of 5 (not 1): an output that loses the batch (x[:3]) shows.
        module, self.output_shapes = build_subclass(self.owner, spec.example(rows=5), rngs)
        return module

    def summary_rows(self, spec, counts):
        return [(f"{layer.name} ({_type(layer)})",
                 str(_with_batch(self.output_shapes.get(key))), f"{counts.get(key, 0):,}")
                for key, layer in self.layer_items()]


MODELS_FROM_CONFIG: dict[str, Callable[[dict], Any]] = {}
"""How a nested model's saved config becomes a model again, by kind ("Sequential",
"Functional"): the model classes sit above this module and register themselves here."""


class ModelLayer(Layer):
    """A podkit model used as a layer of another (Keras's nested models): in a Sequential's
    list, called on pk.Input tensors, or an attribute of a subclassed model. Its layers are
    the model's (one set of weights, shared with the model itself only by their specs: the
    outer model holds its own copy of the variables)."""

    def __init__(self, model: Any) -> None:
        super().__init__(name=model.name)
        self.model = model
        arch = model.architecture
        if len(arch.input_names()) > 1:
            self.inputs = "many"
        # First in a Sequential, the nested model's declared input shape is the outer one's.
        if isinstance(arch, SequentialArch):
            self.input_shape = arch.declared_shape()
        elif isinstance(arch, GraphArch) and len(arch.graph.input_specs) == 1:
            self.input_shape = tuple(arch.graph.input_specs[0][0])

    @property  # type: ignore[override]
    def trainable(self) -> bool:
        return all(layer.trainable for layer in self.model.layers)

    @trainable.setter
    def trainable(self, value: bool) -> None:
        if hasattr(self, "model"):  # Layer.__init__ sets it before the model is known
            for layer in self.model.layers:
                layer.trainable = bool(value)

    @property
    def activation(self) -> None:  # type: ignore[override]
        return None  # the nested model's own layers apply theirs

    @property
    def weight_order(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"layers.{key}.{w}" for key, layer in
                     self.model.architecture.layer_items() for w in layer.weight_order)

    def keras_weight_path(self, path: str) -> str:
        """The nested layer's name, then its own path ("inner/dense/kernel")."""
        _, key, rest = path.split(".", 2)
        for k, layer in self.model.architecture.layer_items():
            if str(k) == key:
                return f"{layer.name}/{layer.keras_weight_path(rest)}"
        return path.replace(".", "/")

    @property
    def regularized(self) -> tuple:  # type: ignore[override]
        return ()  # its built module adds its own layers' penalties (LayerStack.penalty)

    def _spec(self, input_shape: Any) -> InputSpec:
        arch = self.model.architecture
        shapes = [tuple(s) for s in input_shape] if self.inputs == "many" else \
            [tuple(input_shape)]
        if isinstance(arch, GraphArch):
            want = [tuple(s) for s, _ in arch.graph.input_specs]
            if shapes != want:
                raise ConfigError(f"model {self.name!r} takes inputs of shape "
                                  f"{[(None, *s) for s in want]}; it was called on "
                                  f"{[(None, *s) for s in shapes]}.")
            return arch.input_spec(None)
        if isinstance(arch, SubclassArch):
            raise ConfigError(f"a subclassed model ({self.name!r}) can be a layer of another "
                              "subclassed model only; wrap it in one, or build this one with "
                              "the functional API.")
        kind = jnp.int32 if arch.layer_list()[:1] and arch.layer_list()[0].input_kind == \
            "int" else jnp.float32
        return InputSpec(("input",), (shapes[0],), (jnp.dtype(kind),))

    @property
    def input_kind(self) -> str:  # type: ignore[override]
        layers = self.model.layers
        return layers[0].input_kind if layers else "float"

    def output_shape(self, input_shape: Any) -> Any:
        arch = self.model.architecture
        if isinstance(arch, SubclassArch):
            return None  # known once built (inside another subclass's call())
        spec = self._spec(input_shape)
        if isinstance(arch, GraphArch):
            shapes = arch.graph.output_shapes
            return shapes[0] if len(shapes) == 1 else list(shapes)
        shape = spec.shapes[0]
        for layer in arch.layer_list():
            shape = tuple(layer.output_shape(shape))
        return shape

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        arch = self.model.architecture
        if isinstance(arch, SubclassArch):
            shapes = [tuple(s) for s in input_shape] if self.inputs == "many" else \
                [tuple(input_shape)]
            spec = InputSpec(("input",), (shapes[0],), (jnp.dtype(jnp.float32),))
        else:
            spec = self._spec(input_shape)
        return arch.create(spec, rngs)

    def param_labels(self, params: Any) -> Any:
        return param_labels(params, self.model.architecture.layer_items())

    def get_config(self) -> dict:
        """The nested model's own config under "model" (what Keras writes for a nested
        Sequential or functional model); a subclass's architecture is code."""
        kind = self.model.kind
        if kind not in MODELS_FROM_CONFIG:
            raise ConfigError(f"model {self.name!r} ({_type(self)}) is nested in another and "
                              "is built from Python code: save the outer model's weights "
                              "(save_weights) and rebuild it from code.")
        return {"name": self.name,
                "model": {"class_name": kind, "config": self.model.get_config()}}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        saved = config.get("model") or {}
        make = MODELS_FROM_CONFIG.get(saved.get("class_name"))
        if make is None:
            raise ConfigError(f"a nested model's config names kind "
                              f"{saved.get('class_name')!r}; saved ones are "
                              f"{sorted(MODELS_FROM_CONFIG)}.")
        return cls(make(saved))


def _type(layer: Layer) -> str:
    """The type summary() names: the class, or a nested model's kind (Sequential, ...)."""
    if isinstance(layer, ModelLayer):
        kind = layer.model.kind
        return type(layer.model).__name__ if kind == "Subclass" else kind
    return type(layer).__name__


def _with_batch(shape: Any) -> Any:
    if shape is None:
        return "not called"
    def is_shape(s: Any) -> bool:
        return isinstance(s, tuple) and all(d is None or isinstance(d, int) for d in s)

    if is_shape(shape):
        return (None, *shape)
    return jax.tree.map(lambda s: (None, *s), shape, is_leaf=is_shape)


def from_config(class_name: str, config: dict) -> tuple[str, tuple]:
    """(model class, its constructor's arguments) from a saved config: "Sequential" with
    (layers, input_shape), "Functional" with (inputs, outputs)."""
    try:
        if class_name == "Sequential":
            layers = [layers_lib.deserialize(c) for c in config["layers"]]
            return "Sequential", (layers, config.get("input_shape"))
        if class_name == "Functional":
            return "Functional", graph_from_config(config)
    except (KeyError, TypeError, IndexError) as e:  # not what get_config() wrote
        raise ConfigError(f"this {class_name} config is not one get_config() wrote "
                          f"({type(e).__name__}: {e}); pass model.get_config()'s dict "
                          "unchanged.") from e
    raise ConfigError(f"a saved model of kind {class_name!r} has no architecture config: it was "
                      "built from Python code. Build it from the same code and call "
                      "model.load_weights(path).")
