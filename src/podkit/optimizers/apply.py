"""Keras 3's `BaseOptimizer.apply` as one Optax transformation, op for op.

Keras applies gradients in this order (keras/src/optimizers/base_optimizer.py and the JAX
backend's `JaxOptimizer._backend_apply_gradients`): clip the gradients (`clipnorm` per
variable, or `global_clipnorm`, or `clipvalue`), decay each variable (`var -= var * wd * lr`),
run the optimizer's `update_step(gradient, variable, learning_rate)` per variable, update the
moving average of the weights (`use_ema`) and overwrite the weights with it every
`ema_overwrite_frequency` steps, and count the step (`iterations`). The learning rate is the
schedule's value at `iterations` before the increment.

`keras_transform` does the same, in the same order of operations, so float32 rounds as it
does in Keras. What an optimizer does per variable comes from its `Rule` (the optimizer
object): its slots (Adam's momentum and velocity), the scalars it shares across variables
(Nadam's product of momentum decays), and its update step, which says how Keras changes the
variable (`Step`: subtracted, added, or set). Optax adds the update to the parameter
(`optax.apply_updates`), so a step Keras subtracts becomes the update `-x`: `var + (-x)` is
exactly `var - x`. Only where Keras changes a variable twice in a step (weight decay, then
the update; the EMA overwriting it) is the update the difference of the new value and the
old, which is exact whenever the two are within a factor of two (Sterbenz), and else
within one rounding of the weight.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import optax

from podkit.errors import ConfigError


class Step(NamedTuple):
    """How Keras's update step changes a variable: `assign_sub(var, value)` ("sub"),
    `assign_add(var, value)` ("add") or `assign(var, value)` ("set")."""

    kind: str
    value: jax.Array


def sub(value: jax.Array) -> Step:
    return Step("sub", value)


def add(value: jax.Array) -> Step:
    return Step("add", value)


def assign(value: jax.Array) -> Step:
    return Step("set", value)


class Rule(Protocol):
    """What an optimizer does per variable (implemented by podkit's Optimizer classes)."""

    slot_names: tuple[str, ...]

    def init_slot(self, name: str, param: jax.Array) -> jax.Array: ...

    def init_shared(self, dtype: Any) -> dict[str, jax.Array]: ...

    def decay(self, variable: jax.Array, learning_rate: jax.Array, weight_decay: float
              ) -> jax.Array: ...

    def update_shared(self, shared: dict[str, jax.Array], iterations: jax.Array
                      ) -> dict[str, jax.Array]: ...

    def update_step(self, gradient: jax.Array, variable: jax.Array, slots: dict[str, Any],
                    learning_rate: jax.Array, iterations: jax.Array,
                    shared: dict[str, jax.Array]) -> tuple[Step, dict[str, Any]]: ...


class Options(NamedTuple):
    """Keras's base-optimizer arguments, as the transformation applies them."""

    weight_decay: float | None = None
    clipnorm: float | None = None
    clipvalue: float | None = None
    global_clipnorm: float | None = None
    use_ema: bool = False
    ema_momentum: float = 0.99
    ema_overwrite_frequency: int | None = None
    # Keras's exclude_from_weight_decay(var_names=...): a regex searched in each weight's
    # name (the last key of its path, as Keras's `variable.name`: "kernel", "bias").
    exclude_pattern: str | None = None
    # False: the rule decays the weights itself (LARS, inside its trust ratio).
    keras_weight_decay: bool = True


class KerasState(NamedTuple):
    """The state of one optimizer: Keras's `iterations`, each slot as a tree shaped as the
    parameters (`slots["momentum"]`), the scalars shared by every variable, and the moving
    average of the parameters when `use_ema` (else None)."""

    iterations: jax.Array
    slots: dict[str, Any]
    shared: dict[str, jax.Array]
    ema: Any


def keras_transform(rule: Rule, learning_rate: Any, options: Options
                    ) -> optax.GradientTransformation:
    """Keras's `optimizer.apply(grads, variables)` for the rule at this learning rate (a
    scalar; `optax.inject_hyperparams` passes the state's)."""

    def init(params: Any) -> KerasState:
        slots = {name: jax.tree.map(lambda p, n=name: rule.init_slot(n, p), params)
                 for name in rule.slot_names}
        ema = jax.tree.map(jnp.zeros_like, params) if options.use_ema else None
        return KerasState(iterations=jnp.zeros([], jnp.int32), slots=slots,
                          shared=rule.init_shared(_first_dtype(params)), ema=ema)

    def update(grads: Any, state: KerasState, params: Any = None) -> tuple[Any, KerasState]:
        if params is None:
            raise ConfigError("podkit's Keras optimizers need the parameters in update() "
                              "(weight decay and several update steps read them): call "
                              "tx.update(grads, state, params).")
        leaves, treedef = jax.tree.flatten(grads)
        variables = treedef.flatten_up_to(params)
        names = [_weight_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(
            grads)[0]]
        slots = {k: treedef.flatten_up_to(v) for k, v in state.slots.items()}
        it = state.iterations
        lr = jnp.asarray(learning_rate)
        leaves = _clip(leaves, options)
        decays = [_decays(options, name) for name in names]
        decayed = [rule.decay(v, lr, options.weight_decay) if d else v
                   for v, d in zip(variables, decays, strict=True)]
        shared = rule.update_shared(state.shared, it)
        new_vars, updates, new_slots = [], [], {k: [] for k in slots}
        for i, (g, v0, v1) in enumerate(zip(leaves, variables, decayed, strict=True)):
            step, own = rule.update_step(g, v1, {k: s[i] for k, s in slots.items()},
                                         lr, it, shared)
            new, delta = _applied(step, v0, v1, decayed=decays[i])
            new_vars.append(new)
            updates.append(delta)
            for k in slots:
                new_slots[k].append(own[k])
        ema = state.ema
        if options.use_ema:
            averages = treedef.flatten_up_to(ema)
            averages = [_moving_average(a, v, it, options.ema_momentum)
                        for a, v in zip(averages, new_vars, strict=True)]
            if options.ema_overwrite_frequency:
                due = (it + 1) % options.ema_overwrite_frequency == 0
                updates = [jnp.where(due, a - v0, u) for a, v0, u in
                           zip(averages, variables, updates, strict=True)]
            ema = treedef.unflatten(averages)
        new_state = KerasState(
            iterations=optax.safe_increment(it),
            slots={k: treedef.unflatten(v) for k, v in new_slots.items()},
            shared=shared, ema=ema)
        return treedef.unflatten(updates), new_state

    return optax.GradientTransformation(init, update)


def finalized_params(opt_state: Any, params: Any) -> Any:
    """Keras's `finalize_variable_values`: with `use_ema`, the parameters replaced by their
    moving average (frozen ones, which have none, as they are); None when the state keeps
    no average or has taken no step."""
    found = [n for n in jax.tree.leaves(opt_state, is_leaf=_is_state) if _is_state(n)]
    if not found or found[0].ema is None:
        return None
    state = found[0]
    if int(jax.device_get(state.iterations)) == 0:
        return None  # nothing averaged yet (Keras would write its zeros into the weights)
    masked = lambda x: isinstance(x, optax.MaskedNode)
    ema = jax.tree.map(lambda a, p: p if masked(a) else a, state.ema, params, is_leaf=masked)
    return _copied(ema)  # never the EMA's own buffers: the next step donates both


@jax.jit
def _copied(tree: Any) -> Any:
    return jax.tree.map(jnp.copy, tree)


def _is_state(node: Any) -> bool:
    return isinstance(node, KerasState)


def _first_dtype(params: Any) -> Any:
    """The dtype of the first variable (what Keras's Nadam keeps its shared product in)."""
    leaves = jax.tree.leaves(params)
    return leaves[0].dtype if leaves else jnp.float32


def _weight_name(path: tuple) -> str:
    if not path:
        return ""
    key = path[-1]
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def _decays(options: Options, name: str) -> bool:
    if options.weight_decay is None or not options.keras_weight_decay:
        return False
    return options.exclude_pattern is None or re.search(options.exclude_pattern, name) is None


def _applied(step: Step, before: jax.Array, after_decay: jax.Array, *, decayed: bool
             ) -> tuple[jax.Array, jax.Array]:
    """(the variable after Keras's step, the update Optax adds to `before`)."""
    kind, x = step
    if kind == "set":
        return x, x - before
    new = after_decay - x if kind == "sub" else after_decay + x
    if decayed:
        return new, new - before
    return new, (-x if kind == "sub" else x)


def _clip(grads: list, options: Options) -> list:
    """Keras's `_clip_gradients` (at most one of the three is set)."""
    if options.clipnorm and options.clipnorm > 0:
        return [_clip_by_norm(g, options.clipnorm) for g in grads]
    if options.global_clipnorm and options.global_clipnorm > 0 and grads:
        return _clip_by_global_norm(grads, options.global_clipnorm)
    if options.clipvalue and options.clipvalue > 0:
        v = options.clipvalue
        return [jnp.clip(g, -v, v) for g in grads]
    return grads


def _clip_by_norm(values: jax.Array, clipnorm: float) -> jax.Array:
    """Keras's `_clip_by_norm`: always `values * clipnorm / max(norm, clipnorm)`."""
    l2sum = jnp.sum(jnp.square(values), keepdims=True)
    pred = l2sum > 0
    l2sum_safe = jnp.where(pred, l2sum, jnp.ones_like(l2sum))
    l2norm = jnp.where(pred, jnp.sqrt(l2sum_safe), l2sum)
    return (values * clipnorm) / jnp.maximum(l2norm, clipnorm)


def _clip_by_global_norm(grads: list, clip_norm: float) -> list:
    """Keras's `clip_by_global_norm` (a non-finite norm makes every gradient NaN)."""
    use_norm = jnp.sqrt(jnp.sum(jnp.stack([jnp.sum(jnp.square(g)) for g in grads])))
    scale_for_finite = clip_norm * jnp.minimum(1.0 / use_norm, 1.0 / clip_norm)
    scale = scale_for_finite + (use_norm - use_norm)
    return [g * scale for g in grads]


def _moving_average(average: jax.Array, variable: jax.Array, iterations: jax.Array,
                    ema_momentum: float) -> jax.Array:
    """Keras's `_update_model_variables_moving_average`: the first step copies."""
    momentum = (iterations != 0).astype(variable.dtype) * ema_momentum
    return momentum * average + (1 - momentum) * variable
