"""The loop's everyday instruments, each a `LoopHook`: the heartbeat a supervising launcher
watches, the log points (metrics fetched from finished executions), and Keras callbacks.
Checkpointing is the fourth (podkit.train.checkpointing). fit/evaluate/predict choose them:

    hooks = [HeartbeatHook("training"), checkpointing, MetricsLog(callbacks.on_log, log_every),
             CallbackHook(callbacks)]

The order matters (podkit.train.hooks): the heartbeat is outermost, so restoring, saving and
waiting for saves all happen inside its loop; callbacks end a batch or an epoch before
checkpointing saves there (as before the hooks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podkit import heartbeat
from podkit.train.hooks import InFlight, LoopHook, LoopRun
from podkit.train.step import STEP_SUMS
from podkit.train.telemetry import Telemetry

LIVE_LOG_S = 0.25  # progress refresh when no log_every is set


class HeartbeatHook(LoopHook):
    """The process's side of `podkit launch`'s hang detection for one loop (see
    podkit.heartbeat): the loop's scope, a beat after every execution, and the Beater thread
    paused once the first execution finished (compiled and running: a hang is now seen)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._scope = contextlib.ExitStack()
        self._loop: heartbeat.Loop | None = None
        self._beats = False

    def begin(self, run: LoopRun) -> None:
        self._loop = self._scope.enter_context(heartbeat.loop(self.name))
        self._beats = heartbeat.enabled()  # outside `podkit launch` nothing to beat

    def execution_finished(self, run: LoopRun, ex: InFlight) -> None:
        self._loop.running()

    def after_execution(self, run: LoopRun, ex: InFlight) -> None:
        # At most one syscall per half second.
        if self._beats:
            heartbeat.beat()

    def end(self, run: LoopRun, logs: dict) -> None:
        # Listed first, it ends last: after the final saves are committed (part of the
        # loop). What follows (on_train_end and the program's own work) is "after" the loop:
        # the launcher's --exit-timeout applies, not the beats.
        self._scope.close()

    def close(self, run: LoopRun, failing: bool) -> None:
        # A failing loop ends here, after every other hook (saves in flight are awaited
        # inside the loop); a loop that ended normally left its scope at end().
        self._scope.close()


def metric_sums(sums: dict) -> dict:
    """The sums without the train step's own (podkit.train.step.STEP_SUMS)."""
    return {k: v for k, v in sums.items() if k != STEP_SUMS}


def _minus(a: Any, b: Any) -> Any:
    return jax.tree.map(lambda x, y: np.asarray(x) - np.asarray(y), a, b)


class MetricsLog(LoopHook):
    """Log points: decides when a finished execution is logged and turns its device sums into
    logs for `sink(step, logs)` (the callbacks' on_log). Only executions that already
    finished are reported, so fetching their sums never waits. `telemetry` adds throughput,
    MFU, goodput, compiles, memory (podkit.train.telemetry)."""

    def __init__(self, sink: Callable[[int, dict], None], log_every: int | None,
                 telemetry: Telemetry | None = None) -> None:
        self.sink, self.log_every = sink, log_every
        self.telemetry = telemetry or Telemetry()

    def begin(self, run: LoopRun) -> None:
        self.telemetry.begin()

    def epoch_begin(self, run: LoopRun, epoch: int) -> None:
        self.epoch = epoch
        # A resumed epoch's first window starts from the sums it was saved with.
        start = run.program.host_sums(run.epoch_sums)
        self.sums = metric_sums(start)
        self.telemetry.epoch_begin(start.get(STEP_SUMS))
        self.samples, self.step, self.time = 0, run.epoch_step, time.perf_counter()
        self.input_wait = 0.0  # seconds the loop has waited for input, this epoch

    def _due(self, step: int) -> bool:
        if self.log_every is not None:
            return step // self.log_every > self.step // self.log_every
        return time.perf_counter() - self.time > LIVE_LOG_S

    def execution_finished(self, run: LoopRun, ex: InFlight) -> None:
        # An epoch's (and so the run's) last execution closes its window too: the steps
        # after the last log point get their training-loss line.
        if self._due(ex.step) or (ex.last and (self.log_every is None or ex.step > self.step)):
            self._report(run, ex)

    def _report(self, run: LoopRun, ex: InFlight) -> None:
        # One device-to-host copy: the sums are packed (podkit.train.sums).
        every = run.program.host_sums(ex.sums)
        host = metric_sums(every)
        now = time.perf_counter()
        logs = {"epoch": self.epoch, "steps_in_epoch": ex.steps_in_epoch,
                **run.program.tree_results(host)}
        logs.update({f"window/{k}": v
                     for k, v in run.program.tree_results(_minus(host, self.sums)).items()})
        if ex.timing is not None:  # fit(): over completed device work (podkit.train.timeline)
            logs.update(self.telemetry.at_log_point(run, ex, ex.step - self.step,
                                                    ex.samples - self.samples,
                                                    every.get(STEP_SUMS)))
        else:
            logs["samples_per_s"] = (ex.samples - self.samples) / max(now - self.time, 1e-9)
        # Share of the window's wall time the loop spent waiting for its next input.
        logs["input_wait"] = min((ex.input_wait - self.input_wait) / max(now - self.time, 1e-9),
                                 1.0)
        self.sums, self.samples, self.step, self.time = host, ex.samples, ex.step, now
        self.input_wait = ex.input_wait
        self.sink(ex.step, logs)


class CallbackHook(LoopHook):
    """Keras callbacks (a podkit.callbacks.CallbackList) on the loop's events: on_train_* in
    fit, on_test_* in evaluate, on_predict_* in predict. Batch events cost a device fetch per
    execution, so they are sent only when a callback does something on them."""

    _EVENTS = {"training": "train", "evaluation": "test", "prediction": "predict"}

    def __init__(self, callbacks: Any) -> None:
        self.callbacks = callbacks
        self._logs: dict = {}
        # Set at begin(), when a callback does something on them.
        self._batch_begin: Callable | None = None
        self._batch_end: Callable | None = None

    def _event(self, run: LoopRun, what: str) -> tuple[str, Callable | None]:
        name = f"on_{self._EVENTS[run.kind]}_{what}"
        return name, getattr(self.callbacks, name)

    def begin(self, run: LoopRun) -> None:
        # The batch events, looked up once: they are sent only when a callback does
        # something on them (each costs a device fetch per execution).
        name, event = self._event(run, "batch_begin")
        self._batch_begin = event if self.callbacks.wants[name] else None
        name, event = self._event(run, "batch_end")
        self._batch_end = event if self.callbacks.wants[name] else None
        self._event(run, "begin")[1]()

    @property
    def waits_each_execution(self) -> bool:
        return self._batch_begin is not None or self._batch_end is not None

    def epoch_begin(self, run: LoopRun, epoch: int) -> None:
        self.callbacks.on_epoch_begin(epoch)

    def before_execution(self, run: LoopRun) -> None:
        if self._batch_begin is not None:
            self._batch_begin(run.steps_done)

    def after_execution(self, run: LoopRun, ex: InFlight) -> None:
        if self._batch_end is None:
            return
        if run.kind == "prediction":
            self._batch_end(ex.steps_in_epoch - 1, {"outputs": ex.outputs[0]})
        else:
            self._batch_end(ex.steps_in_epoch - 1, run.program.results(ex.sums))

    def epoch_end(self, run: LoopRun, epoch: int, logs: dict) -> None:
        self.callbacks.on_epoch_end(epoch, logs)

    def end(self, run: LoopRun, logs: dict) -> None:
        self._logs = logs

    def close(self, run: LoopRun, failing: bool) -> None:
        if failing:
            return  # as Keras: on_*_end only when the loop ended normally
        if run.kind == "prediction":
            self.callbacks.on_predict_end()
        else:
            self._event(run, "end")[1](self._logs)

    @property
    def stop_training(self) -> bool:
        return self.callbacks.stop_training
