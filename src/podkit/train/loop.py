"""The loops: drive compiled steps over a feed, with callbacks. No model inside.

    state = fit_loop(steps, state, feed, callbacks, epochs=3)

The host never waits for the devices just to report: executions are dispatched
asynchronously, at most IN_FLIGHT are queued before the host waits for the oldest, and loss and
metrics are device sums fetched from an execution that has already finished. Batch-level
callback logs (Keras's on_train_batch_end) are the exception: they need the sums of the
execution that just ran, so they are fetched only when a callback asks for them.

A `StateCell` makes the newest state visible between executions (callbacks read and replace
it through `model.state`: restoring best weights, setting a learning rate), and a state a
callback put there is what the next execution trains on.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podkit import agree
from podkit.launch import heartbeat
from podkit.train.checkpointing import Checkpointing, Position, Rollback
from podkit.train.program import Program
from podkit.train.state import StateCell, TrainState

IN_FLIGHT = 2  # executions queued on the devices before the host waits for the oldest
LIVE_LOG_S = 0.25  # progress refresh when no log_every is set


def _minus(a: Any, b: Any) -> Any:
    return jax.tree.map(lambda x, y: np.asarray(x) - np.asarray(y), a, b)


class _LogPoints:
    """Decides when an execution is logged and turns its device sums into logs.

    Only executions that already finished are reported, so fetching their sums never waits.
    """

    def __init__(self, steps: Program, epoch: int, step: int, log_every: int | None,
                 callbacks: Any, sums: Any = None) -> None:
        self.steps, self.epoch, self.log_every, self.callbacks = steps, epoch, log_every, callbacks
        # A resumed epoch's first window starts from the sums it was saved with.
        self.sums = jax.device_get(steps.zeros() if sums is None else sums)
        self.samples, self.step, self.time = 0, step, time.perf_counter()
        self.input_wait = 0.0  # seconds the loop has waited for input, this epoch

    def due(self, step: int) -> bool:
        if self.log_every is not None:
            return step // self.log_every > self.step // self.log_every
        return time.perf_counter() - self.time > LIVE_LOG_S

    def report(self, sums: Any, step: int, steps_in_epoch: int, samples: int,
               input_wait: float = 0.0) -> None:
        host = jax.device_get(sums)
        now = time.perf_counter()
        logs = {"epoch": self.epoch, "steps_in_epoch": steps_in_epoch,
                **self.steps.results(host)}
        logs.update({f"window/{k}": v
                     for k, v in self.steps.results(_minus(host, self.sums)).items()})
        logs["samples_per_s"] = (samples - self.samples) / max(now - self.time, 1e-9)
        # Share of the window's wall time the loop spent waiting for its next input.
        logs["input_wait"] = min((input_wait - self.input_wait) / max(now - self.time, 1e-9), 1.0)
        self.sums, self.samples, self.step, self.time = host, samples, step, now
        self.input_wait = input_wait
        self.callbacks.on_log(step, logs)


def fit_loop(steps: Program, state: TrainState, feed: Any, callbacks: Any, *,
             epochs: int, initial_epoch: int = 0,
             validate: Callable[[TrainState, int], dict[str, float]] | None = None,
             log_every: int | None = None, cell: StateCell | None = None,
             checkpointing: Checkpointing | None = None, abstract: Any = None) -> TrainState:
    """Train for epochs [initial_epoch, epochs); returns the new state.

    With `checkpointing` (and the state's `abstract` tree) the run may start from a
    checkpoint, saves as its managers say, and rolls back on a NaN loss when asked.
    """
    cell = cell if cell is not None else StateCell()
    with heartbeat.loop("training") as hb:
        logs = _fit(steps, state, feed, callbacks, hb, epochs=epochs,
                    initial_epoch=initial_epoch, validate=validate, log_every=log_every,
                    cell=cell, ckpt=checkpointing, abstract=abstract)
    # After the loop (the launcher's --exit-timeout applies): callbacks' closing work is
    # host work, not a step that beats.
    callbacks.on_train_end(logs)
    return cell.value


def _fit(steps: Program, state: TrainState, feed: Any, callbacks: Any,
         hb: heartbeat.Loop, *, epochs: int, initial_epoch: int, validate: Any,
         log_every: int | None, cell: StateCell, ckpt: Checkpointing | None,
         abstract: Any) -> dict[str, Any]:
    """fit_loop inside its heartbeat loop; returns the last epoch's logs."""
    pos, sums = Position(initial_epoch), None
    zeros_abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), steps.zeros())
    tree_abstract = {"state": abstract, "sums": zeros_abstract}
    logs: dict[str, Any] = {}
    if ckpt is not None:
        ckpt.watch_preemption()  # from here to close(), SIGTERM saves instead of exiting
    try:
        if ckpt is not None:
            state, resumed, sums = ckpt.start(state, tree_abstract, feed)
            if ckpt.resumed_step is not None:
                pos = resumed
        cell.value = state
        callbacks.on_train_begin()
        if ckpt is not None:
            ckpt.on_train_begin()
        while True:
            try:
                logs, pos, data_state = _epochs(steps, cell, feed, callbacks, pos, sums, hb,
                                                epochs=epochs, validate=validate,
                                                log_every=log_every, ckpt=ckpt)
                break
            except Rollback as bad:
                feed.close()  # a fresh input, positioned by the checkpoint
                cell.value, pos, sums = ckpt.rollback(tree_abstract, feed, bad)
        if ckpt is not None:
            ckpt.at_train_end(cell.value, steps.zeros(), pos,
                              int(jax.device_get(cell.value.step)), data_state)
    except BaseException:
        feed.close()
        if ckpt is not None:
            ckpt.close(failing=True)
        raise
    feed.close()
    if ckpt is not None:
        ckpt.close()
    return logs


def _epochs(steps: Program, cell: StateCell, feed: Any, callbacks: Any, pos: Position,
            start_sums: Any, hb: heartbeat.Loop, *, epochs: int, validate: Any,
            log_every: int | None, ckpt: Checkpointing | None) -> tuple[dict, Position, Any]:
    """The epochs from `pos` on; returns the last epoch's logs, where training stopped and
    the input's position there."""
    step = int(jax.device_get(cell.value.step))
    batch_logs = callbacks.wants["on_train_batch_end"]
    batch_begin = callbacks.wants["on_train_batch_begin"]
    skip = ckpt.skip if ckpt is not None else set()
    logs: dict[str, Any] = {}
    data_state = None
    reached = pos
    for epoch in range(pos.epoch, epochs):
        callbacks.on_epoch_begin(epoch)
        resuming = epoch == pos.epoch and (pos.execution or start_sums is not None)
        sums = start_sums if resuming and start_sums is not None else steps.zeros()
        epoch_start = time.perf_counter()
        points = _LogPoints(steps, epoch, step, log_every, callbacks, sums)
        inflight: collections.deque = collections.deque()
        # `consumed` counts the steps of data taken this epoch (the data position), which
        # differs from the steps trained only after a rollback skipped some.
        execution_index = pos.execution if resuming else 0
        consumed = steps_in_epoch = pos.steps_in_epoch if resuming else 0
        samples = 0
        # input_wait: the loop's time blocked on the feed, counted only up to the time the
        # input pipeline itself was busy (a feed that waits on a device transfer is not the
        # pipeline starving the step).
        waited = 0.0
        source_start = feed.source_s
        executions = iter(feed.epoch(epoch))
        try:
            while True:
                t0 = time.perf_counter()
                execution = next(executions, None)
                waited += time.perf_counter() - t0
                if execution is None:
                    break
                here = (epoch, execution_index)
                execution_index += 1
                consumed += execution.steps
                data_state = execution.data_state
                if here in skip:  # rolled back past this execution once: leave it out
                    continue
                if batch_begin:
                    callbacks.on_train_batch_begin(steps_in_epoch)
                previous = step
                cell.value, sums = steps.train(cell.value, sums, execution.inputs)
                steps_in_epoch += execution.steps
                samples += execution.samples
                step += execution.steps
                _beat()
                inflight.append((sums, step, steps_in_epoch, samples,
                                 min(waited, feed.source_s - source_start), here, previous))
                if batch_logs:
                    callbacks.on_train_batch_end(steps_in_epoch - 1, steps.results(sums))
                if len(inflight) > IN_FLIGHT:
                    oldest = inflight.popleft()
                    jax.block_until_ready(oldest[0]["loss"]["count"])
                    # Compiled and running: from now on only progress beats (a hung step
                    # stops them and `podkit launch` notices).
                    hb.running()
                    _check(ckpt, oldest)
                    if points.due(oldest[1]):
                        points.report(*oldest[:5])
                if ckpt is not None:
                    ckpt.after_execution(
                        cell.value, sums, Position(epoch, execution_index, consumed), step,
                        previous, data_state,
                        check=functools.partial(_check_all, ckpt, inflight))
                if callbacks.stop_training:
                    break
        finally:
            close = getattr(executions, "close", None)
            if close is not None:
                close()
        while inflight:
            entry = inflight.popleft()
            jax.block_until_ready(entry[0]["loss"]["count"])
            hb.running()  # an epoch of fewer than IN_FLIGHT executions ran too
            _check(ckpt, entry)
            last = not inflight
            if points.due(entry[1]) or (last and log_every is None):
                points.report(*entry[:5])
        epoch_s = time.perf_counter() - epoch_start
        logs = steps.results(sums)
        logs["input_wait"] = min(waited, feed.source_s - source_start) / max(epoch_s, 1e-9)
        if validate is not None:  # a loop of its own (heartbeat.loop nests)
            logs.update({f"val_{k}": v for k, v in validate(cell.value, epoch).items()})
        callbacks.on_epoch_end(epoch, logs)
        reached = Position(epoch + 1)
        if ckpt is not None:
            ckpt.at_epoch_end(cell.value, steps.zeros(), epoch, step, data_state)
        if callbacks.stop_training:
            break
    return logs, reached, data_state


def _check_all(ckpt: Checkpointing | None, entries: Any) -> None:
    for entry in entries:
        _check(ckpt, entry)


def _check(ckpt: Checkpointing | None, entry: tuple) -> None:
    """NaN/Inf in an execution that finished (on_nan): stop, or roll back."""
    if ckpt is not None and ckpt.on_nan is not None:
        sums, step, _, _, _, (epoch, execution), previous = entry
        ckpt.check_loss(sums, epoch, execution, previous, step)


def _beat() -> None:
    """Tell a supervising `podkit launch` this process is making progress (a no-op
    otherwise; at most one syscall per half second)."""
    heartbeat.beat()


def _progress(hb: heartbeat.Loop, inflight: collections.deque, result: Any) -> None:
    """After an evaluate/predict execution was dispatched: keep at most IN_FLIGHT queued, as
    fit() does, so that a beat follows real progress of the devices (and the host does not
    queue a whole dataset's executions before the first finishes)."""
    inflight.append(result)
    if len(inflight) > IN_FLIGHT:
        jax.block_until_ready(inflight.popleft())
        hb.running()  # an execution finished: compiled and running
    _beat()


def eval_loop(steps: Program, state: TrainState, feed: Any,
              callbacks: Any | None = None) -> dict[str, float]:
    """Loss and metrics over one pass of the feed."""
    batch_logs = callbacks is not None and callbacks.wants["on_test_batch_end"]
    if callbacks is not None:
        callbacks.on_test_begin()
    sums = steps.zeros()
    done = 0
    inflight: collections.deque = collections.deque()
    with heartbeat.loop("evaluation") as hb:
        try:
            for execution in feed.epoch(0):
                if callbacks is not None and callbacks.wants["on_test_batch_begin"]:
                    callbacks.on_test_batch_begin(done)
                sums = steps.evaluate(state, sums, execution.inputs)
                _progress(hb, inflight, sums)
                done += execution.steps
                if batch_logs:
                    callbacks.on_test_batch_end(done - 1, steps.results(sums))
        finally:
            feed.close()
        logs = steps.results(sums)
    if callbacks is not None:
        callbacks.on_test_end(logs)
    return logs


def predict_loop(steps: Program, state: TrainState, feed: Any,
                 callbacks: Any | None = None) -> tuple[np.ndarray, ...]:
    """Every output for every real example of the feed, one numpy array per output."""
    if callbacks is not None:
        callbacks.on_predict_begin()
    outs, masks = [], []
    done = 0
    inflight: collections.deque = collections.deque()
    with heartbeat.loop("prediction") as hb:
        try:
            for execution in feed.epoch(0):
                if callbacks is not None and callbacks.wants["on_predict_batch_begin"]:
                    callbacks.on_predict_batch_begin(done)
                out, mask = steps.predict(state, execution.inputs)
                _progress(hb, inflight, mask)
                outs.append(out)
                masks.append(mask)
                done += execution.steps
                if callbacks is not None and callbacks.wants["on_predict_batch_end"]:
                    callbacks.on_predict_batch_end(done - 1, {"outputs": out})
        finally:
            feed.close()
        keep = np.concatenate([agree.gather(m).reshape(-1) for m in masks]) > 0
        result = tuple(
            np.concatenate([agree.gather(o[i]).reshape(-1, *o[i].shape[2:]) for o in outs])[keep]
            for i in range(len(outs[0])))
    if callbacks is not None:
        callbacks.on_predict_end()
    return result
