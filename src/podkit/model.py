"""Model and Sequential: Keras's compile / fit / evaluate / predict / save, as a facade.

The work lives elsewhere: the network in podkit.architectures (Sequential layers, functional
graph, or any NNX module), compile()'s arguments in podkit.train.compile, the typed state in
podkit.train.state, the jitted programs in podkit.train.program (steps in train.step), the
input in podkit.train.feeds, the loops and their hooks in podkit.train.loop / hooks /
instruments / checkpointing, the checks before XLA in podkit.train.checks, the callbacks in
podkit.callbacks. A model holds its state in a StateCell that the loop updates, so callbacks
see and change it through `model.state`.

Over 500 lines for now: building (layout, program, output shapes from the architecture) and
the Keras argument checks of fit/evaluate/predict still live here (issue 19 asks for ~400).
"""


from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import numpy as np
import optax

from podkit import agree
from podkit import metrics as metrics_lib
from podkit import optimizers as optimizers_lib
from podkit._version import __version__
from podkit.architectures import (
    Architecture,
    GraphArch,
    InputSpec,
    ModuleArch,
    SequentialArch,
    param_labels,
)
from podkit.callbacks import CallbackList
from podkit.errors import ConfigError, InputError
from podkit.functional import SymbolicTensor, trace
from podkit.layers import Layer
from podkit.monitor import summary as summary_lib
from podkit.strategy import Strategy, current_strategy, scoped_strategy
from podkit.train import checkpointing as ckpt_lib
from podkit.train import checks as checks_lib
from podkit.train import compile as compile_lib
from podkit.train import feeds as feed_lib
from podkit.train import loop as loop_lib
from podkit.train import program as program_lib
from podkit.train import sparse
from podkit.train import state as state_lib
from podkit.train.hooks import Callback, History
from podkit.train.instruments import CallbackHook, HeartbeatHook, MetricsLog
from podkit.train.step import OutputSpec, StepSpec


class _OptimizerState:
    """How the model's optimizer reads and replaces the optimizer state (optimizers.StateAccess)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def get_opt_state(self) -> Any:
        return self.model.state.opt_state if self.model.built else None

    def set_opt_state(self, opt_state: Any) -> None:
        self.model.state = self.model.state.replace(opt_state=opt_state)


class Model:
    """Keras's Model.

        pk.Model(inputs, outputs)                      the functional API (pk.Input ...)
        pk.Model(lambda rngs: MyNNXModule(..., rngs=rngs))   any Flax NNX module, built
                                                       inside jit, already sharded
        pk.Model(module)                               a module you built (state is placed
                                                       into the strategy's shardings)
    """

    def __init__(self, inputs: Any = None, outputs: Any = None, *, seed: int = 0,
                 name: str | None = None) -> None:
        if isinstance(inputs, SymbolicTensor) or (
                isinstance(inputs, list | tuple | dict) and outputs is not None):
            self._arch: Architecture = GraphArch(trace(inputs, outputs))
            self._kind = "Functional"
        elif outputs is not None:
            raise ConfigError("Model(inputs, outputs) takes pk.Input tensors as inputs.")
        else:
            self._arch = ModuleArch(inputs)
            self._kind = "Module"
        self._setup(seed, name or "model")

    def _setup(self, seed: int, name: str) -> None:
        self.seed, self.name = seed, name
        self._strategy: Strategy | None = scoped_strategy()
        self._compiled: compile_lib.CompileConfig | None = None
        self._outputs: tuple[OutputSpec, ...] = ()
        self._cell = state_lib.StateCell()
        self._layout: state_lib.StateLayout | None = None
        self._program: program_lib.Program | None = None
        self._input_spec: InputSpec | None = None
        self._output_shapes: tuple[tuple[int, ...], ...] = ()
        self._outputs_checked = False
        self._frozen: tuple[bool, ...] = ()  # the layers' trainable=False, as compiled
        self._staging = feed_lib.StagingCache()
        self.trace_count: dict[str, int] = {"train": 0, "evaluate": 0, "predict": 0}
        self.stop_training = False
        self.history: History | None = None

    # -- strategy and state -------------------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            self._strategy = current_strategy()
        return self._strategy

    @property
    def state(self) -> state_lib.TrainState | None:
        """The TrainState (step, params, opt_state, rest, rng); replaceable, also by a
        callback during fit()."""
        return self._cell.value

    @state.setter
    def state(self, value: state_lib.TrainState) -> None:
        if not isinstance(value, state_lib.TrainState):
            raise ConfigError(f"model.state must be a TrainState, not {type(value).__name__}.")
        self._cell.value = value

    @property
    def layout(self) -> state_lib.StateLayout:
        """Where every leaf of the state lives: shardings and abstract values."""
        self._require_built("layout")
        return self._layout

    @property
    def built(self) -> bool:
        return self._cell.value is not None

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    @property
    def optimizer(self) -> optimizers_lib.Optimizer:
        if self._compiled is None:
            raise ConfigError("the model has no optimizer yet: call model.compile(...) first.")
        return self._compiled.optimizer

    @property
    def compiled_metrics(self) -> dict[str, metrics_lib.Metric]:
        """Every logged value by its history key ("loss", "accuracy", "out_loss", ...)."""
        if self._program is not None:
            return self._program.spec.entries()
        return {}

    @property
    def metrics_names(self) -> list[str]:
        return list(self.compiled_metrics)

    @property
    def kind(self) -> str:
        """"Sequential", "Functional" (pk.Input ... pk.Model) or "Module" (an NNX module)."""
        return self._kind

    @property
    def input_spec(self) -> InputSpec | None:
        """Names, shapes (batch excluded) and dtypes of the inputs, once built."""
        return self._input_spec

    @property
    def input_shape(self) -> Any:
        if self._input_spec is None:
            return None
        shapes = [(None, *s) for s in self._input_spec.shapes]
        return shapes[0] if len(shapes) == 1 else shapes

    @property
    def output_shape(self) -> Any:
        if not self._output_shapes:
            return None
        shapes = [(None, *s) for s in self._output_shapes]
        return shapes[0] if len(shapes) == 1 else shapes

    # -- compile ------------------------------------------------------------------------------
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, loss_weights: Any = None,
                metrics: Any = None, weighted_metrics: Any = None, run_eagerly: bool = False,
                steps_per_execution: int = 1, jit_compile: bool | str = "auto",
                jit: bool = True, learning_rate: Any = None, microbatches: int = 1,
                **unknown: Any) -> None:
        """Choose optimizer, loss and metrics, as Keras. `steps_per_execution=k` runs k steps
        per device call; `run_eagerly=True` (or `jit=False`) runs the same steps eagerly.
        `microbatches=m` (podkit's) splits each batch into m parts run one after another and
        sums their gradients before one update: the same step as the whole batch, with the
        activation memory of 1/m of it (batch statistics are then per part)."""
        config = compile_lib.resolve(optimizer, loss, loss_weights, metrics, weighted_metrics,
                                     run_eagerly, steps_per_execution, jit_compile, jit,
                                     learning_rate, microbatches, unknown)
        scope = scoped_strategy()
        if scope is not None and self.built and scope is not self._strategy:
            raise ConfigError("this model was built under another strategy; build and compile "
                              "it inside the same strategy.scope().")
        if scope is not None:
            self._strategy = scope
        opt = config.optimizer
        # Validates the names before anything changes.
        self._outputs = compile_lib.output_specs(config, self._arch.output_names(),
                                                 self._arch.output_activations(),
                                                 self._arch.logits_arg)
        previous = self._compiled.optimizer if self._compiled is not None else None
        if previous is not None and previous is not opt:
            previous.attach(None)
        self._compiled = config
        opt.attach(_OptimizerState(self))
        self._outputs_checked = False
        if self.built:  # compiled again: same variables; Keras keeps the optimizer's state
            old_state = self.state  # when it is the same optimizer object
            self._make_layout_and_program(self._create_fn())
            same = previous is opt and jax.tree.structure(old_state.opt_state) == \
                jax.tree.structure(self._layout.abstract.opt_state)
            if not same:
                self.state = state_lib.fresh_optimizer(self._layout, old_state,
                                                       self._program.spec.tx)
        # A model whose input shapes are declared builds on first need (summary, weights,
        # fit): a loaded model then reads its state without initializing one first.

    @property
    def steps_per_execution(self) -> int:
        return self._compiled.steps_per_execution if self._compiled else 1

    # -- building -----------------------------------------------------------------------------
    def _create_fn(self) -> Callable[[], nnx.Module]:
        spec, arch, seed = self._input_spec, self._arch, self.seed

        def create() -> nnx.Module:
            with nnx.use_eager_sharding(False):
                return arch.create(spec, nnx.Rngs(params=seed, dropout=seed + 1))

        return create

    def build(self, input_shape: Sequence[int] | None = None, dtype: Any = None) -> None:
        """Create the state, sharded, for inputs of `input_shape` (batch excluded; a leading
        None, as Keras writes it, is dropped). fit/evaluate/predict build from the first
        batch when this was not called."""
        if self.built:
            return
        if self._compiled is None:
            raise ConfigError("call model.compile(optimizer=..., loss=...) before building or "
                              "fitting the model.")
        sample = None
        if input_shape is not None:
            shape = tuple(input_shape)
            if shape and shape[0] is None:
                shape = shape[1:]
            if not all(isinstance(d, int) and d > 0 for d in shape):
                raise ConfigError(f"build(input_shape={input_shape!r}): positive ints, the "
                                  "batch dim excluded (or given as None).")
            if dtype is None:  # a model that starts with an Embedding takes integer ids
                first = self._arch.layer_list()[:1]
                dtype = np.int32 if first and first[0].input_kind == "int" else np.float32
            sample = np.zeros((1, *shape), dtype)
        self._build_from(sample)

    def build_for(self, spec: InputSpec,
                  initial_state: Callable[[state_lib.StateLayout], state_lib.TrainState] | None
                  = None) -> None:
        """Build for inputs described by `spec` (what a saved model records). With
        `initial_state`, the state comes from it (a checkpoint read into the layout) instead of
        a fresh initialization."""
        if self.built:
            return
        sample = [np.zeros((1, *s), d) for s, d in zip(spec.shapes, spec.dtypes, strict=True)]
        self._build_from(sample[0] if len(sample) == 1 else dict(zip(spec.names, sample,
                                                                       strict=True)),
                         initial_state)

    @classmethod
    def from_config(cls, config: dict) -> Model:
        """A new (uncompiled) model from `{"class_name", "config"}` as save() writes it."""
        from podkit.architectures import from_config

        body = config.get("config") or {}
        kind, arguments = from_config(config.get("class_name"), body)
        model_class = Sequential if kind == "Sequential" else Model
        return model_class(*arguments, name=body.get("name", "model"))

    def _transform(self, params: Any) -> optax.GradientTransformation:
        """The optimizer's transformation for `params` (a pure dict, abstract or real);
        frozen layers' parameters get no update at all (no moments either), as Keras leaves
        non-trainable weights out of the optimizer. An uncompiled model (inference only) has
        none."""
        if self._compiled is None:
            return optax.identity()
        tx = self._compiled.optimizer.transform()
        layers = self._arch.layer_list()
        if any(not layer.trainable for layer in layers):
            tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                                       param_labels(params, layers))
        return tx

    def _build_from(self, x_sample: Any,
                    initial_state: Callable[[state_lib.StateLayout], state_lib.TrainState]
                    | None = None) -> None:
        self._input_spec = self._arch.input_spec(x_sample)
        create = self._create_fn()
        self._make_layout_and_program(create)
        if initial_state is not None:
            self.state = initial_state(self._layout)
        elif self._arch.built_module is not None:
            self.state = state_lib.place_module(self._layout, self._arch.built_module,
                                                self._program.spec.tx)
        else:
            self.state = state_lib.init_state(self._layout, create, self._program.spec.tx)

    def _make_layout_and_program(self, create: Callable[[], nnx.Module]) -> None:
        abstract = self._arch.built_module or nnx.eval_shape(create)
        strategy = self.strategy
        tx = self._transform(nnx.to_pure_dict(state_lib.split(abstract)[1]))
        self._frozen = tuple(not layer.trainable for layer in self._arch.layer_list())
        self._layout = state_lib.make_layout(abstract, tx, strategy.rules, strategy.mesh,
                                             required=strategy.user_rules)
        if not self._outputs:  # inference before compile(): outputs without losses
            self._outputs = tuple(OutputSpec(name=n, loss=None)
                                  for n in self._arch.output_names())
        spec = StepSpec(graphdef=self._layout.graphdef, outputs=self._outputs,
                        output_names=self._arch.output_names(), tx=tx,
                        batch_sharding=strategy.batch_sharding(),
                        logits_arg=self._arch.logits_arg,
                        microbatches=self._compiled.microbatches if self._compiled else 1,
                        tables=sparse.table_layouts(abstract, self._layout.shardings.params))
        program = program_lib.build(
            spec, self._layout, strategy, counts=self.trace_count,
            jit=self._compiled.jit if self._compiled is not None else True)
        self._output_shapes = program.output_shapes(self._layout.abstract,
                                                    self._input_spec.example())
        if len(self._output_shapes) != len(self._outputs):
            raise ConfigError(f"the model gives {len(self._output_shapes)} outputs but compile() "
                              f"described {len(self._outputs)}.")
        self._program = program

    # -- the checks before XLA ----------------------------------------------------------------
    def _data_check(self) -> checks_lib.DataCheck:
        return checks_lib.DataCheck(checks_lib.ModelIO(
            self._input_spec.names, self._input_spec.shapes, self._outputs,
            self._arch.output_names(), self._output_shapes))

    def _prepare(self, feed: feed_lib.Feed, with_labels: bool) -> None:
        """Build from the feed's first rows, then check the data against the model. Every
        process checks its own data and all agree on the outcome, so one process's error is
        every process's error (none is left waiting in a collective)."""
        if self._compiled is None and with_labels:
            raise ConfigError("call model.compile(optimizer=..., loss=...) first.")
        frozen = tuple(not layer.trainable for layer in self._arch.layer_list())
        if self.built and frozen != self._frozen:
            changed = [layer.name for layer, f, g in zip(self._arch.layer_list(), frozen,
                                                         self._frozen, strict=True) if f != g]
            raise ConfigError(f"trainable changed on layers {changed} since compile(); call "
                              "model.compile(...) again to apply it (as Keras).")
        x, y = feed.first()
        if not self.built:
            self._build_from(x)
        check = self._data_check()
        agree.raise_everywhere_if_any(
            lambda: feed.check(lambda xs, ys: check(xs, ys if with_labels else None)),
            "its data do not fit the model")
        if with_labels and not self._outputs_checked:
            agree.raise_everywhere_if_any(
                lambda: self._check_probabilities(x),
                "the model's outputs are not probabilities for its probability loss")

    def _check_probabilities(self, x: Any) -> None:
        self._outputs_checked = True
        checks_lib.check_probabilities(self._program.spec, self.state, x,
                                       self.strategy.replicated())

    # -- fit / evaluate / predict -------------------------------------------------------------
    def _feed(self, x: Any, y: Any, *, training: bool, with_labels: bool, role: str,
              **kwargs: Any) -> feed_lib.Feed:
        if x is not None and not isinstance(x, str):
            x = self._arch.normalize_x(x)
        feed = feed_lib.make_feed(
            x, y, strategy=self.strategy, training=training, with_labels=with_labels,
            steps_per_execution=self.steps_per_execution, cache=self._staging, role=role,
            **kwargs)
        self._prepare(feed, with_labels)
        return feed

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: int | str = "auto", callbacks: Sequence[Callback] | None = None,
            validation_split: float = 0.0, validation_data: Any = None, shuffle: bool = True,
            class_weight: Mapping[int, float] | None = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: int | None = None,
            validation_steps: int | None = None, validation_batch_size: int | None = None,
            validation_freq: int = 1, remainder: str | None = None,
            log_every: int | None = None, seed: int | None = None,
            run_dir: Any = None, checkpoint: Any = None, resume: Any = None,
            on_nan: str | None = None) -> History:
        """Train for `epochs`; returns a History whose `.history` has per-epoch values.

        verbose: 0 silent, 1 or "auto" a progress bar (one line per epoch when stdout is not
        a terminal), 2 one line per epoch. `run_dir=PATH` writes run.json, metrics.jsonl and
        final.json there (see podkit.monitor.run_dir).

        checkpoint: a directory (path, s3://, gs://) or a pk.checkpoint.CheckpointManager:
        training resumes from its newest valid checkpoint and saves there (every epoch unless
        the manager has a schedule, at the end, and on SIGTERM). resume: a checkpoint to start
        from when `checkpoint` has none. on_nan: None (as Keras), "stop" (an error naming the
        step) or "rollback" (to the last checkpoint, skipping the offending batches).
        """
        verbose = _verbosity(verbose)
        for what, v, least in (("epochs", epochs, 1), ("initial_epoch", initial_epoch, 0),
                               ("validation_freq", validation_freq, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ConfigError(f"{what}={v!r} must be an int >= {least}.")
        if initial_epoch >= epochs:
            raise ConfigError(f"initial_epoch={initial_epoch} leaves no epoch to run of "
                              f"epochs={epochs}; epochs is the index to stop at, as Keras.")
        if not isinstance(validation_split, int | float) or not 0.0 <= validation_split < 1.0:
            raise ConfigError(f"validation_split={validation_split!r} must be in [0, 1).")
        if validation_split:
            if validation_data is not None:
                raise ConfigError("pass validation_split or validation_data, not both.")
            x, y, sample_weight, validation_data = _split(x, y, sample_weight,
                                                          validation_split)
        feed = self._feed(x, y, training=True, with_labels=True, role="train",
                          batch_size=batch_size, sample_weight=sample_weight,
                          class_weight=class_weight, shuffle=shuffle,
                          seed=self.seed if seed is None else seed,
                          steps_per_epoch=steps_per_epoch, remainder=remainder)
        validate = None
        if validation_data is not None:  # built and checked now, before the first step
            val_feed = self._validation_feed(validation_data, validation_batch_size or
                                             batch_size, validation_steps, remainder)

            def validate(state: state_lib.TrainState, epoch: int) -> dict:
                if (epoch + 1) % validation_freq:  # Keras's validation_freq
                    return {}
                return loop_lib.eval_loop(self._program, state, val_feed,
                                          [HeartbeatHook("evaluation")])
        if not isinstance(callbacks, list | tuple | type(None)):
            raise ConfigError(f"callbacks={callbacks!r} must be a list of pk.callbacks objects.")
        cbs: list[Callback] = list(callbacks or [])
        if run_dir is not None:
            from podkit.monitor.run_dir import RunDirectory

            cbs.append(RunDirectory(run_dir, self._run_record(
                epochs=epochs, batch_size=batch_size, steps_per_epoch=feed.steps_per_epoch,
                log_every=log_every)))
        callback_list = CallbackList(cbs, add_history=True, add_progbar=bool(verbose),
                                     model=self)
        history = callback_list.history
        ckpt = self._checkpointing(checkpoint, resume, on_nan, callback_list, history, run_dir,
                                   epochs=epochs, batch_size=batch_size)
        keys = [*self.compiled_metrics, "input_wait"]
        keys += [k for cb in callback_list for k in cb.adds_logs if k not in keys]
        if validate is not None:
            keys += [f"val_{k}" for k in self.compiled_metrics]
        callback_list.set_params({"verbose": verbose, "epochs": epochs,
                                  "steps": feed.steps_per_epoch, "metrics": keys})
        self.stop_training = False
        hooks = [HeartbeatHook("training"), ckpt, MetricsLog(callback_list.on_log, log_every),
                 CallbackHook(callback_list)]
        self.state = loop_lib.fit_loop(
            self._program, self.state, feed, hooks, epochs=epochs, initial_epoch=initial_epoch,
            cell=self._cell, validate=validate, abstract=self.layout.abstract)
        self.history = history
        return history

    def _checkpointing(self, checkpoint: Any, resume: Any, on_nan: str | None,
                       callbacks: CallbackList, history: History, run_dir: Any,
                       **fit_args: Any) -> ckpt_lib.Checkpointing | None:
        from podkit.monitor.run_dir import RunDir

        meta = {"fit": fit_args, "processes": jax.process_count(),
                "devices": jax.device_count(), "model": self.name,
                "config": run_dir.config_toml if isinstance(run_dir, RunDir) else None}
        return ckpt_lib.for_fit(checkpoint, resume, on_nan, callbacks, history, meta)

    def _validation_feed(self, data: Any, batch_size: int | None, steps: int | None,
                         remainder: str | None) -> feed_lib.Feed:
        try:
            if isinstance(data, tuple):  # (x, y) or (x, y, sample_weight), as Keras
                if len(data) not in (2, 3):
                    raise InputError(f"it is a tuple of {len(data)}; pass (x, y), "
                                     "(x, y, sample_weight), or a Dataset.")
                return self._feed(data[0], data[1], training=False, with_labels=True,
                                  role="validation", batch_size=batch_size,
                                  sample_weight=data[2] if len(data) == 3 else None,
                                  shuffle=False, steps_per_epoch=steps, remainder=remainder)
            return self._feed(data, None, training=False, with_labels=True,
                              role="validation", steps_per_epoch=steps)
        except InputError as e:
            raise InputError(f"validation_data: {e}") from None

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                 verbose: int | str = "auto", sample_weight: Any = None,
                 steps: int | None = None, callbacks: Sequence[Callback] | None = None,
                 return_dict: bool = False, remainder: str | None = None) -> Any:
        """Loss and metrics over the data, as Keras 3 returns them: the loss alone without
        metrics, `[loss, *metrics]` with them, a dict with `return_dict=True`."""
        verbose = _verbosity(verbose)
        start = time.perf_counter()
        feed = self._feed(x, y, training=False, with_labels=True, role="evaluate",
                          batch_size=batch_size, sample_weight=sample_weight, shuffle=False,
                          steps_per_epoch=steps, remainder=remainder)
        cbs = CallbackList(callbacks, model=self, verbose=verbose, steps=feed.steps_per_epoch)
        results = loop_lib.eval_loop(self._program, self.state, feed,
                                     [HeartbeatHook("evaluation"), CallbackHook(cbs)])
        if verbose:
            from podkit.monitor.progress import summary_line

            print(summary_line("evaluate", time.perf_counter() - start, results), flush=True)
        if return_dict:
            return results
        values = list(results.values())
        return values[0] if len(values) == 1 else values

    def predict(self, x: Any, batch_size: int | None = None, verbose: int | str = "auto",
                steps: int | None = None, callbacks: Sequence[Callback] | None = None,
                remainder: str | None = "pad") -> Any:
        """The model's outputs for every example of x: one numpy array, or a list of them
        for a model with several outputs."""
        verbose = _verbosity(verbose)
        start = time.perf_counter()
        feed = self._feed(x, None, training=False, with_labels=False, role="predict",
                          batch_size=batch_size, shuffle=False, steps_per_epoch=steps,
                          remainder=remainder)
        cbs = CallbackList(callbacks, model=self, verbose=verbose, steps=feed.steps_per_epoch)
        outs = loop_lib.predict_loop(self._program, self.state, feed,
                                     [HeartbeatHook("prediction"), CallbackHook(cbs)])
        if verbose:
            from podkit.monitor.progress import summary_line

            print(summary_line("predict", time.perf_counter() - start,
                               {"examples": len(outs[0])}), flush=True)
        return outs[0] if len(outs) == 1 else list(outs)

    def __call__(self, x: Any, training: bool = False) -> Any:
        """`model(x)`: the outputs for x as numpy arrays (Keras returns tensors; here
        `np.asarray(...)` is already what `.numpy()` gives). Inference only."""
        if training:
            raise ConfigError("model(x, training=True) is not supported: podkit trains through "
                              "fit() (one compiled step); call model(x) for outputs.")
        n = len(jax.tree.leaves(feed_lib.as_arrays(x, "x"))[0]) if x is not None else 0
        dp = self.strategy.data_parallel_size
        # Batch sizes from a few buckets (powers of two): calls on many sizes compile few steps.
        bucket = 1 << max(n - 1, 0).bit_length()
        return self.predict(x, batch_size=-(-min(max(bucket, dp), 1024) // dp) * dp, verbose=0)

    def _run_record(self, **fit_args: Any) -> dict:
        record: dict[str, Any] = {
            "podkit": __version__, "jax": jax.__version__, "model": self.name,
            "kind": self._kind, "fit": fit_args, "strategy": repr(self.strategy),
            "devices": len(self.strategy.mesh.devices.flat), "processes": jax.process_count(),
        }
        for key, make in (("architecture", self._arch.config), ("compile", self.compile_config)):
            try:
                record[key] = make()
            except ConfigError as e:
                record[key] = f"not serializable: {e}"
        return record

    # -- weights ------------------------------------------------------------------------------
    def _declared_input(self) -> bool:
        return isinstance(self._arch, GraphArch) or (
            isinstance(self._arch, SequentialArch) and self._arch.declared_shape() is not None)

    def _require_built(self, what: str) -> None:
        """Build now if the input shapes are declared (functional models, Sequential with an
        input shape); otherwise say how to build."""
        if not self.built and self._declared_input():
            self._build_from(None)
        if not self.built:
            raise ConfigError(
                f"{what} needs a built model: call model.build(input_shape) after compile(), "
                "or fit the model once.")

    def module(self) -> nnx.Module:
        """The network as a Flax NNX module holding the current weights (a new module each
        call, sharing the state's arrays): for code that runs the network itself, e.g.
        sampling from a language model."""
        self._require_built("module()")
        s = self.state
        return state_lib.merge(self.layout.graphdef, s.params, s.rest, s.rng)

    def sharding_table(self) -> list[dict]:
        """Where every parameter and optimizer-state leaf lives: path, shape, dtype, spec and
        bytes per device (see podkit.train.state.describe_layout); `fit(run_dir=...)` writes
        it as shardings.json."""
        self._require_built("sharding_table()")
        return state_lib.describe_layout(self.layout)

    def count_params(self) -> int:
        self._require_built("count_params()")
        return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(self.state.params))

    @property
    def weights(self) -> list[jax.Array]:
        """Every variable: the parameters, then the other variables (batch statistics)."""
        self._require_built("weights")
        return state_lib.weights(self.state)

    def _param_labels(self) -> list[str]:
        return jax.tree.leaves(param_labels(self.state.params, self._arch.layer_list()))

    @property
    def trainable_weights(self) -> list[jax.Array]:
        """The parameters the optimizer updates (those of layers with trainable=True)."""
        self._require_built("trainable_weights")
        return [w for w, label in zip(jax.tree.leaves(self.state.params), self._param_labels(),
                                      strict=True) if label == "train"]

    @property
    def non_trainable_weights(self) -> list[jax.Array]:
        """Frozen layers' parameters, then the other variables (batch statistics)."""
        self._require_built("non_trainable_weights")
        frozen = [w for w, label in zip(jax.tree.leaves(self.state.params),
                                        self._param_labels(), strict=True) if label != "train"]
        return [*frozen, *jax.tree.leaves(self.state.rest)]

    @property
    def trainable(self) -> bool:
        return all(layer.trainable for layer in self._arch.layer_list())

    @trainable.setter
    def trainable(self, value: bool) -> None:
        """Freeze (or unfreeze) every layer, as Keras's `model.trainable = False`; compile
        again to apply it."""
        layers = self._arch.layer_list()
        if not layers:
            raise ConfigError("model.trainable applies to models of podkit layers; an NNX "
                              "module's parameters are all trained.")
        for layer in layers:
            layer.trainable = bool(value)

    def get_weights(self) -> list[np.ndarray]:
        """Every variable as numpy arrays (gathered to this host), in `weights` order."""
        return [agree.gather(a) for a in self.weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set every variable from arrays in `get_weights()` order (shapes must match)."""
        self._require_built("set_weights()")
        self.state = state_lib.with_weights(self.state, self._layout, weights)

    # -- saving -------------------------------------------------------------------------------
    def get_config(self) -> dict:
        """The architecture as JSON (Sequential and functional models)."""
        config = self._arch.config()
        if config is None:
            raise ConfigError("this model is built from Python code (an NNX module or "
                              "factory): its architecture has no config; build it from code "
                              "and load weights into it.")
        return {"name": self.name, **config}

    def compile_config(self) -> dict | None:
        return None if self._compiled is None else compile_lib.serialize(self._compiled,
                                                                          self._outputs)

    def save(self, path: Any) -> None:
        """A directory: model.json (architecture, compile config) and the state (Orbax)."""
        from podkit import saving

        saving.save_model(self, path)

    def save_weights(self, path: Any) -> None:
        from podkit import saving

        saving.save_weights(self, path)

    def load_weights(self, path: Any) -> None:
        from podkit import saving

        saving.load_weights(self, path)

    # -- inspection ---------------------------------------------------------------------------
    def summary(self, print_fn: Callable[[str], None] = print) -> str:
        self._require_built("summary()")
        text = summary_lib.summary(self.name, self.state.params,
                                   self._arch.summary_rows(self._input_spec, self.state.params),
                                   self.count_params(), self.strategy)
        print_fn(text)
        return text


class Sequential(Model):
    """`Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")])`.

    The input shape comes from the first batch, or up front from `input_shape=`, a
    `pk.Input(shape)` as the first entry, or `input_shape=` on the first layer (as Keras)."""

    def __init__(self, layers: Sequence[Layer] | None = None,
                 input_shape: Sequence[int] | None = None, seed: int = 0,
                 name: str = "sequential") -> None:
        layers = list(layers or [])
        if layers and isinstance(layers[0], SymbolicTensor):
            if input_shape is not None:
                raise ConfigError("pass input_shape= or a pk.Input first, not both.")
            input_shape, layers = layers[0].shape[1:], layers[1:]
        for layer in layers:
            _check_layer(layer)
        self._arch = SequentialArch(layers, input_shape)
        self._kind = "Sequential"
        self._setup(seed, name)

    @property
    def layers(self) -> list[Layer]:
        return self._arch.layers

    def add(self, layer: Layer) -> None:
        if self.built:
            raise ConfigError("cannot add layers to a built model; add them before fitting.")
        if isinstance(layer, SymbolicTensor) and not self._arch.layers:
            self._arch.input_shape = layer.shape[1:]  # model.add(pk.Input(shape)), as Keras
            return
        _check_layer(layer)
        self._arch.layers.append(layer)


def _check_layer(layer: Any) -> None:
    if not isinstance(layer, Layer):
        hint = ("a pk.Input goes first only" if isinstance(layer, SymbolicTensor) else
                "a model is not a layer: build one functional model instead"
                if isinstance(layer, Model) else
                "wrap other Flax NNX modules with pk.Model(module)")
        raise ConfigError(f"Sequential got {layer!r}; it takes podkit layers (pk.layers.Dense, "
                          f"...); {hint}.")


# -- helpers --------------------------------------------------------------------------------------
def _split(x: Any, y: Any, w: Any, fraction: float) -> tuple[Any, Any, Any, tuple]:
    """Keras's validation_split: the last `fraction` of the arrays, before any shuffling."""
    x, y = feed_lib.as_arrays(x, "x"), feed_lib.as_arrays(y, "y")
    if not feed_lib.is_arrays(x):
        raise InputError("validation_split works with arrays only; pass validation_data.")
    n = len(jax.tree.leaves(x)[0])
    cut = int(math.ceil(n * (1.0 - fraction)))  # Keras's split point
    head = lambda t: jax.tree.map(lambda a: np.asarray(a)[:cut], t)
    tail = lambda t: jax.tree.map(lambda a: np.asarray(a)[cut:], t)
    val = (tail(x), tail(y)) if w is None else (tail(x), tail(y), tail(w))
    return head(x), head(y), None if w is None else head(w), val


def _verbosity(verbose: Any) -> int:
    """Keras's verbose values: 0, 1, 2 or "auto" (= 1); anything else is refused."""
    if verbose == "auto":
        return 1
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise ConfigError(f"verbose={verbose!r}; pass 0 (silent), 1 (progress bar), 2 (one "
                          "line per epoch) or 'auto'.")
    return int(verbose)
