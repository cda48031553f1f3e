"""The compiled programs of one model: train, evaluate and predict, jitted once per input spec.

    program = build(spec, layout, strategy, jit=True, tracker=recompiles)
    state, sums = program.train(state, sums, inputs)     # k steps per call, state donated
    logs = program.results(sums)                         # device sums -> host values
    (sums are packed, one vector per dtype: podkit.train.sums; `host_sums` gives the tree)
    cost = program.train_cost(state, sums, inputs)       # FLOPs and memory of that program

The loops drive a Program and never see the model; the model holds one and rebuilds it when
compiled again. The `tracker` (podkit.train.recompiles, the model's) counts traces
(compilations) per kind and explains every one after the first: each new input spec is one,
which is how tests see that a learning-rate change or a second fit() compiles nothing.

Every step is traced inside its strategy's `scope()`: kernels that run per device
(podkit.kernels, inside `shard_map`) read the mesh they run over from it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from podkit import hardware
from podkit.errors import ConfigError, DeviceMemoryError
from podkit.strategy import Strategy
from podkit.train import flops as flops_lib
from podkit.train import step as step_lib
from podkit.train.feeds.inputs import BatchInputs
from podkit.train.recompiles import Recompiles
from podkit.train.state import StateLayout
from podkit.train.sums import SumsLayout

KINDS = ("train", "evaluate", "predict")


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one compiled train program costs: FLOPs per execution (podkit.train.flops, loop
    bodies times their trip counts) and XLA's memory analysis per device."""

    flops: float  # one execution's, all devices together
    steps: int  # optimizer steps per execution
    notes: tuple[str, ...] = ()  # what the FLOP count could not see
    argument_bytes: int = 0  # per device: state, sums, inputs
    output_bytes: int = 0
    alias_bytes: int = 0  # outputs written over donated arguments
    temp_bytes: int = 0  # temporaries (activations, gradients in flight)
    code_bytes: int = 0
    conv_flops: float = 0.0  # the convolutions' share of `flops` (podkit.sim's op classes)

    @property
    def flops_per_step(self) -> float:
        return self.flops / max(self.steps, 1)

    @property
    def conv_flops_per_step(self) -> float:
        return self.conv_flops / max(self.steps, 1)

    @property
    def peak_bytes(self) -> int:
        """Per device, while the program runs: arguments, outputs not written over donated
        arguments, temporaries and the program."""
        return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
                + self.code_bytes)


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
    # StepCost by input signature (and forward FLOPs by batch): a second fit() of the same
    # shapes finds it (no re-count).
    costs: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # Several XLA:CPU devices: the loops finish each step before dispatching anything else
    # (see InputsFirst).
    serial: bool = False

    def zeros(self) -> Any:
        """Metric sums at zero, packed (podkit.train.sums), placed where the steps keep them."""
        return self._zero_sums

    @functools.cached_property
    def _zero_sums(self) -> Any:
        # Placed once: every epoch starts from them, and placing them anew sat between an
        # epoch's last execution and the next one's dispatch, where the devices wait on the
        # host. No program donates its sums, so one copy serves all.
        # numpy, as the metrics' zeros: placed by device_put on every process (a jax array
        # made on one local device first would not be a valid multi-process replicated array).
        return jax.device_put(self.sums_layout.pack(step_lib.zero_tree(self.spec), np),
                              self.sums_sharding)

    @functools.cached_property
    def sums_layout(self) -> SumsLayout:
        return step_lib.sums_layout(self.spec)

    def host_sums(self, sums: Any) -> dict:
        """The sums' tree ({"loss": {"total", "count"}, ...}) on the host, from packed device
        sums (one fetch)."""
        return self.sums_layout.unpack(jax.device_get(sums))

    def results(self, sums: Any) -> dict[str, float]:
        """Loss and metric values ("loss", "accuracy", ...) from packed device sums."""
        return step_lib.results(self.spec, self.host_sums(sums))

    def tree_results(self, tree: dict) -> dict[str, float]:
        """The same values from the sums' tree on the host (a window's: a difference of two
        `host_sums`)."""
        return step_lib.results(self.spec, tree)

    def sums_tree(self, sums: Any) -> dict:
        """Packed device sums as their tree of device arrays, the layout checkpoints keep
        (dispatched, not waited for: a save need not wait for the execution in flight)."""
        return self._unpack(sums)

    def packed_sums(self, tree: Any) -> Any:
        """A tree of device sums (read from a checkpoint) packed as the steps take them."""
        return self._pack(tree)

    def sums_abstract(self) -> dict:
        """The sums' tree as ShapeDtypeStructs where they live: what a checkpoint restores."""
        return jax.tree.map(lambda z: jax.ShapeDtypeStruct(np.shape(z), np.result_type(z),
                                                           sharding=self.sums_sharding),
                            step_lib.zero_tree(self.spec))

    @functools.cached_property
    def _unpack(self) -> Callable:
        return jax.jit(self.sums_layout.unpack, out_shardings=self.sums_sharding)

    @functools.cached_property
    def _pack(self) -> Callable:
        return jax.jit(self.sums_layout.pack, out_shardings=self.sums_sharding)

    def train_cost(self, state: Any, sums: Any, inputs: Any, check: bool = True
                   ) -> StepCost | None:
        """Compile `train` for this state (real, or its ShapeDtypeStructs with shardings: then
        before the state exists), sums and inputs, and say what the program costs. JAX keeps
        the executable: the `train` call that follows runs it (no second trace or compile),
        and a program already compiled for these arguments is found, not compiled again.
        None for eager programs (nothing compiles). A program that cannot fit in the devices'
        memory is a DeviceMemoryError here, before anything runs."""
        key = (jax.tree.structure(state), *((a.shape, a.dtype) for a in jax.tree.leaves(
            (state, inputs))))
        cost = self.costs.get(key)
        if cost is None:
            stages = self.compile_train(state, sums, inputs)
            if stages is None:
                return None
            cost = self.costs[key] = cost_of(stages, inputs.steps)
        if check:
            self.check_fits(cost, inputs)
        return cost

    def check_fits(self, cost: StepCost, inputs: Any) -> None:
        """A DeviceMemoryError when the compiled step needs more memory per device than a
        device of the mesh holds (podkit.hardware.memory_capacity; nothing to check where
        the capacity is unknown, as on CPU unless PODKIT_DEVICE_MEMORY declares one)."""
        device = self.strategy.mesh.devices.flat[0]
        capacity = hardware.memory_capacity(device)
        if capacity is None or cost.peak_bytes <= capacity:
            return
        gib = hardware.format_bytes
        declared = hardware.declared_memory() is not None
        holds = (f"a device holds {gib(capacity)} (declared by {hardware.ENV_DEVICE_MEMORY})"
                 if declared else f"a {device.device_kind} device holds {gib(capacity)}")
        raise DeviceMemoryError(
            f"the train step does not fit in device memory: it needs {gib(cost.peak_bytes)} "
            f"per device (state, sums and inputs {gib(cost.argument_bytes)}, temporaries "
            f"{gib(cost.temp_bytes)}, new outputs {gib(cost.output_bytes - cost.alias_bytes)}, "
            f"program {gib(cost.code_bytes)}) and {holds}. "
            f"{memory_options(self.batch_advice(inputs))} Nothing ran.")

    def compile_train(self, state: Any, sums: Any, inputs: Any) -> tuple[Any, Any, Any] | None:
        """(traced, lowered, compiled) stages of `train` for these arguments (found in JAX's
        caches when compiled before); None for eager programs. XLA's out-of-memory while
        compiling is a DeviceMemoryError."""
        trace = getattr(self.train, "trace", None)
        if trace is None:
            return None
        traced = trace(state, sums, inputs)
        lowered = traced.lower()
        try:
            compiled = lowered.compile()
        except Exception as e:  # XLA's out-of-memory is a plain runtime error
            if "RESOURCE_EXHAUSTED" in str(e) or "Ran out of memory" in str(e):
                raise DeviceMemoryError(out_of_memory_message(str(e), self.batch_advice(
                    inputs))) from e
            raise
        return traced, lowered, compiled

    def batch_advice(self, inputs: Any) -> str:
        """The per-device batch of these inputs, for memory advice."""
        rows = getattr(inputs, "mask", None)  # BatchInputs; StagedInputs have row ids
        rows = rows if rows is not None else getattr(inputs, "idx", None)
        per = None if rows is None else rows.shape[1] // max(self.strategy.data_parallel_size, 1)
        return f"now {per} examples per device" if per else "smaller"

    def output_shapes(self, abstract_state: Any, example: Any) -> tuple[tuple[int, ...], ...]:
        """The shape of each output for one example (batch dims excluded), traced abstractly:
        nothing is compiled or run."""
        with self.strategy.scope():
            out = jax.eval_shape(lambda s, x: step_lib.make_predict_step(self.spec)(
                s, BatchInputs(jax.tree.map(lambda a: a[None], x), jnp.zeros((1, 1)),
                               jnp.ones((1, 1)), jnp.ones((1, 1))))[0],
                abstract_state, example)
        return tuple(tuple(o.shape[2:]) for o in out)

    def forward_flops(self, abstract_state: Any, example: Any, batch: int) -> float:
        """The FLOPs of the model's forward over a global batch of `batch` examples like
        `example` (a batch of one), counted on its traced jaxpr (podkit.train.flops):
        nothing is compiled or run."""
        key = ("forward", batch, *((a.shape, a.dtype) for a in jax.tree.leaves(
            (abstract_state, example))))
        if key not in self.costs:  # traced once: fit() asks at every call
            inputs = BatchInputs(jax.tree.map(lambda a: jax.ShapeDtypeStruct(
                (1, batch, *a.shape[1:]), a.dtype), example), jnp.zeros((1, batch)),
                jnp.ones((1, batch)), jnp.ones((1, batch)))
            with self.strategy.scope():
                jaxpr = jax.make_jaxpr(step_lib.make_predict_step(self.spec))(
                    abstract_state, inputs)
            self.costs[key] = flops_lib.count(jaxpr)[0]
        return self.costs[key]


def build(spec: step_lib.StepSpec, layout: StateLayout, strategy: Strategy, *, jit: bool,
          tracker: Recompiles) -> Program:
    """Jit the three steps of `spec` for a state laid out as `layout` (train donates the
    state and keeps it in the layout's shardings; the sums are replicated). `jit=False` runs
    the same steps eagerly (Keras's run_eagerly). Every trace is told to `tracker`."""
    unroll = not jit
    program = next(_program_ids)  # for the tracker: a new program's first traces are new
    make = lambda kind, fn: _counting(tracker, program, kind, fn, strategy)
    train = make("train", step_lib.make_train_step(spec, unroll))
    evaluate = make("evaluate", step_lib.make_eval_step(spec, unroll))
    predict = make("predict", step_lib.make_predict_step(spec, unroll))
    sums = strategy.replicated()
    if jit:
        train = jax.jit(train, donate_argnums=(0,), out_shardings=(layout.shardings, sums))
        evaluate = jax.jit(evaluate, out_shardings=sums)
        predict = jax.jit(predict)
        if _cpu_collectives(strategy):
            train, evaluate, predict = (InputsFirst(f) for f in (train, evaluate, predict))
    else:
        train, evaluate, predict = (_eager(f) for f in (train, evaluate, predict))
    return Program(spec, train, evaluate, predict, sums, strategy,
                   serial=jit and _cpu_collectives(strategy))


_program_ids = itertools.count()


def _cpu_collectives(strategy: Strategy) -> bool:
    """Whether the steps run on several XLA:CPU devices of this process (their collectives
    rendezvous inside the process; see InputsFirst)."""
    devices = list(strategy.mesh.devices.flat)
    local = [d for d in devices if d.process_index == jax.process_index()]
    return len(local) > 1 and all(d.platform == "cpu" for d in devices)


class InputsFirst:
    """A jitted step that XLA:CPU dispatches only once its inputs are computed.

    XLA:CPU runs each device's share of a program as a task on one shared thread pool, and a
    task dispatched before its inputs exist holds a pool thread while it waits for them. With
    several devices in the process, anything dispatched while a step runs that reads the
    step's outputs (the next step, which podkit keeps in flight, or a small op on its sums)
    could hold the threads the running step's collectives needed for their last
    participants: the rendezvous never completed, and after XLA's termination timeout it
    aborted the process (seen in CI in test_sharding; reproduced under load about once in a
    dozen runs; gdb: 7 tasks in an all-gather, 2 pool threads held by tasks waiting for
    inputs). So on multi-device CPU (`Program.serial`) a step waits for its inputs (a state
    still initializing on its thread), and the loops wait for each step before anything else
    is dispatched. It costs the overlap of the host with the devices on multi-device CPU
    only; accelerators queue programs per device and never wait this way. Everything else
    (`trace`, `lower`, ...) is the jitted function's."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        jax.block_until_ready([a for a in jax.tree.leaves(args) if isinstance(a, jax.Array)])
        return self.fn(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)


def cost_of(stages: tuple[Any, Any, Any], steps: int) -> StepCost:
    """The StepCost of a compiled train program from its (traced, lowered, compiled) stages:
    FLOPs counted on the jaxpr, memory from XLA's analysis."""
    traced, _, compiled = stages
    by_class, notes = flops_lib.count_by_class(traced.jaxpr)
    memory = compiled.memory_analysis()
    get = lambda name: int(getattr(memory, name, 0) or 0)
    return StepCost(by_class.total, int(steps), tuple(notes),
                    get("argument_size_in_bytes"), get("output_size_in_bytes"),
                    get("alias_size_in_bytes"), get("temp_size_in_bytes"),
                    get("generated_code_size_in_bytes"), by_class.conv)


def memory_options(batch: str) -> str:
    """What makes a step fit, for either way of finding out it does not."""
    return ("Options: shard the parameters and optimizer state over the devices (strategy "
            "FSDP), recompute activations in the backward pass (remat=\"minimal\" or \"full\" "
            f"for podkit's models), or a smaller per-device batch ({batch}; "
            "compile(microbatches=m) keeps the global batch).")


def _counting(tracker: Recompiles, program: int, kind: str, fn: Callable, strategy: Strategy
              ) -> Callable:
    """Tells the tracker of every trace (compilation): each new input spec or changed
    argument is one. The trace runs in the strategy's scope (see the module docstring)."""
    def traced(*args: Any) -> Any:
        tracker.traced(program, kind, args)
        with strategy.scope():
            try:
                return fn(*args)
            except (jax.errors.TracerArrayConversionError,
                    jax.errors.ConcretizationTypeError,
                    jax.errors.TracerBoolConversionError,
                    jax.errors.TracerIntegerConversionError) as e:
                raise ConfigError(
                    f"code inside the compiled {kind} step (a loss, a metric, a Lambda or a "
                    "model's call()) turned a traced array into a NumPy array or a Python "
                    f"value ({type(e).__name__}): the step is compiled once for all batches, "
                    "so its values are not known while it is built. Use jax.numpy (jnp.mean, "
                    "jnp.where, ...) instead of numpy, and jnp.where or lax.cond instead of "
                    "`if` on a value; Keras 3 asks the same of keras.ops.") from e
    return traced


def out_of_memory_message(xla: str, batch: str) -> str:
    """XLA's out-of-memory compile error as podkit's: the numbers and the options."""
    import re

    # XLA's spellings: "Used 16.53G of 15.75G hbm" and "the total memory required for HLO
    # temporaries (35.21G) exceeds available HBM (15.75G)".
    used = (re.search(r"[Uu]sed ([\d.]+)([KMGT]) of ([\d.]+)([KMGT])", xla)
            or re.search(r"required for ([\w ]+?) \(([\d.]+)([KMGT])\) exceeds available "
                         r"\w+ \(([\d.]+)([KMGT])\)", xla))
    if used is None:
        numbers = "XLA ran out of device memory compiling it"
    elif len(used.groups()) == 4:
        numbers = (f"it needs {used.group(1)} {used.group(2)}iB per device and a device holds "
                   f"{used.group(3)} {used.group(4)}iB")
    else:
        numbers = (f"its {used.group(1)} alone need {used.group(2)} {used.group(3)}iB per "
                   f"device and a device holds {used.group(4)} {used.group(5)}iB")
    first = xla.strip().splitlines()[0][:300] if xla.strip() else ""
    return (f"the train step does not fit in device memory: {numbers}. "
            f"{memory_options(batch)} XLA said: {first}")


def _eager(fn: Callable) -> Callable:
    def run(*args: Any) -> Any:
        with jax.disable_jit():
            return fn(*args)

    return run
