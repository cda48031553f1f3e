"""The learning rate inside an optimizer state: injected (`optax.inject_hyperparams`) so that
a callback sets it without recompiling, a schedule evaluated from the state's own step count,
and the readers and writers the model and the train step use."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from podkit.errors import ConfigError
from podkit.optimizers.schedules import LearningRateSchedule


def inject_learning_rate(factory: Any, learning_rate: float | LearningRateSchedule
                         ) -> optax.GradientTransformation:
    """`optax.inject_hyperparams(factory)(learning_rate=...)` with one state tree for a float
    and a schedule: the rate in `hyperparams`, no `hyperparams_states`. A schedule is evaluated
    from the state's own step count (`count`) at every update, so a resumed run may switch
    between a constant rate and a schedule, or to another schedule, and the new one continues
    from the restored count (optax's schedule state would be another tree, a copy of that
    count; `checkpoint.arrays.DROPPED` leaves it unread in older files)."""
    if not callable(learning_rate):
        return optax.inject_hyperparams(factory)(learning_rate=learning_rate)
    schedule = learning_rate
    tx = optax.inject_hyperparams(factory)(learning_rate=0.0)

    def with_rate(state: Any) -> Any:
        value = jnp.asarray(schedule(state.count))
        if getattr(value, "weak_type", False) or not jnp.issubdtype(value.dtype, jnp.floating):
            # optax's rule: a weakly typed rate takes the state's dtype (the parameters')
            value = value.astype(state.hyperparams["learning_rate"].dtype)
        return state._replace(hyperparams={**state.hyperparams, "learning_rate": value})

    def init(params: Any) -> Any:
        return with_rate(tx.init(params))

    def update(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> Any:
        return tx.update(updates, with_rate(state), params, **extra_args)

    return optax.GradientTransformationExtraArgs(init, update)


_INJECTED = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)


def _is_injected(node: Any) -> bool:
    return isinstance(node, _INJECTED)


def learning_rate_of(opt_state: Any) -> float | None:
    """The learning rate held in an optimizer state (None when it holds none)."""
    for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
        if _is_injected(node) and "learning_rate" in node.hyperparams:
            return float(jax.device_get(node.hyperparams["learning_rate"]))
    return None


def learning_rate_in(opt_state: Any) -> Any:
    """The learning-rate array held in an optimizer state, inside a traced step (None when
    it holds none)."""
    for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
        if _is_injected(node) and "learning_rate" in node.hyperparams:
            return node.hyperparams["learning_rate"]
    return None


def step_count_of(opt_state: Any) -> int:
    """The optimizer steps taken, as the state counts them (what schedules read)."""
    for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
        if _is_injected(node):
            return int(jax.device_get(node.count))
    return 0


def with_learning_rate(opt_state: Any, value: float) -> Any:
    """The same optimizer state with a new learning rate: same dtype and placement, so the
    compiled step is reused as it is."""
    found = []

    def replace(node: Any) -> Any:
        if _is_injected(node) and "learning_rate" in node.hyperparams and not found:
            old = node.hyperparams["learning_rate"]
            new = jnp.asarray(value, old.dtype)
            if isinstance(old, jax.Array):
                new = jax.device_put(new, old.sharding)
            found.append(True)
            return node._replace(hyperparams={**node.hyperparams, "learning_rate": new})
        return node

    out = jax.tree.map(replace, opt_state, is_leaf=_is_injected)
    if not found:
        raise ConfigError("this optimizer state holds no learning rate (see OptaxOptimizer).")
    return out
