"""The loop's two protocols: `LoopHook`, which every instrument of a loop implements
(checkpointing, heartbeat, metrics logging, Keras callbacks), and Keras's `Callback`.

A loop (podkit.train.loop) knows only `LoopHook`s. The events that open something go to the
hooks in list order, and those that close it (after_execution, epoch_end, end, close) in
reverse, as nested `with` blocks leave: the first hook (fit's heartbeat) is the outermost and
closes last, and a hook listed after another (fit's callbacks after its checkpointing) ends a
batch or an epoch before it, so the checkpoint taken there holds what the callbacks did.
What one loop run looks like to them:

    begin(run)                      the loop starts: enter scopes, restore, on_train_begin
      epoch_begin(run, epoch)
        before_execution(run)       an execution is about to be dispatched
        execution_finished(run, ex) an older execution finished: its sums can be read
                                    without waiting (NaN checks, log points)
        after_execution(run, ex)    the new execution is in flight: on_train_batch_end,
                                    then saves, then a beat
        preemption(run)             every process agreed to stop here (a final save ran)
      epoch_end(run, epoch, logs)   callbacks' on_epoch_end, then the epoch's saves
    end(run, logs)                  training finished normally: final saves, committed;
                                    the heartbeat's loop ends here, after them
    close(run, failing)             always, last: on_train_end, wait for saves in flight,
                                    leave scopes

`run` (a `LoopRun`) is the loop's state the hooks may read: the program, the state cell, the
step, the in-flight executions, the data position. An `InFlight` is one dispatched execution.

Callbacks (Keras's name for hooks): the Keras 3 events, plus `on_log`.

The loop calls, as Keras does: `on_train_begin/end`, `on_epoch_begin/end(epoch, logs)`,
`on_train_batch_begin/end(batch, logs)` once per execution (with steps_per_execution=k, at
steps k-1, 2k-1, ... — Keras's behaviour), `on_test_*` and `on_predict_*` in evaluate() and
predict(). Batch logs cost a device-to-host copy per execution, so the loop fetches them only
when a callback overrides a batch hook; otherwise nothing waits on the device.

`on_log(step, logs)` is podkit's own: at each log point, with sums the loop fetched from an
execution that had already finished (so it never waits): the epoch's running means, the
window's (`window/loss`, ...), `samples_per_s`, `input_wait`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from podkit.train.feeds import DataPosition, Feed
from podkit.train.state import StateCell

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin",
                "on_test_batch_end", "on_predict_batch_begin", "on_predict_batch_end")


class Callback:
    """Base class: override the events you need. `model` and `params` are set by fit()."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict) -> None:
        self.params = params

    def on_train_begin(self, logs: dict | None = None) -> None: ...
    def on_train_end(self, logs: dict | None = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.on_batch_begin(batch, logs)  # Keras's older names, still routed as Keras does

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.on_batch_end(batch, logs)

    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_test_begin(self, logs: dict | None = None) -> None: ...
    def on_test_end(self, logs: dict | None = None) -> None: ...
    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_predict_begin(self, logs: dict | None = None) -> None: ...
    def on_predict_end(self, logs: dict | None = None) -> None: ...
    def on_predict_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None: ...

    def on_log(self, step: int, logs: dict) -> None:
        """At each log point (see the module docstring)."""

    # -- what a callback declares to fit() (podkit's part of the protocol) ---------------------
    #: Keys this callback adds to the epoch's logs (fit() tells monitoring callbacks that
    #: they will exist, e.g. "learning_rate").
    adds_logs: tuple[str, ...] = ()

    def needs_every_batch(self, role: str = "train") -> bool:
        """Whether it must run after every step of `role` ("train", "test", "predict"), so
        that compile(steps_per_execution="auto") runs one step per device call: by default,
        when it overrides one of that role's per-batch hooks (podkit.train.auto_steps). A
        callback content with one call per execution (k steps) returns False."""
        return any(overrides(self, f"on_{role}_batch_{at}") for at in ("begin", "end"))

    def checkpoint_saver(self) -> Any:
        """A callback that saves checkpoints returns the `podkit.train.checkpointing.Saver`
        fit()'s loop drives for it (its manager, schedule, whether the run resumes from it);
        None for the others."""
        return None


_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


def overrides(callback: Callback, hook: str) -> bool:
    """Whether a callback does something on `hook` (a method of its class or, as
    LambdaCallback sets them, of the object; or the hook's older Keras name)."""
    names = (hook, _ALIASES[hook]) if hook in _ALIASES else (hook,)
    return any(name in vars(callback) or getattr(type(callback), name, None) is not getattr(
        Callback, name) for name in names)


class History(Callback):
    """Per-epoch means, as Keras's History: `history.history["loss"][epoch]`."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []
        self._start: tuple[dict, list] = ({}, [])

    def start_from(self, history: dict[str, list[float]], epoch: list[int]) -> None:
        """What training begins with (a resumed run's epochs so far, from its checkpoint)."""
        self._start = (history, epoch)

    def on_train_begin(self, logs: dict | None = None) -> None:
        history, epoch = self._start
        self.history = {k: list(v) for k, v in history.items()}
        self.epoch = list(epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)


# -- the loop's protocol --------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class InFlight:
    """One dispatched execution of fit(), until the host has seen it finish."""

    sums: Any  # the running device sums after this execution, packed (None in predict())
    step: int = 0  # optimizer steps done after it
    first_step: int = 0  # ... and before it (what a NaN report names)
    steps_in_epoch: int = 0  # steps of its epoch (evaluate/predict: of the pass) after it
    samples: int = 0  # examples trained this epoch after it
    input_wait: float = 0.0  # seconds the loop had waited for input this epoch, after it
    epoch: int = 0
    execution: int = 0  # its index in the epoch, as the data counts executions
    position: DataPosition | None = None  # the input's position after it (fit only)
    outputs: Any = None  # predict(): (outputs, mask)
    last: bool = False  # the last execution of its epoch to finish
    timing: Any = None  # fit(): its podkit.train.timeline.Execution (when it finished)

    def wait(self) -> None:
        """Block until the devices finished it."""
        if self.sums is not None:
            jax.block_until_ready(self.sums)
        else:
            jax.block_until_ready(self.outputs[1])


@dataclasses.dataclass
class LoopRun:
    """What hooks see of one loop run (and what checkpointing may set when it restores)."""

    kind: str  # "training", "evaluation" or "prediction"
    program: Any  # podkit.train.program.Program
    feed: Feed
    cell: StateCell
    epochs: int = 1
    position: DataPosition | None = None  # where training (re)starts
    sums: Any = None  # the restored epoch's running sums, None for zeros
    abstract: Any = None  # {"state": ..., "sums": ...}: what a checkpoint restores into
    skip: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    inflight: collections.deque = dataclasses.field(default_factory=collections.deque)
    step: int = 0
    reached: DataPosition | None = None  # where training stopped (the input's position)
    steps_done: int = 0  # steps run this epoch (or pass) before the next execution
    preempted: BaseException | None = None  # set by the hook that agreed on a preemption
    epoch_sums: Any = None  # the sums the current epoch started from
    epoch_step: int = 0  # the step the current epoch started at
    timeline: Any = None  # podkit.train.timeline.Timeline (fit): device-busy and host time
    cost: Any = None  # podkit.train.program.StepCost of the train program running (fit)
    compiled: bool = False  # the train program was compiled (or found) for this fit


class LoopHook:
    """One instrument of a loop; override the events you need (see the module docstring).

    A hook may stop training by returning True from `stop_training` (Keras callbacks set
    `model.stop_training`)."""

    def begin(self, run: LoopRun) -> None: ...
    def epoch_begin(self, run: LoopRun, epoch: int) -> None: ...
    def before_execution(self, run: LoopRun) -> None: ...
    def execution_finished(self, run: LoopRun, ex: Any) -> None: ...
    def after_execution(self, run: LoopRun, ex: Any) -> None: ...
    def preemption(self, run: LoopRun) -> None: ...
    def epoch_end(self, run: LoopRun, epoch: int, logs: dict) -> None: ...
    def end(self, run: LoopRun, logs: dict) -> None: ...
    def close(self, run: LoopRun, failing: bool) -> None: ...

    @property
    def stop_training(self) -> bool:
        return False

    @property
    def waits_each_execution(self) -> bool:
        """True when the hook reads each execution's results on the host as soon as it is
        dispatched (Keras batch logs): the loop then queues no more than it must."""
        return False


class Hooks:
    """The hooks of one loop run, one explicit method per event: opening events in list
    order, closing ones (after_execution, epoch_end, end, close) in reverse (see the module
    docstring)."""

    def __init__(self, hooks: list[LoopHook]) -> None:
        self.hooks = [h for h in hooks if h is not None]
        # The per-execution events go only to the hooks that override them: with one step
        # per execution, a no-op call per hook and event is a visible share of the step.
        self._before = _overriding(self.hooks, "before_execution")
        self._finished = _overriding(self.hooks, "execution_finished")
        self._after = _overriding(self.hooks[::-1], "after_execution")
        self._stoppers = [h for h in self.hooks
                          if type(h).stop_training is not LoopHook.stop_training]

    def begin(self, run: LoopRun) -> None:
        for h in self.hooks:
            h.begin(run)

    def epoch_begin(self, run: LoopRun, epoch: int) -> None:
        for h in self.hooks:
            h.epoch_begin(run, epoch)

    def before_execution(self, run: LoopRun) -> None:
        for event in self._before:
            event(run)

    def execution_finished(self, run: LoopRun, ex: Any) -> None:
        for event in self._finished:
            event(run, ex)

    def after_execution(self, run: LoopRun, ex: Any) -> None:
        for event in self._after:
            event(run, ex)

    def preemption(self, run: LoopRun) -> None:
        for h in self.hooks:
            h.preemption(run)

    def epoch_end(self, run: LoopRun, epoch: int, logs: dict) -> None:
        for h in reversed(self.hooks):
            h.epoch_end(run, epoch, logs)

    def end(self, run: LoopRun, logs: dict) -> None:
        for h in reversed(self.hooks):
            h.end(run, logs)

    def close(self, run: LoopRun, failing: bool) -> None:
        """Every hook is closed (in reverse), even when one fails to; the first error is
        raised after, and the hooks closed after it see `failing`."""
        error: BaseException | None = None
        for h in reversed(self.hooks):
            try:
                h.close(run, failing)
            except BaseException as e:  # re-raised below
                error = error or e
                failing = True
        if error is not None:
            raise error

    @property
    def stop_training(self) -> bool:
        return any(h.stop_training for h in self._stoppers)

    @property
    def waits_each_execution(self) -> bool:
        return any(h.waits_each_execution for h in self.hooks)


def _overriding(hooks: list[LoopHook], event: str) -> list[Callable]:
    """The bound `event` methods of the hooks whose class overrides LoopHook's no-op."""
    base = getattr(LoopHook, event)
    return [getattr(h, event) for h in hooks if getattr(type(h), event) is not base]
