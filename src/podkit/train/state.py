"""The training state: one typed pytree with everything a step reads and writes.

    TrainState(step, params, opt_state, rest, rng)

`params` are the model's trainable variables, `rest` its other variables (batch statistics,
...), `rng` its random streams (NNX's RngState: keys and counters), `opt_state` the optimizer's
state (moments, step count, learning rate), `step` the number of optimizer steps taken. All are
pure nested dicts / optax states of jax.Arrays.

`StateLayout` says where each leaf lives: its shardings come from the logical axes the model
puts on its parameters (podkit.sharding), and the optimizer state mirrors its parameters
(optax.tree_map_params: Adam's mu and nu take the sharding of their parameter, counters and
hyperparameters are replicated). `layout.abstract` — shapes, dtypes and shardings, no data — is
the tree that checkpoints restore into, on any mesh.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from podkit.errors import InputError
from podkit.sharding import Rules, check_rules_match, state_shardings

# The variables of a module, split three ways (order matters for nnx.split).
PARAMS, RNG, REST = nnx.Param, nnx.RngState, ...


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    step: Any
    params: Any
    opt_state: Any
    rest: Any
    rng: Any

    def replace(self, **changes: Any) -> TrainState:
        return dataclasses.replace(self, **changes)

    def copy(self) -> TrainState:
        """A copy on the devices. The train step donates its input state (its buffers are
        reused for the output), so a state kept across a step must be a copy."""
        return jax.tree.map(lambda a: a.copy() if isinstance(a, jax.Array) else a, self)


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """What a TrainState looks like before it exists: the module's graph, every leaf's
    sharding and abstract value (jax.ShapeDtypeStruct with its sharding)."""

    graphdef: Any
    shardings: TrainState
    abstract: TrainState
    # Parameters that named no logical axes and took FSDP's default layout (their paths).
    defaulted: tuple[str, ...] = ()


def split(module: nnx.Module) -> tuple[Any, Any, Any, Any]:
    """(graphdef, params, rng, rest) of a module (NNX States)."""
    return nnx.split(module, PARAMS, RNG, REST)


def merge(graphdef: Any, params: Any, rest: Any, rng: Any) -> nnx.Module:
    return nnx.merge(graphdef, params, rng, rest)


def variables_of(module: nnx.Module) -> tuple[dict, dict]:
    """(rest, rng) of a module after a call, as pure dicts (what the step carries on)."""
    rng = nnx.to_pure_dict(nnx.state(module, RNG))
    rest = nnx.to_pure_dict(nnx.state(module, nnx.Not(nnx.Any(PARAMS, RNG))))
    return rest, rng


def make_layout(abstract_module: nnx.Module, tx: optax.GradientTransformation, rules: Rules,
                mesh: Mesh, required: Rules = ()) -> StateLayout:
    """The layout of the state for a module (abstract or real) trained with `tx`. Split dims
    must divide evenly, and each rule in `required` (the user's own) must match a parameter."""
    graphdef, params, rng, rest = split(abstract_module)
    replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
    seen: set[str] = set()
    defaulted: list[str] = []
    param_sh = state_shardings(params, rules, mesh, seen, defaulted)
    if defaulted:
        _warn_defaulted(defaulted, mesh)
    pure_params = _abstract(nnx.to_pure_dict(params))
    opt_abstract = jax.eval_shape(tx.init, pure_params)
    # Masked-out parameters (frozen layers under optax.multi_transform) hold no state.
    masked = lambda x: isinstance(x, optax.MaskedNode)
    # A state leaf shaped as its parameter takes its sharding; one that is not (Adafactor's
    # factored moments) is replicated.
    opt_sh = optax.tree_map_params(
        tx, lambda p, sh, param: p if masked(p) else sh if p.shape == param.shape else replicated,
        opt_abstract, param_sh, pure_params,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct) or masked(x))
    shardings = TrainState(step=replicated, params=param_sh, opt_state=opt_sh,
                           rest=state_shardings(rest, rules, mesh, seen),
                           rng=state_shardings(rng, rules, mesh))
    check_rules_match(required, seen)
    values = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=pure_params,
                        opt_state=opt_abstract, rest=_abstract(nnx.to_pure_dict(rest)),
                        rng=_abstract(nnx.to_pure_dict(rng)))
    abstract = jax.tree.map(lambda v, sh: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh),
                            values, shardings)
    return StateLayout(graphdef, shardings, abstract, tuple(defaulted))


_warned_defaults: set[tuple] = set()


def _warn_defaulted(paths: list[str], mesh: Mesh) -> None:
    """Once per set of parameters: which ones took FSDP's default layout, and how to choose."""
    key = (tuple(paths), tuple(mesh.shape.items()))
    if key in _warned_defaults:
        return
    _warned_defaults.add(key)
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    warnings.warn(f"{len(paths)} parameter(s) name no logical axes ({shown}): FSDP splits each "
                  "along its largest dim the fsdp axis divides (model.sharding_table() marks "
                  "them). To choose, annotate them: nnx.Param(value, sharding=(\"embed\", None)) "
                  "or nnx.Linear(..., kernel_init=nnx.with_partitioning(init, (\"embed\", "
                  "\"mlp\"))).", DefaultLayoutWarning, stacklevel=2)


class DefaultLayoutWarning(UserWarning):
    """Parameters without logical axes took FSDP's default layout."""


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda v: jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v))
                        if not isinstance(v, jax.ShapeDtypeStruct) else v, tree)


def _initializer(create: Callable[[], nnx.Module], tx: optax.GradientTransformation
                 ) -> Callable[[], TrainState]:
    def init() -> TrainState:
        _, params, rng, rest = split(create())
        params = nnx.to_pure_dict(params)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=tx.init(params), rest=nnx.to_pure_dict(rest),
                          rng=nnx.to_pure_dict(rng))

    return init


class PendingState:
    """A fresh TrainState whose initializer XLA is still compiling (then running) on a thread.

    Why: the initializer and the train step are independent programs until the first step
    runs, and for GPT-124M on a TPU v5e each took XLA 19-31 s to compile. The training loop
    compiles the train step against `abstract` meanwhile (`Program.train_cost`) and
    takes the state with `result()` only for the first step. Anything else that reads an
    attribute (`.params`, `.step`) waits for the state, so a PendingState can stand where a
    TrainState is read; `Model.state` never returns one."""

    def __init__(self, make: Callable[[], TrainState], abstract: Any,
                 on_thread: bool = True) -> None:
        self.abstract = abstract
        self._future: concurrent.futures.Future = concurrent.futures.Future()
        if not on_thread:
            self._future.set_result(make())
            return
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="podkit-init")
        self._future = pool.submit(make)
        pool.shutdown(wait=False)

    def result(self) -> TrainState:
        return self._future.result()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("abstract", "_future"):
            raise AttributeError(name)
        return getattr(self.result(), name)


def resolved(state: Any) -> Any:
    """`state` itself, or the TrainState a PendingState becomes (waiting for it)."""
    return state.result() if isinstance(state, PendingState) else state


def compilable(state: Any) -> Any:
    """What a step compiles against: `state` itself, or a PendingState's abstract layout
    (without waiting for the state)."""
    return state.abstract if isinstance(state, PendingState) else state


def step_of(state: Any) -> int:
    """The step `state` is at; a PendingState (a fresh state) is at 0 without waiting."""
    return 0 if isinstance(state, PendingState) else int(jax.device_get(state.step))


def init_state_async(layout: StateLayout, create: Callable[[], nnx.Module],
                     tx: optax.GradientTransformation) -> PendingState:
    """Create the state directly in its shardings: `create()` runs inside one jitted program
    whose outputs are placed by `layout.shardings` -- never built on one device and copied.
    Traced here; compiled and run on a thread (see PendingState). (Built eagerly instead, op
    by op, a replicated GPT-124M took 57 compiles and longer on a TPU v5e than this one
    program: 84.7 s to the first step against 54.3 s.)"""
    lowered = jax.jit(_initializer(create, tx), out_shardings=layout.shardings).lower()
    # With several processes the state is made here, before anything else runs: a program on
    # a thread next to the main thread's collectives (agreement all-gathers) could meet the
    # other processes' programs in another order, and a collective across processes hangs.
    return PendingState(lambda: lowered.compile()(), layout.abstract,
                        on_thread=jax.process_count() == 1)


def place_module(layout: StateLayout, module: nnx.Module,
                 tx: optax.GradientTransformation) -> TrainState:
    """The state of a module the user built already, copied into the layout's shardings (a
    copy: the steps donate their state, and the user's module keeps its own arrays)."""
    _, params, rng, rest = split(module)

    def place(params: Any, rest: Any, rng: Any) -> TrainState:
        params = jax.tree.map(jnp.copy, params)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=tx.init(params), rest=jax.tree.map(jnp.copy, rest),
                          rng=jax.tree.map(jnp.copy, rng))

    return jax.jit(place, out_shardings=layout.shardings)(
        nnx.to_pure_dict(params), nnx.to_pure_dict(rest), nnx.to_pure_dict(rng))


def fresh_optimizer(layout: StateLayout, state: TrainState,
                    tx: optax.GradientTransformation) -> TrainState:
    """The same variables with a new optimizer state (a model compiled again)."""
    opt_state = jax.jit(tx.init, out_shardings=layout.shardings.opt_state)(state.params)
    return state.replace(opt_state=opt_state)


class StateCell:
    """The state of a model, readable and replaceable while its loop runs.

    The loop holds the newest state here after every execution and reads it back before the
    next, so a callback that sets `model.state` (restore best weights, a new learning rate)
    changes what the next step trains on.
    """

    def __init__(self, state: TrainState | None = None) -> None:
        self.value = state


def describe_layout(layout: StateLayout) -> list[dict]:
    """One row per parameter and optimizer-state leaf: where it lives and what it costs.

    `{"path", "shape", "dtype", "spec", "bytes_per_device", "kind": "param" | "opt_state"}`
    — what `runs/<name>/shardings.json` holds, so a layout can be read (and diffed) before
    anyone runs it at scale. `spec` is the PartitionSpec as a list (null: not split)."""
    rows = []
    for kind, tree in (("param", layout.abstract.params), ("opt_state", layout.abstract.opt_state)):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            if not isinstance(leaf, jax.ShapeDtypeStruct):
                continue
            sharding = leaf.sharding
            shard = sharding.shard_shape(leaf.shape)
            spec = [None if e is None else e if isinstance(e, str) else list(e)
                    for e in sharding.spec]
            spec += [None] * (len(leaf.shape) - len(spec))
            row = {"path": path_name(path), "shape": list(leaf.shape),
                   "dtype": str(leaf.dtype), "spec": spec,
                   "bytes_per_device": int(math.prod(shard)) * leaf.dtype.itemsize,
                   "kind": kind}
            if kind == "param" and path_name(path) in layout.defaulted:
                row["note"] = "no logical axes: FSDP's default layout (its largest dim split)"
            rows.append(row)
    return rows


def path_parts(path: tuple) -> list[str]:
    """The names along a pytree key path (dict keys, attribute names, sequence indices) or an
    NNX graph path (plain keys)."""
    return [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]


def path_name(path: tuple) -> str:
    """A leaf's name: its path "/"-joined (`tables`, `layers/0/embedding`), as shardings.json,
    Model.summary and the row-sparse tables name parameters."""
    return "/".join(path_parts(path))


def weights(state: TrainState) -> list[jax.Array]:
    """Every variable, as Keras orders `model.weights`: the parameters, then the other
    variables (batch statistics)."""
    return [*jax.tree.leaves(state.params), *jax.tree.leaves(state.rest)]


def with_weights(state: TrainState, layout: StateLayout, new: Any) -> TrainState:
    """The state with every variable replaced by `new` (arrays in `weights(state)` order, as
    `model.set_weights` takes them), cast to each variable's dtype and placed in its
    sharding."""
    current = weights(state)
    if len(new) != len(current):
        raise InputError(f"set_weights() got {len(new)} arrays; the model has "
                         f"{len(current)} (see model.get_weights()).")
    for i, (a, old) in enumerate(zip(new, current, strict=True)):
        if np.shape(a) != old.shape:
            raise InputError(f"set_weights(): array {i} has shape {np.shape(a)}, the "
                             f"model's has {old.shape}.")
    n = len(jax.tree.leaves(state.params))
    params = jax.tree.unflatten(jax.tree.structure(state.params), new[:n])
    rest = jax.tree.unflatten(jax.tree.structure(state.rest), new[n:])
    params = jax.device_put(jax.tree.map(lambda a, o: np.asarray(a, o.dtype), params,
                                         state.params), layout.shardings.params)
    rest = jax.device_put(jax.tree.map(lambda a, o: np.asarray(a, o.dtype), rest,
                                       state.rest), layout.shardings.rest)
    return state.replace(params=params, rest=rest)
