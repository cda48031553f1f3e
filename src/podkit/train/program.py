"""The compiled programs of one model: train, evaluate and predict, jitted once per input spec.

    program = build(spec, layout, strategy, jit=True, counts=trace_count)
    state, sums = program.train(state, sums, inputs)     # k steps per call, state donated
    logs = program.results(sums)                         # device sums -> host values

The loops drive a Program and never see the model; the model holds one and rebuilds it when
compiled again. `counts` counts traces (compilations) per kind: each new input spec is one,
which is how tests see that a learning-rate change or a second fit() compiles nothing.

Every step is traced inside its strategy's `scope()`: kernels that run per device
(podkit.kernels, inside `shard_map`) read the mesh they run over from it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from podkit.strategy import Strategy
from podkit.train import step as step_lib
from podkit.train.feeds.inputs import BatchInputs
from podkit.train.state import StateLayout

KINDS = ("train", "evaluate", "predict")


@dataclasses.dataclass(frozen=True)
class Program:
    """The compiled steps of one model, and what their sums mean.

    train(state, sums, inputs) -> (state, sums); evaluate(state, sums, inputs) -> sums;
    predict(state, inputs) -> (outputs, mask)."""

    spec: step_lib.StepSpec
    train: Callable
    evaluate: Callable
    predict: Callable
    sums_sharding: NamedSharding
    strategy: Strategy

    def zeros(self) -> Any:
        """Metric sums at zero, placed where the steps keep them."""
        return step_lib.zero_sums(self.spec, self.sums_sharding)

    def results(self, sums: Any) -> dict[str, float]:
        """Loss and metric values ("loss", "accuracy", ...) from device sums."""
        return step_lib.results(self.spec, jax.device_get(sums))

    def precompile_train(self, abstract_state: Any, sums: Any, inputs: Any) -> None:
        """Compile `train` for a state laid out as `abstract_state` (its ShapeDtypeStructs
        with shardings) and these sums and inputs, before the state exists: JAX keeps the
        executable, and the first `train` call with a real state of that layout runs it
        (no second trace or compile). Eager programs have nothing to compile."""
        lower = getattr(self.train, "lower", None)
        if lower is not None:
            lower(abstract_state, sums, inputs).compile()

    def output_shapes(self, abstract_state: Any, example: Any) -> tuple[tuple[int, ...], ...]:
        """The shape of each output for one example (batch dims excluded), traced abstractly:
        nothing is compiled or run."""
        with self.strategy.scope():
            out = jax.eval_shape(lambda s, x: step_lib.make_predict_step(self.spec)(
                s, BatchInputs(jax.tree.map(lambda a: a[None], x), jnp.zeros((1, 1)),
                               jnp.ones((1, 1)), jnp.ones((1, 1))))[0],
                abstract_state, example)
        return tuple(tuple(o.shape[2:]) for o in out)


def build(spec: step_lib.StepSpec, layout: StateLayout, strategy: Strategy, *, jit: bool,
          counts: dict[str, int]) -> Program:
    """Jit the three steps of `spec` for a state laid out as `layout` (train donates the
    state and keeps it in the layout's shardings; the sums are replicated). `jit=False` runs
    the same steps eagerly (Keras's run_eagerly). Every trace adds one to `counts[kind]`."""
    unroll = not jit
    train = _counting(counts, "train", step_lib.make_train_step(spec, unroll), strategy)
    evaluate = _counting(counts, "evaluate", step_lib.make_eval_step(spec, unroll), strategy)
    predict = _counting(counts, "predict", step_lib.make_predict_step(spec, unroll), strategy)
    sums = strategy.replicated()
    if jit:
        train = jax.jit(train, donate_argnums=(0,), out_shardings=(layout.shardings, sums))
        evaluate = jax.jit(evaluate, out_shardings=sums)
        predict = jax.jit(predict)
    else:
        train, evaluate, predict = (_eager(f) for f in (train, evaluate, predict))
    return Program(spec, train, evaluate, predict, sums, strategy)


def _counting(counts: dict[str, int], kind: str, fn: Callable, strategy: Strategy
              ) -> Callable:
    """Counts traces (compilations): each new input spec or changed argument is one. The
    trace runs in the strategy's scope (see the module docstring)."""
    def traced(*args: Any) -> Any:
        counts[kind] += 1
        with strategy.scope():
            return fn(*args)
    return traced


def _eager(fn: Callable) -> Callable:
    def run(*args: Any) -> Any:
        with jax.disable_jit():
            return fn(*args)

    return run
