"""The functional API: `pk.Input`, layers called on symbolic tensors, a graph of layers.

    a = pk.Input((8,), name="a")
    b = pk.Input((4,), name="b")
    h = pk.layers.Dense(16, activation="relu")(pk.layers.Concatenate()([a, b]))
    out = pk.layers.Dense(3, activation="softmax", name="label")(h)
    model = pk.Model(inputs=[a, b], outputs=out)

Calling a layer records a node and computes its output shape at once, so a shape that does not
fit is an error at the line that made it: `Input`, the symbolic tensors and that recording
live below the layers (`podkit.layers.symbolic`), and this module reads what they recorded.
`Graph` is the recorded program: layers in a topological order with the nodes they read;
`GraphModule` is the Flax NNX module that runs it. A layer called twice is one set of weights
(shared), as in Keras.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers import Layer, Shape, deserialize, serialize
from podkit.layers.base import Item
from podkit.layers.stack import LayerStack
from podkit.layers.symbolic import Input, SymbolicTensor, call_layer

__all__ = ["Graph", "GraphModule", "Input", "Op", "SymbolicTensor", "graph_config",
           "graph_from_config", "trace"]


@dataclasses.dataclass(frozen=True)
class Op:
    layer: int  # index into Graph.layers
    reads: tuple[int, ...]  # node ids
    writes: int  # node id
    many: bool
    options: tuple[tuple[str, Any], ...] = ()  # the call's keywords (use_causal_mask=True)


@dataclasses.dataclass(frozen=True)
class Graph:
    """The recorded program: inputs (node ids), ops in order, outputs (node ids)."""

    layers: tuple[Layer, ...]
    input_shapes: tuple[Shape, ...]  # per layer, what it was built for (list for merges)
    inputs: tuple[int, ...]
    input_names: tuple[str, ...]
    input_specs: tuple[tuple[Shape, Any], ...]
    ops: tuple[Op, ...]
    outputs: tuple[int, ...]
    output_names: tuple[str, ...]
    output_shapes: tuple[Shape, ...]

    def output_activations(self) -> tuple[str | None, ...]:
        writer = {op.writes: self.layers[op.layer] for op in self.ops}
        return tuple(writer[o].activation if o in writer else None for o in self.outputs)

    def keras_order(self) -> list[int]:
        """The layers (indices) in Keras's order for a functional model's `layers` and
        weights: by decreasing depth from the outputs, ties in the order a depth-first walk
        from the outputs first meets them (Keras's `map_graph`). An Item (one output of a
        multi-output layer) is plumbing, not a layer: its node is its layer's."""
        by_node = {op.writes: op for op in self.ops}

        def node_of(i: int) -> int:  # through Items to the multi-output layer's node
            op = by_node.get(i)
            return node_of(op.reads[0]) if op is not None and isinstance(
                self.layers[op.layer], Item) else i

        first_met: dict[int, int] = {}
        post: list[int] = []
        done: set[int] = set()

        def walk(i: int) -> None:
            op = by_node.get(i)
            if op is None or i in done:
                return
            first_met.setdefault(op.layer, len(first_met))
            for r in op.reads:
                walk(node_of(r))
            done.add(i)
            post.append(i)

        for o in self.outputs:
            walk(node_of(o))
        node_depth: dict[int, int] = {}
        layer_depth: dict[int, int] = {}
        for i in reversed(post):
            op = by_node[i]
            depth = max(node_depth.setdefault(i, 0), layer_depth.get(op.layer, 0))
            layer_depth[op.layer] = node_depth[i] = depth
            for r in op.reads:
                parent = node_of(r)
                node_depth[parent] = max(depth + 1, node_depth.get(parent, 0))
        return sorted(layer_depth, key=lambda k: (-layer_depth[k], first_met[k]))


def trace(inputs: Any, outputs: Any) -> Graph:
    """The graph between `inputs` and `outputs` (tensors, lists of them, or dicts)."""
    ins = _tensors(inputs, "inputs")
    outs = _tensors(outputs, "outputs")
    for t in ins:
        if t.layer is not None:
            raise ConfigError(f"{t!r} is not a pk.Input; a model's inputs must be pk.Input(...) "
                              "tensors.")
    # A dict names its inputs / outputs by its keys (as Keras matches x, y and losses).
    names = list(inputs) if isinstance(inputs, dict) else [t.name for t in ins]
    if len(set(names)) < len(names):
        raise ConfigError(f"inputs have repeated names {names}; name each pk.Input(name=...).")
    order: list[SymbolicTensor] = []
    seen: set[int] = set()

    def visit(t: SymbolicTensor) -> None:
        if t.id in seen:
            return
        if t.layer is None:
            if t.id not in {i.id for i in ins}:
                raise ConfigError(f"output depends on {t!r}, which is not among the model's "
                                  f"inputs {[i.name for i in ins]}; pass it in inputs=[...].")
            seen.add(t.id)
            return
        for parent in t.inputs:
            visit(parent)
        seen.add(t.id)
        order.append(t)

    for o in outs:
        visit(o)
    layers: list[Layer] = []
    built_for: list[Any] = []
    ops = []
    for t in order:
        shape = [p.spec for p in t.inputs] if t.layer.inputs == "many" else \
            t.inputs[0].spec
        if t.layer in layers:
            k = layers.index(t.layer)
            if built_for[k] != shape:
                raise ConfigError(f"layer {t.layer.name!r} is called on inputs of shape "
                                  f"{shape} and {built_for[k]}; a shared layer needs one shape.")
        else:
            layers.append(t.layer)
            built_for.append(shape)
            k = len(layers) - 1
        ops.append(Op(k, tuple(p.id for p in t.inputs), t.id, t.layer.inputs == "many",
                      t.options))
    out_names: list[str] = list(outputs) if isinstance(outputs, dict) else []
    for i, o in enumerate(outs if not out_names else ()):
        name = o.layer.name if o.layer is not None else o.name
        out_names.append(name if name not in out_names else f"{name}_{i}")
    return Graph(tuple(layers), tuple(_freeze(s) for s in built_for), tuple(t.id for t in ins),
                 tuple(names), tuple((t.shape[1:], t.dtype) for t in ins), tuple(ops),
                 tuple(t.id for t in outs), tuple(out_names), tuple(o.shape[1:] for o in outs))


def _freeze(shape: Any) -> Any:
    return tuple(tuple(s) for s in shape) if isinstance(shape, list) else tuple(shape)


def _tensors(value: Any, what: str) -> list[SymbolicTensor]:
    items = list(value.values()) if isinstance(value, dict) else list(value) if isinstance(
        value, list | tuple) else [value]
    if not items or not all(isinstance(t, SymbolicTensor) for t in items):
        raise ConfigError(f"Model({what}=...) takes pk.Input / layer outputs (or a list of "
                          f"them), got {value!r}.")
    return items


class GraphModule(LayerStack):
    """Runs a Graph: each layer's module (built once, shared by its calls), in order."""

    def __init__(self, graph: Graph, rngs: nnx.Rngs) -> None:
        self._init_stack([layer.build(list(shape) if layer.inputs == "many" else shape, rngs)
                          for layer, shape in zip(graph.layers, graph.input_shapes,
                                                  strict=True)], graph.layers)
        self.ops = graph.ops
        self.inputs, self.input_names = graph.inputs, graph.input_names
        self.outputs = graph.outputs

    def __call__(self, x: Any, logits: Sequence[bool] | None = None,
                 mask: jax.Array | None = None, with_masks: bool = False) -> Any:
        """The outputs; with `with_masks`, (outputs, each output's timestep mask or None)."""
        if isinstance(x, dict):
            missing = [n for n in self.input_names if n not in x]
            if missing:
                raise ConfigError(f"inputs {missing} are missing from x (keys {sorted(x)}).")
            xs = [x[n] for n in self.input_names]
        else:
            xs = list(x) if isinstance(x, list | tuple) else [x]
        values = dict(zip(self.inputs, xs, strict=True))
        raw: dict[int, jax.Array] = {}
        masks: dict[int, jax.Array | None] = {}  # timestep masks by node
        for op in self.ops:
            args = [values[i] for i in op.reads]
            step_mask = masks.get(op.reads[0]) if len(op.reads) == 1 or \
                self.first_mask[op.layer] else None
            raw[op.writes], values[op.writes] = self.apply(
                op.layer, args, mask, dict(op.options), step_mask=step_mask)
            masks[op.writes] = self.mask_rules[op.layer](args[0] if len(args) == 1 else args,
                                                         step_mask)
        logits = logits or (False,) * len(self.outputs)
        outs = tuple(raw[o] if want and o in raw else values[o]
                     for o, want in zip(self.outputs, logits, strict=True))
        out = outs if len(outs) > 1 else outs[0]
        return (out, tuple(masks.get(o) for o in self.outputs)) if with_masks else out


# -- config ---------------------------------------------------------------------------------------
def graph_config(graph: Graph) -> dict:
    """The graph as JSON: layer configs and the wiring between node ids."""
    return {
        "layers": [serialize(layer) for layer in graph.layers],
        "inputs": [{"id": i, "name": n, "shape": list(s), "dtype": jnp.dtype(d).name}
                   for i, n, (s, d) in zip(graph.inputs, graph.input_names, graph.input_specs,
                                           strict=True)],
        "ops": [{"layer": op.layer, "reads": list(op.reads), "writes": op.writes,
                 **({"options": dict(op.options)} if op.options else {})}
                for op in graph.ops],
        "outputs": list(graph.outputs),
        "output_names": list(graph.output_names),
    }


def graph_from_config(config: dict) -> tuple[Any, Any]:
    """Rebuild the symbolic tensors of a saved graph (then `trace` them again): inputs as a
    dict by name, outputs as a dict by name (the saved names come back as they were)."""
    layers = [deserialize(c) for c in config["layers"]]
    nodes: dict[int, SymbolicTensor] = {}
    inputs = []
    for spec in config["inputs"]:
        t = Input(tuple(spec["shape"]), spec["dtype"], spec["name"])
        nodes[spec["id"]] = t
        inputs.append(t)
    for op in config["ops"]:
        layer = layers[op["layer"]]
        args = [nodes[i] for i in op["reads"]]
        args = args if layer.inputs == "many" else args[0]
        nodes[op["writes"]] = call_layer(layer, args, op.get("options"))
        layer.record_call(args, nodes[op["writes"]])  # layer.output of the loaded model
    outputs = [nodes[i] for i in config["outputs"]]
    names = config.get("output_names")
    return ({t.name: t for t in inputs},
            dict(zip(names, outputs, strict=True)) if names else outputs)
