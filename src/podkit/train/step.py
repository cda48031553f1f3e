"""Pure step builders: (state, sums, inputs) -> (state, sums), compiled once per input spec.

One execution runs k steps (lax.scan) where k is the leading dim of the inputs. Inputs come in
two forms, chosen by the feed and invisible to the step's maths:
  * fed batches:   {"x": (k, B, ...), "y": (k, B, ...), "w": (k, B)}
  * staged arrays: {"data": (X, Y), "idx": (k, B) row ids, "w": (k, B)} - the whole dataset
    lives on the devices and each step gathers its rows there, so no batch crosses the host.
`w` is the per-example weight: 1 for real examples, 0 for padding, so padded batches keep one
shape (no recompiles) and contribute nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding

from podkit.layers import ACTIVATIONS
from podkit.losses import Loss
from podkit.metrics import Metric

State = dict[str, Any]
Sums = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything a step needs that is not an array."""

    graphdef: Any
    loss: Loss
    metrics: tuple[Metric, ...]
    tx: optax.GradientTransformation
    fused_activation: str | None  # final softmax/sigmoid folded into the loss (from logits)
    batch_sharding: NamedSharding  # of one step's batch dim

    def sum_names(self) -> tuple[str, ...]:
        return ("weight", "loss", *(m.name for m in self.metrics))


def zero_sums(spec: StepSpec, sharding: NamedSharding) -> Sums:
    zeros = {name: jnp.zeros((), jnp.float32) for name in spec.sum_names()}
    return jax.device_put(zeros, sharding)


def _take(inputs: dict, i: jax.Array, spec: StepSpec) -> tuple[Any, Any, jax.Array]:
    """The batch of step i of this execution."""
    constrain = lambda a: jax.lax.with_sharding_constraint(a, spec.batch_sharding)  # noqa: E731
    if "idx" in inputs:
        rows = inputs["idx"][i]
        x, y = jax.tree.map(lambda a: constrain(a[rows]), inputs["data"])
    else:
        x, y = jax.tree.map(lambda a: a[i], (inputs["x"], inputs["y"]))
    return x, y, inputs["w"][i]


def _steps_in(inputs: dict) -> int:
    return inputs["w"].shape[0]


def _forward(spec: StepSpec, params: Any, rest: Any, x: Any, training: bool):
    model = nnx.merge(spec.graphdef, params, rest)
    model.train() if training else model.eval()
    if spec.fused_activation is not None:
        out = model(x, return_logits=True)
    else:
        out = model(x)
    new_rest = nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))
    return out, new_rest


def _accumulate(spec: StepSpec, sums: Sums, per_example_loss, out, y, w) -> Sums:
    pred = ACTIVATIONS[spec.fused_activation](out) if spec.fused_activation else out
    new = dict(sums)
    new["weight"] = sums["weight"] + w.sum()
    new["loss"] = sums["loss"] + (per_example_loss * w).sum()
    for m in spec.metrics:
        new[m.name] = sums[m.name] + (m.fn(y, pred) * w).sum()
    return new


def _run(body: Callable, carry: Any, k: int, unroll: bool) -> Any:
    if k == 1 or unroll:  # eager (jit=False) runs the steps as a plain loop
        for i in range(k):
            carry, _ = body(carry, jnp.int32(i))
        return carry
    carry, _ = jax.lax.scan(body, carry, jnp.arange(k, dtype=jnp.int32))
    return carry


def make_train_step(spec: StepSpec, unroll: bool = False) -> Callable[[State, Sums, dict], Any]:
    """The pure train step: k optimizer updates, one per batch of `inputs`."""

    def train_step(state: State, sums: Sums, inputs: dict):
        def body(carry, i):
            state, sums = carry
            x, y, w = _take(inputs, i, spec)

            def loss_of(params):
                out, rest = _forward(spec, params, state["rest"], x, training=True)
                per_example = spec.loss(y, out, from_logits=spec.fused_activation is not None)
                mean = (per_example * w).sum() / jnp.maximum(w.sum(), 1.0)
                return mean, (out, rest, per_example)

            grads, (out, rest, per_example) = jax.grad(loss_of, has_aux=True)(state["params"])
            updates, opt_state = spec.tx.update(grads, state["opt_state"], state["params"])
            new_state = {
                "step": state["step"] + 1,
                "params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state,
                "rest": rest,
            }
            return (new_state, _accumulate(spec, sums, per_example, out, y, w)), None

        return _run(body, (state, sums), _steps_in(inputs), unroll)

    return train_step


def make_eval_step(spec: StepSpec, unroll: bool = False) -> Callable[[State, Sums, dict], Sums]:
    """The pure eval step: loss and metric sums over k batches; state is read, not changed."""

    def eval_step(state: State, sums: Sums, inputs: dict) -> Sums:
        def body(sums, i):
            x, y, w = _take(inputs, i, spec)
            out, _ = _forward(spec, state["params"], state["rest"], x, training=False)
            per_example = spec.loss(y, out, from_logits=spec.fused_activation is not None)
            return _accumulate(spec, sums, per_example, out, y, w), None

        return _run(body, sums, _steps_in(inputs), unroll)

    return eval_step


def make_predict_step(spec: StepSpec, unroll: bool = False) -> Callable[[State, dict], jax.Array]:
    """The pure predict step: the model's outputs (final activation applied), (k, B, ...)."""

    def predict_step(state: State, inputs: dict) -> jax.Array:
        def one(i):
            x, _, _ = _take(inputs, i, spec)
            out, _ = _forward(spec, state["params"], state["rest"], x, training=False)
            return ACTIVATIONS[spec.fused_activation](out) if spec.fused_activation else out

        k = _steps_in(inputs)
        if k == 1 or unroll:
            return jnp.stack([one(jnp.int32(i)) for i in range(k)])
        return jax.lax.map(one, jnp.arange(k, dtype=jnp.int32))

    return predict_step
