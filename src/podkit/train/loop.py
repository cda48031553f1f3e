"""The loops: drive a compiled Program over a feed, telling their hooks. No model inside.

    state = fit_loop(program, state, feed, hooks, epochs=3)

The host never waits for the devices just to report: executions are dispatched
asynchronously, at most IN_FLIGHT are queued before the host waits for the oldest, and loss and
metrics are device sums fetched from an execution that has already finished. Batch-level
callback logs (Keras's on_train_batch_end) are the exception: they need the sums of the
execution that just ran, so they are fetched only when a callback asks for them.

Everything else a loop does on the side (checkpoints, heartbeats, log points, callbacks) is a
`LoopHook` (podkit.train.hooks) the caller passes in; the loop only keeps the order of events
and the data position. A `StateCell` makes the newest state visible between executions
(callbacks read and replace it through `model.state`), and a state put there is what the next
execution trains on.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from podkit import agree
from podkit.train import state as state_lib
from podkit.train.checkpointing import Rollback
from podkit.train.feeds import DataPosition, Feed
from podkit.train.hooks import Hooks, InFlight, LoopHook, LoopRun
from podkit.train.program import Program
from podkit.train.state import StateCell, TrainState
from podkit.train.timeline import Timeline

IN_FLIGHT = 2  # executions queued on the devices before the host waits for the oldest
# ... unless they ship only row ids (data staged on the devices) and no hook reads each one's
# results as it is dispatched (Keras batch logs): then they queue while the oldest was
# dispatched less than QUEUE_S ago, up to QUEUE_MAX, and are retired together (`_retire`):
# short ones down to QUEUE_MAX / 2 still queued (the devices keep work while the host
# dispatches the next), long ones down to IN_FLIGHT. A wait that blocks costs the host a
# sleep and a wake-up (tens of microseconds of CPU on a loaded 2-core machine); once per
# execution it was a visible share of a small model's step (issue 41), once per burst it is
# not.
QUEUE_MAX = 32
QUEUE_S = 0.05
INPUT_WAIT_S = 50e-6  # a feed read shorter than this was ready: not noted as input wait


@contextlib.contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """Python's cyclic garbage collector leaves the objects that existed before the loop
    alone while it runs (gc.freeze; gc.unfreeze after). A loop allocates a few small objects
    per execution, enough to set off a collection now and then, and a collection of the
    oldest generation walks every object of JAX, Flax and the model: ~0.13 s in the seed MLP
    bench's process, ~5% of a 3-epoch fit at one step per call (a hand-written loop
    allocates too little to set one off). Frozen objects are still freed when their last
    reference goes; only cycles among them wait for the loop's end. A caller who froze
    objects itself keeps its freeze, and a loop inside a loop (validation) the outer one's."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _frozen_heap(loop: Callable) -> Callable:
    """`loop` run inside _old_objects_frozen."""
    @functools.wraps(loop)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _old_objects_frozen():
            return loop(*args, **kwargs)
    return run


@_frozen_heap
def fit_loop(program: Program, state: TrainState, feed: Feed, hooks: Sequence[LoopHook], *,
             epochs: int, initial_epoch: int = 0,
             validate: Callable[[TrainState, int], dict[str, float]] | None = None,
             cell: StateCell | None = None, abstract: Any = None) -> TrainState:
    """Train for epochs [initial_epoch, epochs); returns the new state.

    With a checkpointing hook (and the state's `abstract` tree) the run may start from a
    checkpoint, saves as its managers say, and rolls back on a NaN loss when asked.
    """
    cell = cell if cell is not None else StateCell()
    cell.value = state
    run = LoopRun("training", program, feed, cell, epochs=epochs,
                  position=DataPosition(initial_epoch),
                  abstract={"state": abstract, "sums": program.sums_abstract()},
                  timeline=Timeline())
    hooks = Hooks(list(hooks))
    logs: dict[str, Any] = {}
    try:
        hooks.begin(run)
        while True:
            try:
                logs = _epochs(run, hooks, validate)
                break
            except Rollback as bad:
                feed.close()  # a fresh input, positioned by the checkpoint
                cell.value, run.position, sums = bad.source.rollback(run.abstract, feed, bad)
                run.sums = program.packed_sums(sums)
        run.step = int(jax.device_get(cell.value.step))
        hooks.end(run, logs)
    except BaseException:
        feed.close()
        run.timeline.close()
        hooks.close(run, failing=True)
        raise
    feed.close()
    run.timeline.close()
    hooks.close(run, failing=False)
    return state_lib.resolved(cell.value)  # a run of no steps never took it


def _epochs(run: LoopRun, hooks: Hooks, validate: Any) -> dict[str, Any]:
    """The epochs from `run.position` on; returns the last epoch's logs and leaves where
    training stopped (the input's position there) in `run.reached`."""
    program, feed, cell, pos, start_sums = run.program, run.feed, run.cell, run.position, run.sums
    step = state_lib.step_of(cell.value)
    logs: dict[str, Any] = {}
    position = run.reached = pos  # the input's position after the latest execution
    # Once per run, not per epoch (a fed feed's batch_nbytes normalizes its first batch).
    deep = feed.batch_nbytes == 0 and not program.serial and not hooks.waits_each_execution
    queue_max = QUEUE_MAX if deep else IN_FLIGHT
    for epoch in range(pos.epoch, run.epochs):
        resuming = epoch == pos.epoch and (pos.execution or start_sums is not None)
        sums = start_sums if resuming and start_sums is not None else program.zeros()
        run.epoch_sums, run.epoch_step, run.step = sums, step, step
        hooks.epoch_begin(run, epoch)
        epoch_start = time.perf_counter()
        inflight = run.inflight = collections.deque()
        # Steps trained this epoch; the feed's position counts the steps of data taken, which
        # differ only after a rollback skipped some.
        steps_in_epoch = pos.steps_in_epoch if resuming else 0
        samples = 0
        # input_wait: the loop's time blocked on the feed, counted only up to the time the
        # input pipeline itself was busy (a feed that waits on a device transfer is not the
        # pipeline starving the step).
        waited = 0.0
        source_start = feed.source_s
        executions = iter(feed.epoch(epoch, more=epoch + 1 < run.epochs))
        exhausted = False  # the epoch's data ran out (not a stop in the middle of it)
        try:
            while True:
                t0 = time.perf_counter()
                execution = next(executions, None)
                t1 = time.perf_counter()
                waited += t1 - t0
                if t1 - t0 > INPUT_WAIT_S:  # a blocked read, not a ready one
                    run.timeline.add("input", t0, t1)
                if execution is None:
                    exhausted = True
                    break
                position = execution.position
                here = (epoch, position.execution - 1)  # this execution's index in the epoch
                if here in run.skip:  # rolled back past this execution once: leave it out
                    continue
                run.steps_done = steps_in_epoch
                hooks.before_execution(run)
                previous = step
                if not run.compiled:
                    with run.timeline.host("compile"):
                        run.cost = _compile(program, cell, sums, execution.inputs)
                    run.compiled = True
                cell.value, sums = program.train(cell.value, sums, execution.inputs)
                timing = run.timeline.dispatched(sums, execution.steps, execution.samples)
                if program.serial:  # several XLA:CPU devices: see program.InputsFirst
                    jax.block_until_ready(sums)
                steps_in_epoch += execution.steps
                samples += execution.samples
                step += execution.steps
                run.step = step
                ex = InFlight(sums, step, previous, steps_in_epoch, samples,
                              min(waited, feed.source_s - source_start), epoch,
                              here[1], position, timing=timing)
                inflight.append(ex)
                if len(inflight) > queue_max:  # short executions: keep half queued
                    _retire(run, hooks, inflight, keep=max(queue_max // 2, IN_FLIGHT))
                elif len(inflight) > IN_FLIGHT and \
                        timing.dispatched - inflight[0].timing.dispatched > QUEUE_S:
                    _retire(run, hooks, inflight, keep=IN_FLIGHT)
                hooks.after_execution(run, ex)
                if run.preempted is not None:
                    # The final checkpoint holds every step dispatched: the executions still
                    # in flight finish first, so their window gets its training-loss line
                    # (metrics.jsonl then reaches the checkpoint's step).
                    while inflight:
                        entry = inflight.popleft()
                        entry.wait()
                        entry.last = not inflight
                        hooks.execution_finished(run, entry)
                    hooks.preemption(run)
                    raise run.preempted
                if hooks.stop_training:
                    break
        finally:
            close = getattr(executions, "close", None)
            if close is not None:
                close()
        # What the epoch's end reads of the devices (the last sums, the step) is copied to the
        # host as soon as the devices finish, not fetched one array at a time after: from
        # the last execution's end to the next epoch's first dispatch the devices wait.
        _copy_to_host_early(inflight[-1].sums if inflight else sums, cell.value)
        while inflight:
            entry = inflight.popleft()
            entry.wait()
            entry.last = not inflight
            hooks.execution_finished(run, entry)  # an epoch of few executions ran too
        epoch_s = time.perf_counter() - epoch_start
        logs = program.results(sums)
        logs["input_wait"] = min(waited, feed.source_s - source_start) / max(epoch_s, 1e-9)
        if validate is not None:  # a loop of its own (heartbeat scopes nest)
            with run.timeline.host("validation"):
                logs.update({f"val_{k}": v for k, v in validate(cell.value, epoch).items()})
        per_epoch = getattr(feed, "steps_per_epoch", None)
        if hooks.stop_training and not exhausted and position.epoch == epoch and \
                not (per_epoch and position.steps_in_epoch >= per_epoch):
            # Stopped inside the epoch (a step budget, TerminateOnNaN): a resume continues
            # the data from here, not from the next epoch's start.
            run.reached = position
        else:
            run.reached = DataPosition(epoch + 1, iterator=position.iterator)
        hooks.epoch_end(run, epoch, logs)
        if hooks.stop_training:
            break
    return logs


def _retire(run: LoopRun, hooks: Hooks, inflight: collections.deque, keep: int) -> None:
    """Tell the hooks of every execution but the newest `keep` that it finished, after one
    blocking wait: executions finish in order (each takes the state and sums its predecessor
    made), so once the newest of them has, so have the others. A wait per execution blocked
    and woke the host as often: tens of microseconds of CPU each on a loaded 2-core machine,
    taken from the devices' threads there (issue 41)."""
    inflight[-keep - 1].wait()
    while len(inflight) > keep:
        hooks.execution_finished(run, inflight.popleft())


def _copy_to_host_early(sums: Any, state: Any) -> None:
    leaves = jax.tree.leaves(sums)
    if isinstance(state, TrainState):
        leaves.append(state.step)
    for a in leaves:
        if isinstance(a, jax.Array):
            a.copy_to_host_async()


def _compile(program: Program, cell: StateCell, sums: Any, inputs: Any) -> Any:
    """Compile the train program for the first execution of a fit (or find it compiled) and
    return its cost. A state still being initialized on its thread is compiled against its
    abstract layout meanwhile, then taken."""
    cost = program.train_cost(state_lib.compilable(cell.value), sums, inputs)
    cell.value = state_lib.resolved(cell.value)
    return cost


def _dispatched(run: LoopRun, hooks: Hooks, ex: InFlight) -> None:
    """After an evaluate/predict execution was dispatched: keep at most IN_FLIGHT queued, as
    fit() does, so that a beat follows real progress of the devices (and the host does not
    queue a whole dataset's executions before the first finishes)."""
    if run.program.serial:  # several XLA:CPU devices: see program.InputsFirst
        ex.wait()
    run.inflight.append(ex)
    if len(run.inflight) > IN_FLIGHT:
        oldest = run.inflight.popleft()
        oldest.wait()
        hooks.execution_finished(run, oldest)
    hooks.after_execution(run, ex)


@_frozen_heap
def eval_loop(program: Program, state: TrainState, feed: Feed,
              hooks: Sequence[LoopHook] = ()) -> dict[str, float]:
    """Loss and metrics over one pass of the feed."""
    run = LoopRun("evaluation", program, feed, StateCell())
    hooks = Hooks(list(hooks))
    sums = program.zeros()
    done = 0
    try:
        hooks.begin(run)
        try:
            for execution in feed.epoch(0):
                run.steps_done = done
                hooks.before_execution(run)
                sums = program.evaluate(state, sums, execution.inputs)
                done += execution.steps
                _dispatched(run, hooks, InFlight(sums, steps_in_epoch=done))
        finally:
            feed.close()
        logs = program.results(sums)
        hooks.end(run, logs)
    except BaseException:
        hooks.close(run, failing=True)
        raise
    hooks.close(run, failing=False)
    return logs


@_frozen_heap
def predict_loop(program: Program, state: TrainState, feed: Feed,
                 hooks: Sequence[LoopHook] = ()) -> tuple[np.ndarray, ...]:
    """Every output for every real example of the feed, one numpy array per output."""
    run = LoopRun("prediction", program, feed, StateCell())
    hooks = Hooks(list(hooks))
    outs, masks = [], []
    done = 0
    try:
        hooks.begin(run)
        try:
            for execution in feed.epoch(0):
                run.steps_done = done
                hooks.before_execution(run)
                out, mask = program.predict(state, execution.inputs)
                outs.append(out)
                masks.append(mask)
                done += execution.steps
                _dispatched(run, hooks, InFlight(None, steps_in_epoch=done,
                                                 outputs=(out, mask)))
        finally:
            feed.close()
        keep = np.concatenate([agree.gather(m).reshape(-1) for m in masks]) > 0
        result = tuple(
            np.concatenate([agree.gather(o[i]).reshape(-1, *o[i].shape[2:]) for o in outs])[keep]
            for i in range(len(outs[0])))
        hooks.end(run, {})
    except BaseException:
        hooks.close(run, failing=True)
        raise
    hooks.close(run, failing=False)
    return result
