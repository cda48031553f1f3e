"""Keras subclassing: a model whose `call()` calls its layers on arrays.

    class Classifier(pk.Model):
        def __init__(self):
            super().__init__()
            self.hidden = pk.layers.Dense(64, activation="relu")
            self.out = pk.layers.Dense(10)

        def call(self, x, training=False):
            return self.out(self.hidden(x))

The layers are the model's attributes (alone, or in lists and dicts), found in assignment
order and keyed by attribute path ("hidden", "blocks_0"): those keys name their weights
("params.layers.hidden.kernel"). `build_subclass` runs `call()` once on example inputs with a
`BuildScope` active: each layer called there is built from the shape it was called on (as
Keras builds on the first call) and applied, so the next layer sees real shapes.
`SubclassModule` is the NNX module that holds the built layers and runs `call()` again with a
`RunScope`, whose layers are the module's own (the arrays jit traces). A layer called on
arrays reaches the active scope through `podkit.layers.symbolic.call_layer`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit.errors import ConfigError
from podkit.layers.base import ACTIVATIONS, Layer
from podkit.layers.stack import run_layer
from podkit.layers.symbolic import eager_scope


def find_layers(owner: Any) -> list[tuple[str, Layer]]:
    """The layers among `owner`'s attributes (a layer, or lists / tuples / dicts of them; a
    podkit model as the layer `as_layer()` gives), keyed by attribute path, in assignment
    order; a layer reachable twice keeps its first key. Attributes the owner names in
    `_base_attributes` (what pk.Model itself keeps) are not searched."""
    out: list[tuple[str, Layer]] = []
    seen: set[int] = set()

    def add(key: str, value: Any) -> None:
        as_layer = getattr(value, "as_layer", None)
        if not isinstance(value, Layer) and callable(as_layer) and value is not owner:
            value = as_layer()
        if isinstance(value, Layer) and getattr(value, "model", None) is owner:
            return  # the owner's own layer form (its as_layer()), not one of its layers
        if isinstance(value, Layer):
            if id(value) not in seen:
                seen.add(id(value))
                out.append((key, value))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                add(f"{key}_{i}", v)
        elif isinstance(value, dict):
            for k, v in value.items():
                add(f"{key}_{k}", v)

    skip = getattr(owner, "_base_attributes", frozenset())
    for name, value in vars(owner).items():
        if name not in skip:
            add(name, value)
    return out


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(x)[1:])


def _apply(layer: Layer, module: nnx.Module, inputs: Any, options: dict[str, Any],
           call_args: Mapping[str, Any], batch_mask: jax.Array | None) -> Any:
    """The built `module` of `layer` on `inputs`, its activation after it."""
    args = list(inputs) if layer.inputs == "many" else [inputs]
    if call_args.get("mask") is not None:
        if not getattr(layer, "supports_masking", False):
            raise ConfigError(f"layer {layer.name!r} ({type(layer).__name__}) takes no mask=; "
                              "masks go to recurrent and pooling layers that read them.")
        options = {**options, "mask": call_args["mask"]}
    out = run_layer(module, args, batch_mask, not layer.trainable, options,
                    training=call_args.get("training"))
    return ACTIVATIONS[layer.activation](out) if layer.activation is not None else out


class BuildScope:
    """Builds each layer at its first call inside `call()` (see the module docstring)."""

    def __init__(self, layers: list[tuple[str, Layer]], rngs: nnx.Rngs) -> None:
        self.keys = {id(layer): key for key, layer in layers}
        self.rngs = rngs
        self.modules: dict[str, nnx.Module] = {}
        self.output_shapes: dict[str, Any] = {}  # per key, for summary()

    def call(self, layer: Layer, inputs: Any, options: dict[str, Any],
             call_args: dict[str, Any]) -> Any:
        key = self.keys.get(id(layer))
        if key is None:
            raise ConfigError(
                f"layer {layer.name!r} ({type(layer).__name__}) was called in call() but is "
                "not an attribute of the model: create layers in __init__ (self.dense = "
                "pk.layers.Dense(...)), so their weights are the model's.")
        if key not in self.modules:
            shape = [_shape(t) for t in inputs] if layer.inputs == "many" else _shape(inputs)
            layer.output_shape(shape)  # a misfit is the layer's error, not XLA's
            self.modules[key] = layer.build(shape, self.rngs)
        out = _apply(layer, self.modules[key], inputs, options, call_args, None)
        self.output_shapes[key] = jax.tree.map(_shape, out)
        return out


class RunScope:
    """Runs the layers of a built SubclassModule (see the module docstring)."""

    def __init__(self, module: SubclassModule, batch_mask: jax.Array | None) -> None:
        self.module, self.batch_mask = module, batch_mask
        self.keys = {id(layer): key for key, layer in find_layers(module.owner)}

    def call(self, layer: Layer, inputs: Any, options: dict[str, Any],
             call_args: dict[str, Any]) -> Any:
        key = self.keys.get(id(layer))
        if key is None or key not in self.module.layers:
            raise ConfigError(
                f"layer {layer.name!r} was not called when the model was built (the first "
                "call() decides the layers); call every layer on every path, or build the "
                "model again.")
        return _apply(layer, self.module.layers[key], inputs, options, call_args,
                      self.batch_mask)


def _call(owner: Any, x: Any, training: bool) -> Any:
    if "training" in inspect.signature(owner.call).parameters:
        return owner.call(x, training=training)
    return owner.call(x)


class SubclassModule(nnx.Module):
    """The built layers of a subclassed model and its `call()` (see the module docstring).
    `deterministic` is what nnx's train()/eval() set: `call(x, training=not deterministic)`."""

    def __init__(self, owner: Any, modules: dict[str, nnx.Module]) -> None:
        self.owner = owner  # the user's model object: static, its call() is the program
        self.layers = nnx.Dict(modules)
        self.deterministic = False

    def __call__(self, x: Any, logits: Any = None, mask: jax.Array | None = None,
                 with_masks: bool = False) -> Any:
        # `logits`: podkit's steps ask every built module for them; a call() has no final
        # activation podkit could leave out, so its outputs are what call() returns. Its
        # masks are passed by hand inside call(): none reaches the loss (`with_masks`: None).
        with eager_scope(RunScope(self, mask)):
            out = _call(self.owner, x, training=not self.deterministic)
        return (out, None) if with_masks else out

    def penalty(self) -> jax.Array:
        """The layers' regularization terms (added to the loss)."""
        total = jnp.zeros((), jnp.float32)
        for key, layer in find_layers(self.owner):
            if key not in self.layers:
                continue
            module = self.layers[key]
            for attr, regularizer in layer.regularized:
                total = total + regularizer(getattr(module, attr)[...])
            if callable(getattr(module, "penalty", None)):  # a nested model's
                total = total + module.penalty()
        return total


def build_subclass(owner: Any, example: Any, rngs: nnx.Rngs
                   ) -> tuple[SubclassModule, dict[str, Any]]:
    """Build the layers `owner.call(example)` calls; the module and each layer's output
    shape (batch excluded) by key."""
    scope = BuildScope(find_layers(owner), rngs)
    with eager_scope(scope):
        out = _call(owner, example, training=False)
    batch = jax.tree.leaves(example)[0].shape[0]
    for leaf in jax.tree.leaves(out):
        shape = getattr(leaf, "shape", None)
        if shape is None or not shape or shape[0] != batch:
            raise ConfigError(
                f"{type(owner).__name__}.call() returned "
                f"{'an array' if shape is not None else type(leaf).__name__} of shape "
                f"{shape} for a batch of {batch}: every output keeps the batch as its first "
                "dim (slice axis 1 and after: x[:, :3]; reduce with axis=-1, not over the "
                "batch).")
    if not scope.modules:
        raise ConfigError(f"{type(owner).__name__}.call() called no podkit layer: a subclassed "
                          "model computes its outputs with layers created in __init__.")
    return SubclassModule(owner, scope.modules), scope.output_shapes
