"""Trainer: Keras's compile / fit / evaluate / predict, the half of Model that trains (as
keras.src.trainers.trainer.Trainer is a base of keras.Model).

Each method checks its Keras arguments, builds the input (podkit.train.feeds), checks the data
against the model before XLA sees it (podkit.train.checks, agreed over processes), and hands
the compiled programs (podkit.train.program) and the hooks (podkit.train.instruments,
podkit.train.checkpointing, the callbacks) to a loop (podkit.train.loop). It uses the model's
state, architecture and building (podkit.model.Model, its only subclass) through `self`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from podkit import agree, hardware, lifetime
from podkit._version import __version__
from podkit.callbacks import CallbackList
from podkit.errors import ConfigError, InputError, user_stacklevel
from podkit.layers.symbolic import SymbolicTensor, active_scope
from podkit.monitor.profile import ProfileSteps, parse_profile_steps
from podkit.monitor.watchdog import DEFAULT_LIMIT_S as DEFAULT_WATCHDOG_S
from podkit.monitor.watchdog import Watchdog
from podkit.monitor.watchdog import check_limit as check_watchdog
from podkit.strategy import scoped_strategy
from podkit.train import auto_steps
from podkit.train import checkpointing as ckpt_lib
from podkit.train import checks as checks_lib
from podkit.train import compile as compile_lib
from podkit.train import feeds as feed_lib
from podkit.train import loop as loop_lib
from podkit.train import program as program_lib
from podkit.train import state as state_lib
from podkit.train.finalize import FinalizeVariables
from podkit.train.hooks import Callback, History
from podkit.train.instruments import CallbackHook, HeartbeatHook, MetricsLog
from podkit.train.telemetry import Telemetry

_log = logging.getLogger("podkit")


class _OptimizerState:
    """How the model's optimizer reads and replaces the optimizer state (optimizers.StateAccess)."""

    def __init__(self, model: Trainer) -> None:
        self.model = model

    def get_opt_state(self) -> Any:
        return self.model.state.opt_state if self.model.built else None

    def set_opt_state(self, opt_state: Any) -> None:
        self.model.state = self.model.state.replace(opt_state=opt_state)


class Trainer:
    """compile, fit, evaluate, predict and `model(x)`; a base of podkit.model.Model only."""

    # fit() ends by replacing the weights with their EMA (use_ema), as Keras's fit does;
    # train_on_batch, which runs a fit of one batch, turns that off for its call.
    _finalize_ema = True

    # -- compile ------------------------------------------------------------------------------
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, loss_weights: Any = None,
                metrics: Any = None, weighted_metrics: Any = None, run_eagerly: bool = False,
                steps_per_execution: int | str = "auto", jit_compile: bool | str = "auto",
                jit: bool = True, learning_rate: Any = None, microbatches: int = 1,
                recompile_warning_after: int | None = 5, strict_recompiles: bool = False,
                grad_norm: bool | None = None, **unknown: Any) -> None:
        """Choose optimizer, loss and metrics, as Keras. `steps_per_execution=k` runs k steps
        per device call; "auto" (podkit's default; Keras's is 1) chooses k at each fit(): 1
        when a callback needs every batch, else as many as keep an execution to a few
        seconds (podkit.train.auto_steps; the choice and why are logged); evaluate() and
        predict() then run one step per call. `run_eagerly=True` (or `jit=False`) runs the
        same steps eagerly.
        `microbatches=m` (podkit's) splits each batch into m parts run one after another and
        sums their gradients before one update: the same step as the whole batch, with the
        activation memory of 1/m of it (batch statistics are then per part).

        Recompiles (podkit's): a step that compiles again (a new input shape or dtype) is
        explained in `model.recompiles.events`; after `recompile_warning_after` of one step a
        RecompileWarning lists them, and `strict_recompiles=True` makes any an error.
        `grad_norm`: log the global gradient norm (each execution's last step); None measures
        it for models of a million parameters or more (on tiny ones it costs a few percent)."""
        self.recompiles.configure(recompile_warning_after, strict_recompiles)
        config = compile_lib.resolve(optimizer, loss, loss_weights, metrics, weighted_metrics,
                                     run_eagerly, steps_per_execution, jit_compile, jit,
                                     learning_rate, microbatches, unknown, grad_norm)
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
        self._auto_steps = self._auto_pinned = None  # chosen again for the new program
        self._compiled_trainable = [(layer, layer.trainable) for layer in self._leaf_layers()]
        self._trainable_warned = ()  # a change after this compile() is warned again
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
        """Steps per device call: compile()'s count, or the one steps_per_execution="auto"
        chose for the latest fit() (1 before any)."""
        c = self._compiled
        if c is None:
            return 1
        if c.steps_per_execution == auto_steps.AUTO:
            return self._auto_steps.k if self._auto_steps is not None else 1
        return c.steps_per_execution

    def _choose_steps(self, feed: feed_lib.Feed, role: str, callbacks: Any = (),
                      intervals: tuple[tuple[str, int], ...] = (), verbose: int = 0) -> None:
        """Set the feed's steps per execution: compile()'s count, or, for "auto", the count
        podkit.train.auto_steps chooses for a train feed (the same on every process), logged
        once per distinct choice (printed when verbose), and 1 for the others."""
        c = self._compiled
        if c is None or c.steps_per_execution != auto_steps.AUTO:
            feed.k = self.steps_per_execution
            return
        if self._auto_pinned is not None:  # precompile()'s: its programs serve every role
            feed.k = self._auto_pinned.k
            return
        if role != "train":  # evaluate, predict, validation: one per call (auto_steps)
            feed.k = 1
            return
        every = tuple(type(cb).__name__ for cb in callbacks
                      if isinstance(cb, Callback) and cb.needs_every_batch("train"))
        devices = list(self.strategy.mesh.devices.flat)
        choice = auto_steps.choose(
            steps=feed.steps_per_epoch,
            seconds_at_peak=self._seconds_at_peak(feed.global_batch),
            batch_bytes=feed.batch_nbytes // max(len(devices), 1), every_batch=every,
            jit=c.jit, intervals=intervals, strict=self.recompiles.strict)
        k = agree.process0_decides(choice.k)
        if k != choice.k:
            choice = auto_steps.Choice(k, "process 0's choice (the processes must agree)")
        self._auto_steps = choice
        feed.k = k
        line = choice.line()
        if line not in self._auto_said:
            self._auto_said.add(line)
            _log.info(line)
            if verbose:
                print(line, flush=True)

    def _seconds_at_peak(self, batch: int) -> float | None:
        """A train step's time at the devices' peak FLOP/s: its forward's FLOPs x3 (the
        backward is about twice the forward), over the mesh's devices. None where the peak
        is unknown or nothing was counted."""
        devices = list(self.strategy.mesh.devices.flat)
        peak = hardware.peak_flops(devices[0])
        flops = self._program.forward_flops(self._layout.abstract, self._input_spec.example(),
                                            batch)
        if peak is None or not flops:
            return None
        return 3 * flops / (peak.flops_per_s * len(devices))

    # -- the checks before XLA ----------------------------------------------------------------
    def _data_check(self) -> checks_lib.DataCheck:
        return checks_lib.DataCheck(checks_lib.ModelIO(
            self._input_spec.names, self._input_spec.shapes, self._outputs,
            self._arch.output_names(), self._output_shapes, self._outputs_for,
            self._arch.input_ranges()))

    def _outputs_for(self, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
        """The output shapes for inputs of other `shapes` (another sequence length), traced
        abstractly once per shape; an InputError when the network needs the built ones."""
        known = self._shape_cache.get(shapes)
        if known is None:
            spec = dataclasses.replace(self._input_spec, shapes=shapes)
            try:
                known = self._program.output_shapes(self._layout.abstract, spec.example())
            except Exception as e:  # the network's own shape error, said in podkit's words
                built = ", ".join(f"(batch, {', '.join(map(str, s))})"
                                  for s in self._input_spec.shapes)
                got = ", ".join(f"(batch, {', '.join(map(str, s))})" for s in shapes)
                known = InputError(
                    f"inputs of shape {got} do not fit the model, built for {built}: it cannot "
                    f"take another length ({type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    "). Give every batch the built shape (padded_batch(batch_size, "
                    "padded_shapes=...) with the longest length, or reshape the data), or use "
                    "a model that takes any length (a recurrent layer or "
                    "GlobalAveragePooling1D in place of Flatten).")
            self._shape_cache[shapes] = known
        if isinstance(known, Exception):
            raise known
        return known

    def _prepare(self, feed: feed_lib.Feed, with_labels: bool) -> None:
        """Build from the feed's first rows, then check the data against the model. Every
        process checks its own data and all agree on the outcome, so one process's error is
        every process's error (none is left waiting in a collective)."""
        if self._compiled is None and with_labels:
            raise ConfigError("call model.compile(optimizer=..., loss=...) first.")
        x, y = feed.first()
        if not self.built:
            self._build_from(x)
        layers = self._leaf_layers()
        frozen = tuple(not layer.trainable for layer in layers)
        if with_labels and frozen != self._frozen:
            # Checked after the build (which makes the modules with the flags compile()
            # saw), so a change between compile() and the first fit is said too.
            # (strict=False: after Sequential.add/pop, the layers both lists have)
            changed = tuple(layer.name for layer, f, g in zip(layers, frozen, self._frozen,
                                                              strict=False) if f != g)
            if changed != self._trainable_warned:  # once per change, not every step
                self._trainable_warned = changed
                warnings.warn(
                    f"podkit: trainable changed on layers {list(changed)} since {self.name} "
                    "was compiled; it trains them as they were then (Keras's rule: trainable "
                    "takes effect at compile()). Call compile() again to apply the change.",
                    UserWarning, stacklevel=user_stacklevel())
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
        with self.strategy.scope():  # the forward's kernels run over this mesh
            checks_lib.check_probabilities(self._program.spec, self._cell.value, x,
                                           self.strategy.replicated())

    # -- fit / evaluate / predict -------------------------------------------------------------
    def _feed(self, x: Any, y: Any, *, training: bool, with_labels: bool, role: str,
              **kwargs: Any) -> feed_lib.Feed:
        """The feed for fit()/evaluate()/predict()'s input, the model built from it and the
        data checked; its steps per execution set (a train feed's by fit(), which knows the
        callbacks and schedules first)."""
        if x is not None and not isinstance(x, str):
            x = self._arch.normalize_x(x)
        feed = feed_lib.make_feed(
            x, y, strategy=self.strategy, training=training, with_labels=with_labels,
            steps_per_execution=self.steps_per_execution, cache=self._staging, role=role,
            **kwargs)
        try:
            self._prepare(feed, with_labels)
            if role != "train":
                self._choose_steps(feed, role)
        except BaseException:
            feed.close()
            raise
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
            on_nan: str | None = None, watchdog: float | None = DEFAULT_WATCHDOG_S,
            profile_steps: Any = None) -> History:
        """Train for `epochs`; returns a History whose `.history` has per-epoch values.

        verbose: 0 silent, 1 or "auto" a progress bar (one line per epoch when stdout is not
        a terminal), 2 one line per epoch. `run_dir=PATH` writes run.json, metrics.jsonl and
        final.json there (see podkit.monitor.run_dir); a gs:// or s3:// URL is written in a
        local copy and pushed there as the run goes.

        checkpoint: a directory (path, s3://, gs://) or a pk.checkpoint.CheckpointManager:
        training resumes from its newest valid checkpoint and saves there (every epoch unless
        the manager has a schedule, at the end, and on SIGTERM). resume: a checkpoint to start
        from when `checkpoint` has none. on_nan: None (as Keras), "stop" (an error naming the
        step) or "rollback" (to the last checkpoint, skipping the offending batches).

        watchdog: seconds without a completed step after which every thread's stack and the
        last step are written to the run directory and the log (None: off). profile_steps:
        `(first, last)` or "A:B": a JAX profiler trace of those steps in
        `run_dir/profile/` (TensorBoard's profile plugin or Perfetto open it).
        """
        lifetime.fit_called()  # where a run's account begins outside `podkit train`
        verbose = _verbosity(verbose)
        watchdog = check_watchdog(watchdog)
        if run_dir is not None:
            from podkit.monitor.run_dir import check_run_dir

            check_run_dir(run_dir)
        profile = parse_profile_steps(profile_steps, run_dir)
        if log_every is not None and (isinstance(log_every, bool) or
                                      not isinstance(log_every, int) or log_every < 1):
            raise ConfigError(f"log_every={log_every!r} must be an int >= 1 (steps between "
                              "log points), or None (a live progress line).")
        self.recompiles.enter("fit")
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
        if not isinstance(callbacks, list | tuple | type(None)):
            raise ConfigError(f"callbacks={callbacks!r} must be a list of pk.callbacks objects.")
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
        cbs: list[Callback] = list(callbacks or [])
        where = records = None  # the run directory's local path (a URL's: its copy)
        if run_dir is not None:
            from podkit.monitor.run_dir import RunDir, RunDirectory, local_run_dir

            where, mirror = local_run_dir(run_dir)
            given = run_dir if isinstance(run_dir, RunDir) else RunDir(where)
            records = RunDirectory(
                RunDir(where, given.config_toml, elastic=given.elastic), self._run_record(
                    epochs=epochs, batch_size=batch_size,
                    steps_per_epoch=feed.steps_per_epoch, log_every=log_every), mirror=mirror)
            cbs.append(records)
        callback_list = CallbackList(cbs, add_history=True, add_progbar=bool(verbose),
                                     model=self)
        history = callback_list.history
        ckpt = self._checkpointing(checkpoint, resume, on_nan, callback_list, history, run_dir,
                                   epochs=epochs, batch_size=batch_size)
        intervals = [("log_every", log_every or 0)]
        intervals += list(ckpt.step_intervals() if ckpt is not None else ())
        if profile:
            intervals += [("profile_steps", profile[0] - 1), ("profile_steps", profile[1])]
        try:
            self._choose_steps(feed, "train", list(callback_list), tuple(intervals), verbose)
        except BaseException:
            feed.close()
            raise
        keys = [*self.compiled_metrics, "input_wait"]
        keys += [k for cb in callback_list for k in cb.adds_logs if k not in keys]
        if validate is not None:
            keys += [f"val_{k}" for k in self.compiled_metrics]
        callback_list.set_params({"verbose": verbose, "epochs": epochs,
                                  "steps": feed.steps_per_epoch, "metrics": keys})
        self.stop_training = False
        start = len(self.recompiles.events)
        telemetry = Telemetry(tokens_per_sample=_tokens_per_sample(feed.first()[1]),
                              devices=list(self.strategy.mesh.devices.flat),
                              recompiles=lambda: len(self.recompiles.events) - start)
        # The watchdog notes a finished step before callbacks run: one that hangs in a
        # callback then reports that step as completed.
        hooks = [HeartbeatHook("training"),
                 Watchdog(watchdog, where, jax.process_index()) if watchdog else None, ckpt,
                 MetricsLog(callback_list.on_log, log_every, telemetry),
                 CallbackHook(callback_list),
                 # after the callbacks: its start line follows the run directory's set-up
                 records.loop_hook() if records is not None else None,
                 ProfileSteps(*profile, where) if profile else None,
                 # closes first: on_train_end sees the EMA weights; not after one batch
                 # (Keras's train_on_batch never finalizes: the next call trains on)
                 FinalizeVariables() if self._finalize_ema else None]
        try:
            self.state = loop_lib.fit_loop(
                self._program, self._cell.value, feed, hooks, epochs=epochs,
                initial_epoch=initial_epoch, cell=self._cell, validate=validate,
                abstract=self.layout.abstract)  # the cell's value: maybe still a PendingState
        except BaseException:
            if records is not None:
                records.after_failure()
            raise
        self.history = history
        self._after_training()
        return history

    def _after_training(self) -> None:
        """What the model does once fit() has trained (Model: nested models get their
        weights back)."""

    def precompile(self, x: Any, y: Any = None, *, batch_size: int) -> Any:
        """Declared input specs, compiled ahead of time (as tf.function's input_signature):
        the train, evaluate and predict steps for batches of `batch_size` examples shaped like
        `x` and `y` -- per example, anything with `shape` and `dtype` (jax.ShapeDtypeStruct,
        an array of one example), or a dict or tuple of them for several inputs. A fit(),
        evaluate() or predict() fed such batches by a Dataset or an iterable then runs these
        programs: it compiles nothing, and compile(strict_recompiles=True) makes any other
        shape or dtype an error naming what differs from the declaration. (Arrays passed to
        fit() are staged whole on the devices: their programs depend on the array's length,
        not only on a batch's.) Returns the train step's cost (FLOPs, memory per device)."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"precompile(batch_size={batch_size!r}): pass the global batch "
                              "size, an int >= 1.")

        def batch(spec: Any) -> np.ndarray:
            if not hasattr(spec, "shape") or not hasattr(spec, "dtype"):
                raise ConfigError(f"precompile: {spec!r} is not a spec; pass objects with "
                                  "shape and dtype per example, e.g. jax.ShapeDtypeStruct("
                                  "(784,), 'float32').")
            return np.zeros((batch_size, *spec.shape), spec.dtype)

        xb = jax.tree.map(batch, x)
        if self._compiled is not None and \
                self._compiled.steps_per_execution == auto_steps.AUTO:
            # "auto" without the data's length: a feed of one batch builds the model and
            # chooses; fit(), evaluate() and predict() then keep that count (their programs
            # are these).
            self._auto_pinned = None
            one = (xb, jax.tree.map(batch, y)) if y is not None else (xb,)
            probe = self._feed([one], None, training=y is not None,
                               with_labels=y is not None, role="train")
            probe.close()
            self._choose_steps(probe, "train")
            self._auto_pinned = self._auto_steps
        k = self.steps_per_execution
        cost = None
        for role, with_labels in (("train", True), ("evaluate", True), ("predict", False)):
            if with_labels and y is None:
                continue
            batches = [(xb, jax.tree.map(batch, y)) if with_labels else (xb,)] * k
            # The first feed builds the model (and its program) from the batch's shapes.
            feed = self._feed(batches, None, training=role == "train",
                              with_labels=with_labels, role=role)
            try:
                inputs = next(iter(feed.epoch(0))).inputs
            finally:
                feed.close()
            program, state = self._program, state_lib.compilable(self._cell.value)
            if role == "train":
                cost = program.train_cost(state, program.zeros(), inputs)
            elif role == "evaluate":
                program.evaluate.trace(state, program.zeros(), inputs).lower().compile()
            else:
                program.predict.trace(state, inputs).lower().compile()
        return cost

    def compile_report(self, x: Any = None, y: Any = None, batch_size: int | None = None
                       ) -> Any:
        """What XLA makes of the train step for this data (podkit.monitor.compile_report):
        HLO op counts before and after optimization, fusions, FLOPs, bytes accessed, every
        collective with its size and mesh axes, memory per device. Compiles; runs nothing."""
        from podkit.monitor import compile_report as report_lib

        feed = self._feed(x, y, training=True, with_labels=True, role="train",
                          batch_size=batch_size, shuffle=False)
        try:
            execution = next(iter(feed.epoch(0)))
        finally:
            feed.close()
        state = state_lib.compilable(self._cell.value)  # a state initializing is not waited for
        stages = self._program.compile_train(state, self._program.zeros(), execution.inputs)
        if stages is None:
            raise ConfigError("compile_report() needs a jitted model: compile(jit=True).")
        cost = program_lib.cost_of(stages, execution.inputs.steps)
        mesh = dict(self.strategy.mesh.shape)
        report = report_lib.build(stages[1], stages[2], cost, mesh)
        capacity = hardware.memory_capacity(self.strategy.mesh.devices.flat[0])
        if capacity is not None and cost.peak_bytes > capacity:
            report.notes.append(f"it does not fit: {hardware.format_bytes(cost.peak_bytes)} "
                                f"per device against {hardware.format_bytes(capacity)}")
        return report

    def _checkpointing(self, checkpoint: Any, resume: Any, on_nan: str | None,
                       callbacks: CallbackList, history: History, run_dir: Any,
                       **fit_args: Any) -> ckpt_lib.Checkpointing | None:
        from podkit import saving
        from podkit.monitor.run_dir import RunDir

        # The model's record (what model.json holds): load_model reads a checkpoint directory.
        meta = {"fit": fit_args, "processes": jax.process_count(),
                "devices": jax.device_count(), "model": self.name,
                "config": run_dir.config_toml if isinstance(run_dir, RunDir) else None,
                "saved_model": saving.model_record(self)}
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
        self.recompiles.enter("evaluate")
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
        self.recompiles.enter("predict")
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

    # -- Keras's batch-at-a-time API: one step on exactly the batch given ---------------
    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None,
                       class_weight: Mapping[int, float] | None = None,
                       return_dict: bool = False) -> Any:
        """One optimizer step on the batch (x, y), as Keras's: the batch's loss, `[loss,
        *metrics]` with metrics, or a dict with `return_dict=True`. The same compiled step
        as fit() (compiled once per batch shape); metrics are this batch's."""
        n = _batch_rows(x, "train_on_batch")
        self._finalize_ema = False
        try:
            history = self.fit(x, y, batch_size=n, epochs=1, verbose=0, shuffle=False,
                               sample_weight=sample_weight, class_weight=class_weight,
                               watchdog=None)
        finally:
            self._finalize_ema = True
        results = {k: v[-1] for k, v in history.history.items() if k != "input_wait"}
        if return_dict:
            return results
        values = list(results.values())
        return values[0] if len(values) == 1 else values

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None,
                      return_dict: bool = False) -> Any:
        """Loss and metrics on one batch, as Keras's (evaluate() on exactly that batch)."""
        return self.evaluate(x, y, batch_size=_batch_rows(x, "test_on_batch"), verbose=0,
                             sample_weight=sample_weight, return_dict=return_dict)

    def predict_on_batch(self, x: Any) -> Any:
        """The outputs for one batch, as Keras's (predict() on exactly that batch)."""
        return self.predict(x, batch_size=_batch_rows(x, "predict_on_batch"), verbose=0)

    def __call__(self, x: Any, training: bool | None = None) -> Any:
        """`model(x)`: the outputs for x as numpy arrays (Keras returns tensors; here
        `np.asarray(...)` is already what `.numpy()` gives). Inference only. On pk.Input
        tensors, or inside another model's call(), the model is a layer (nested models)."""
        if isinstance(x, SymbolicTensor) or (isinstance(x, list | tuple) and x and all(
                isinstance(t, SymbolicTensor) for t in x)) or active_scope() is not None:
            return self.as_layer()(x, training=training)
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


def _tokens_per_sample(y: Any) -> int | None:
    """Tokens per example for a sequence model (integer labels per position, as a language
    model's next tokens): what tokens/s counts. None for anything else."""
    leaves = jax.tree.leaves(y)
    if len(leaves) != 1:
        return None
    shape, dtype = np.shape(leaves[0]), np.asarray(leaves[0]).dtype
    n = math.prod(shape[1:])
    return n if len(shape) >= 2 and n > 1 and np.issubdtype(dtype, np.integer) else None


def _verbosity(verbose: Any) -> int:
    """Keras's verbose values: 0, 1, 2 or "auto" (= 1); anything else is refused."""
    if verbose == "auto":
        return 1
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise ConfigError(f"verbose={verbose!r}; pass 0 (silent), 1 (progress bar), 2 (one "
                          "line per epoch) or 'auto'.")
    return int(verbose)


def _batch_rows(x: Any, what: str) -> int:
    """The rows of a batch of arrays (the *_on_batch calls take arrays, not datasets)."""
    leaves = jax.tree.leaves(feed_lib.as_arrays(x, "x")) if x is not None else []
    if not leaves or not hasattr(leaves[0], "shape") or not leaves[0].shape:
        raise ConfigError(f"{what}(x) takes one batch of arrays (numpy, or a list/dict of "
                          f"them); got {type(x).__name__}. Iterate a Dataset with fit().")
    return int(leaves[0].shape[0])
