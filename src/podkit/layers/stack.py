"""How podkit-built modules run their layers: activations (left out for logits), masked batch
statistics, frozen layers, and the regularization penalty.

`SequentialModule` (a list of layers) and `functional.GraphModule` (a graph of them) both hold
one NNX module per layer plus this static bookkeeping, and share `run_layer` and `penalty`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.layers.base import ACTIVATIONS, Layer, Shape


def run_layer(module: nnx.Module, args: Sequence[jax.Array], mask: jax.Array | None,
              frozen: bool, options: Mapping[str, Any] | None = None) -> jax.Array:
    """One layer's module on its inputs (and the call's keyword `options`). Batch statistics
    see only real rows (`mask`, 1 for an example, 0 for padding); a frozen
    BatchNormalization uses its running statistics."""
    if isinstance(module, nnx.BatchNorm):
        x = args[0]
        m = None if mask is None else (mask > 0).reshape(mask.shape + (1,) * (x.ndim - 1))
        return module(x, use_running_average=True if frozen else None, mask=m)
    return module(*args, **(options or {}))


class LayerStack(nnx.Module):
    """The parts shared by podkit's built modules (see the module docstring)."""

    def _init_stack(self, modules: Sequence[nnx.Module], layers: Sequence[Layer]) -> None:
        self.layers = nnx.List(list(modules))
        self.activations = tuple(layer.activation for layer in layers)
        self.frozen = tuple(not layer.trainable for layer in layers)
        self.regularized = tuple(layer.regularized for layer in layers)

    def apply(self, i: int, args: Sequence[jax.Array], mask: jax.Array | None,
              options: Mapping[str, Any] | None = None) -> tuple[jax.Array, jax.Array]:
        """(pre-activation, post-activation) output of layer i."""
        out = run_layer(self.layers[i], args, mask, self.frozen[i], options)
        act = self.activations[i]
        return out, (ACTIVATIONS[act](out) if act is not None else out)

    def penalty(self) -> jax.Array:
        """The sum of the layers' regularization terms (added to the loss)."""
        total = jnp.zeros((), jnp.float32)
        for module, terms in zip(self.layers, self.regularized, strict=True):
            for attr, regularizer in terms:
                total = total + regularizer(getattr(module, attr)[...])
        return total


class SequentialModule(LayerStack):
    """The built NNX module of a Sequential: layers in order, each with its activation.

    `logits=(True,)` leaves out a final softmax/sigmoid so that cross-entropy can be computed
    from logits (finite for confident predictions, exact gradients).
    """

    def __init__(self, modules: Sequence[nnx.Module], layers: Sequence[Layer]) -> None:
        self._init_stack(modules, layers)

    def __call__(self, x: jax.Array, logits: Sequence[bool] = (False,),
                 mask: jax.Array | None = None) -> jax.Array:
        last = len(self.layers) - 1
        for i in range(len(self.layers)):
            raw, x = self.apply(i, [x], mask)
            if logits[0] and i == last:
                x = raw
        return x


def build_sequential(layers: Sequence[Layer], input_shape: Shape, rngs: nnx.Rngs
                     ) -> tuple[SequentialModule, list[Shape]]:
    """Build every layer in order from `input_shape` (batch excluded); return the module and
    the output shape after each layer."""
    shapes: list[Shape] = []
    modules: list[nnx.Module] = []
    shape = tuple(input_shape)
    for layer in layers:
        modules.append(layer.build(shape, rngs))
        shape = tuple(layer.output_shape(shape))
        shapes.append(shape)
    return SequentialModule(modules, layers), shapes
