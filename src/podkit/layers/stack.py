"""How podkit-built modules run their layers: activations (left out for logits), masked batch
statistics, frozen layers, and the regularization penalty.

`SequentialModule` (a list of layers) and `functional.GraphModule` (a graph of them) both hold
one NNX module per layer plus this static bookkeeping, and share `run_layer` and `penalty`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers.base import ACTIVATIONS, Layer, Shape


def run_layer(module: nnx.Module, args: Sequence[jax.Array], mask: jax.Array | None,
              frozen: bool, options: Mapping[str, Any] | None = None,
              training: bool | None = None) -> jax.Array:
    """One layer's module on its inputs (and the call's keyword `options`). Batch statistics
    see only real rows (`mask`, 1 for an example, 0 for padding); a frozen
    BatchNormalization uses its running statistics. `training` (a subclassed model's
    `layer(x, training=...)`) overrides the model's mode for this call."""
    if isinstance(module, nnx.BatchNorm):
        x = args[0]
        m = None if mask is None else (mask > 0).reshape(mask.shape + (1,) * (x.ndim - 1))
        running = True if frozen else (None if training is None else not training)
        return module(x, use_running_average=running, mask=m)
    if isinstance(module, nnx.Dropout) and training is not None:
        return module(*args, deterministic=not training)
    if training is not None:  # a nested model or other module: its layers in that mode
        with _mode(module, training):
            return module(*args, **(options or {}))
    return module(*args, **(options or {}))


MODE_ATTRIBUTES = ("deterministic", "use_running_average")


@contextlib.contextmanager
def _mode(module: nnx.Module, training: bool) -> Iterator[None]:
    """`module` and every module inside it in training (or inference) mode for a block, then
    as they were: what nnx's train()/eval() set."""
    saved = []
    for _, sub in nnx.iter_modules(module):
        for attr in MODE_ATTRIBUTES:
            if hasattr(sub, attr):
                saved.append((sub, attr, getattr(sub, attr)))
                object.__setattr__(sub, attr, not training)
    try:
        yield
    finally:
        for sub, attr, value in saved:
            object.__setattr__(sub, attr, value)


class LayerStack(nnx.Module):
    """The parts shared by podkit's built modules (see the module docstring)."""

    def _init_stack(self, modules: Sequence[nnx.Module], layers: Sequence[Layer]) -> None:
        self.layers = nnx.List(list(modules))
        self.activations = tuple(layer.activation for layer in layers)
        self.frozen = tuple(not layer.trainable for layer in layers)
        self.regularized = tuple(layer.regularized for layer in layers)
        # Timestep masks (Embedding(mask_zero=True) -> LSTM): who reads one, how each passes.
        self.takes_mask = tuple(layer.supports_masking for layer in layers)
        self.first_mask = tuple(layer.mask_from_first for layer in layers)
        self.mask_rules = tuple(layer.output_mask for layer in layers)

    def apply(self, i: int, args: Sequence[jax.Array], mask: jax.Array | None,
              options: Mapping[str, Any] | None = None, step_mask: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
        """(pre-activation, post-activation) output of layer i; `step_mask` is the timestep
        mask of its input, handed to a layer that reads one."""
        options = dict(options or {})
        if step_mask is not None and self.takes_mask[i]:
            options["mask"] = step_mask
        training = options.pop("training", None)  # Keras's layer(x, training=...) of a call
        out = run_layer(self.layers[i], args, mask, self.frozen[i], options, training)
        act = self.activations[i]
        return out, (ACTIVATIONS[act](out) if act is not None else out)

    def penalty(self) -> jax.Array:
        """The sum of the layers' regularization terms (added to the loss)."""
        total = jnp.zeros((), jnp.float32)
        for module, terms in zip(self.layers, self.regularized, strict=True):
            for attr, regularizer in terms:
                total = total + regularizer(getattr(module, attr)[...])
            if callable(getattr(module, "penalty", None)):  # a nested model's
                total = total + module.penalty()
        return total


class SequentialModule(LayerStack):
    """The built NNX module of a Sequential: layers in order, each with its activation.

    `logits=(True,)` leaves out a final softmax/sigmoid so that cross-entropy can be computed
    from logits (finite for confident predictions, exact gradients).
    """

    def __init__(self, modules: Sequence[nnx.Module], layers: Sequence[Layer]) -> None:
        self._init_stack(modules, layers)

    def __call__(self, x: jax.Array, logits: Sequence[bool] = (False,),
                 mask: jax.Array | None = None, with_masks: bool = False) -> Any:
        """The output; with `with_masks`, (output, (its timestep mask or None,)): what the
        loss and the metrics weight the steps by, as Keras's."""
        if isinstance(x, dict | list | tuple) and len(x) == 1:
            # one input given as {"name": x}, [x] or (x,), as Keras takes it: a Dataset's
            # batches arrive so, unconverted (arrays are converted by the architecture)
            (x,) = x.values() if isinstance(x, dict) else x
        last = len(self.layers) - 1
        step_mask = None
        for i in range(len(self.layers)):
            raw, out = self.apply(i, [x], mask, step_mask=step_mask)
            step_mask = self.mask_rules[i](x, step_mask)
            x = raw if logits[0] and i == last else out
        return (x, (step_mask,)) if with_masks else x


def build_sequential(layers: Sequence[Layer], input_shape: Shape, rngs: nnx.Rngs
                     ) -> tuple[SequentialModule, list[Shape]]:
    """Build every layer in order from `input_shape` (batch excluded); return the module and
    the output shape after each layer."""
    shapes: list[Shape] = []
    modules: list[nnx.Module] = []
    shape = tuple(input_shape)
    for layer in layers:
        modules.append(layer.build(shape, rngs))
        out = layer.output_shape(shape)
        if isinstance(out, list):
            raise ConfigError(f"layer {layer.name!r} ({type(layer).__name__}) gives "
                              f"{len(out)} outputs, and a Sequential passes one from layer to "
                              "layer: use the functional API (pk.Input ... pk.Model).")
        shape = tuple(out)
        shapes.append(shape)
    return SequentialModule(modules, layers), shapes
