"""The three ways a podkit model gets its network, behind one small interface.

  * SequentialArch  a list of podkit layers; input shape from the first batch (or given)
  * GraphArch       the functional API's graph (pk.Input ... pk.Model(inputs, outputs))
  * ModuleArch      any Flax NNX module, or a factory `rngs -> module`

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
from podkit.errors import ConfigError
from podkit.functional import Graph, GraphModule, graph_config, graph_from_config, trace
from podkit.layers import Layer, Shape, build_sequential


@dataclasses.dataclass(frozen=True)
class InputSpec:
    names: tuple[str, ...]
    shapes: tuple[Shape, ...]
    dtypes: tuple[Any, ...]

    def example(self, rows: int = 1) -> Any:
        """Zeros shaped like a batch of `rows`, in the structure the module takes."""
        xs = [jnp.zeros((rows, *s), d) for s, d in zip(self.shapes, self.dtypes, strict=True)]
        return xs[0] if len(xs) == 1 else xs


class Architecture:
    logits_arg = True  # the module takes `logits=` (podkit-built modules do)

    def input_spec(self, x_sample: Any) -> InputSpec:
        raise NotImplementedError

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def output_names(self) -> tuple[str, ...]:
        return ("",)

    def output_activations(self) -> tuple[str | None, ...]:
        return (None,)

    def config(self) -> dict | None:
        """The architecture as JSON, or None when it comes from Python code."""
        return None

    def summary_rows(self, spec: InputSpec, params: Any) -> list[tuple[str, str, str]] | None:
        return None


def _spec_from_sample(x: Any) -> InputSpec:
    if isinstance(x, dict):
        names = tuple(x)
        leaves = [np.asarray(x[n]) for n in names]
    elif isinstance(x, list | tuple):
        leaves = [np.asarray(a) for a in x]
        names = tuple(f"input_{i}" for i in range(len(leaves)))
    else:
        leaves, names = [np.asarray(x)], ("input",)
    return InputSpec(names, tuple(a.shape[1:] for a in leaves),
                     tuple(jnp.dtype(jnp.result_type(a)) for a in leaves))


class SequentialArch(Architecture):
    def __init__(self, layers: Sequence[Layer], input_shape: Sequence[int] | None) -> None:
        self.layers = list(layers)
        self.input_shape = None if input_shape is None else tuple(input_shape)
        self.layer_shapes: list[Shape] = []

    def input_spec(self, x_sample: Any) -> InputSpec:
        if self.input_shape is not None and x_sample is None:
            kind = jnp.int32 if self.layers[0].input_kind == "int" else jnp.float32
            return InputSpec(("input",), (self.input_shape,), (jnp.dtype(kind),))
        spec = _spec_from_sample(x_sample)
        if len(spec.shapes) != 1:
            raise ConfigError(f"a Sequential model takes one input; x holds {len(spec.shapes)} "
                              "arrays. Use the functional API (pk.Input) for several inputs.")
        return spec

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        module, self.layer_shapes = build_sequential(self.layers, spec.shapes[0], rngs)
        return module

    def output_activations(self):
        return (self.layers[-1].activation,)

    def config(self):
        return {"layers": [layers_lib.serialize(layer) for layer in self.layers],
                "input_shape": None if self.input_shape is None else list(self.input_shape)}

    def summary_rows(self, spec, params):
        counts = {}
        for i, p in params.get("layers", {}).items():
            counts[i] = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(p))
        return [(f"{layer.name} ({type(layer).__name__})", str((None, *shape)),
                 f"{counts.get(i, 0):,}")
                for i, (layer, shape) in enumerate(zip(self.layers, self.layer_shapes,
                                                       strict=True))]


class GraphArch(Architecture):
    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def input_spec(self, x_sample: Any) -> InputSpec:
        g = self.graph
        return InputSpec(g.input_names, tuple(s for s, _ in g.input_specs),
                         tuple(jnp.dtype(d) for _, d in g.input_specs))

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        return GraphModule(self.graph, rngs)

    def output_names(self):
        return self.graph.output_names if len(self.graph.outputs) > 1 else ("",)

    def output_activations(self):
        return self.graph.output_activations()

    def config(self):
        return graph_config(self.graph)

    def summary_rows(self, spec, params):
        counts = {}
        for i, p in params.get("modules", {}).items():
            counts[i] = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(p))
        g = self.graph
        rows = [(f"{n} (Input)", str((None, *s)), "0")
                for n, (s, _) in zip(g.input_names, g.input_specs, strict=True)]
        for i, (layer, shape) in enumerate(zip(g.layers, g.input_shapes, strict=True)):
            out = layer.output_shape(list(shape) if layer.inputs == "many" else shape)
            rows.append((f"{layer.name} ({type(layer).__name__})", str((None, *out)),
                         f"{counts.get(i, 0):,}"))
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

    def create(self, spec: InputSpec, rngs: nnx.Rngs) -> nnx.Module:
        if isinstance(self.module, nnx.Module):
            return self.module
        out = self.module(rngs)
        if not isinstance(out, nnx.Module):
            raise ConfigError(f"the model factory returned {type(out).__name__}; it must "
                              "return a Flax nnx.Module.")
        return out


def from_config(class_name: str, config: dict) -> tuple[Architecture, str]:
    """(architecture, model class) from a saved config."""
    if class_name == "Sequential":
        layers = [layers_lib.deserialize(c) for c in config["layers"]]
        return SequentialArch(layers, config.get("input_shape")), "Sequential"
    if class_name == "Functional":
        inputs, outputs = graph_from_config(config)
        return GraphArch(trace(inputs, outputs)), "Functional"
    raise ConfigError(f"a saved model of kind {class_name!r} has no architecture config: it was "
                      "built from Python code. Build it from the same code and call "
                      "model.load_weights(path).")
