"""The fit loop driven by a fake program and a fake feed, without a model: the order of hook
events, NaN rollback, preemption and resume (podkit.train.loop, hooks, checkpointing)."""

import gc
import os
import signal

import jax
import jax.numpy as jnp
import pytest

from podkit import heartbeat
from podkit.checkpoint import CheckpointManager
from podkit.train import loop
from podkit.train.checkpointing import Checkpointing, Preempted, Saver
from podkit.train.feeds import DataPosition, Execution, Feed
from podkit.train.hooks import History, InFlight, LoopHook
from podkit.train.instruments import HeartbeatHook
from podkit.train.state import TrainState

STEPS = 2  # steps per execution
EXECUTIONS = 4  # executions per epoch


class FakeFeed:
    """EXECUTIONS executions per epoch; execution i of epoch e adds e * 10 + i to the weight.
    `nan_at` makes those (epoch, execution)s give a NaN loss the first time they are read.
    Its iterator state (what a pk.data pipeline would checkpoint) is {"read": executions}."""

    steps_per_epoch = EXECUTIONS * STEPS
    k = STEPS
    global_batch = 1
    batch_nbytes = 64  # batches fed from the host: at most IN_FLIGHT queued

    def __init__(self, nan_at=()):
        self.nan_at = set(nan_at)
        self.start = DataPosition()  # as a resume sets it
        self.source_s = 0.0
        self.resumed, self.closed = [], 0

    def first(self):
        return {"value": 0.0}, None

    def check(self, check):
        pass

    def epoch(self, epoch, more=False):
        first = self.start.execution if epoch == self.start.epoch else 0
        self.start = DataPosition(-1)
        for i in range(first, EXECUTIONS):
            nan = (epoch, i) in self.nan_at
            self.nan_at.discard((epoch, i))
            position = DataPosition(epoch, i + 1, (i + 1) * STEPS, {"read": epoch * 10 + i + 1})
            yield Execution({"value": float(epoch * 10 + i), "nan": nan}, STEPS, 8, position)

    def resume(self, at):
        self.resumed.append((at.epoch, at.execution, at.steps_in_epoch, at.iterator))
        self.start = at

    def close(self):
        self.closed += 1


class FakeProgram:
    """The Program interface over a state of one weight: train adds the input's value."""

    serial = False  # the loop may dispatch the next step before this one ends

    def __init__(self):
        self.trained = []  # the values trained on, in order

    def zeros(self):
        return {"loss": {"total": jnp.zeros(()), "count": jnp.zeros(())}}

    def host_sums(self, sums):  # its sums travel as their tree (a Program's are packed)
        return jax.device_get(sums)

    def sums_tree(self, sums):
        return sums

    def packed_sums(self, tree):
        return tree

    def sums_abstract(self):
        return abstract(self.zeros())

    def results(self, sums):
        return self.tree_results(jax.device_get(sums))

    def tree_results(self, sums):
        return {"loss": float(sums["loss"]["total"]) / max(float(sums["loss"]["count"]), 1.0)}

    def train_cost(self, state, sums, inputs):
        return None  # nothing compiles

    def train(self, state, sums, inputs):
        self.trained.append(inputs["value"])
        loss = jnp.nan if inputs["nan"] else inputs["value"]
        state = state.replace(step=state.step + STEPS,
                              params={"w": state.params["w"] + inputs["value"]})
        return state, {"loss": {"total": sums["loss"]["total"] + loss,
                                "count": sums["loss"]["count"] + 1}}


def initial_state():
    return TrainState(step=jnp.zeros((), jnp.int32), params={"w": jnp.zeros(())},
                      opt_state={}, rest={}, rng=jnp.zeros((2,), jnp.uint32))


def abstract(state):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)


class Recorder(LoopHook):
    def __init__(self, preempt_at_step=None):
        self.events, self.preempt_at_step = [], preempt_at_step

    def begin(self, run):
        self.events.append("begin")

    def epoch_begin(self, run, epoch):
        self.events.append(f"epoch_begin {epoch}")

    def execution_finished(self, run, ex):
        self.events.append(f"finished {ex.step}")

    def after_execution(self, run, ex):
        self.events.append(f"after {ex.step}")
        if ex.step == self.preempt_at_step:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's notice, mid-epoch

    def preemption(self, run):
        self.events.append("preemption")

    def epoch_end(self, run, epoch, logs):
        self.events.append(f"epoch_end {epoch} loss={logs['loss']:g}")

    def end(self, run, logs):
        self.events.append("end")

    def close(self, run, failing):
        self.events.append(f"close failing={failing}")


def checkpointing(directory, epochs, on_nan=None, history=None):
    manager = CheckpointManager(directory, async_save=False)
    return Checkpointing([Saver(manager, every_epoch=True)], manager, None, on_nan,
                         {"fit": {"epochs": epochs}}, history=history)


def fit(program, feed, hooks, epochs=2, state=None):
    state = state if state is not None else initial_state()
    return loop.fit_loop(program, state, feed, hooks, epochs=epochs, abstract=abstract(state))


def test_the_fake_feed_is_a_feed():
    assert isinstance(FakeFeed(), Feed)


def test_events_in_order_and_the_state_returned():
    rec, program = Recorder(), FakeProgram()
    state = fit(program, FakeFeed(), [rec], epochs=2)
    assert int(state.step) == 2 * EXECUTIONS * STEPS
    assert float(state.params["w"]) == sum(range(4)) + sum(range(10, 14))
    # At most IN_FLIGHT executions in flight: the third dispatch retires the first.
    assert rec.events[:7] == ["begin", "epoch_begin 0", "after 2", "after 4", "finished 2",
                              "after 6", "finished 4"]
    assert rec.events[-4:] == ["finished 16", "epoch_end 1 loss=11.5", "end",
                               "close failing=False"]


def test_short_executions_over_staged_data_are_retired_together(monkeypatch):
    monkeypatch.setattr(loop, "QUEUE_S", 60.0)  # no clock in the test: only the count bounds

    class Staged(FakeFeed):
        batch_nbytes = 0  # row ids only: short executions queue up and retire in one wait

    rec = Recorder()
    fit(FakeProgram(), Staged(), [rec], epochs=1)
    # 4 executions, under QUEUE_MAX: none is waited for until the epoch ends
    assert loop.QUEUE_MAX > EXECUTIONS
    assert rec.events[:7] == ["begin", "epoch_begin 0", "after 2", "after 4", "after 6",
                              "after 8", "finished 2"]


def test_a_burst_is_retired_after_one_wait_on_its_newest(monkeypatch):
    monkeypatch.setattr(loop, "QUEUE_S", 60.0)
    monkeypatch.setattr(loop, "QUEUE_MAX", 3)  # the 4th dispatch retires down to 2 queued
    waited = []
    wait = InFlight.wait
    monkeypatch.setattr(InFlight, "wait", lambda self: (waited.append(self.step), wait(self)))

    class Staged(FakeFeed):
        batch_nbytes = 0

    rec = Recorder()
    fit(FakeProgram(), Staged(), [rec], epochs=1)
    assert rec.events[2:10] == ["after 2", "after 4", "after 6", "finished 2", "finished 4",
                                "after 8", "finished 6", "finished 8"]
    # Executions finish in order: the burst of two waited once, on its newest (step 4); the
    # epoch's end waits on the rest.
    assert waited == [4, 6, 8]


def test_the_loop_runs_with_the_older_objects_frozen_for_the_collector():
    seen = []

    class Freeze(LoopHook):
        def begin(self, run):
            seen.append(gc.get_freeze_count())

    assert gc.get_freeze_count() == 0
    fit(FakeProgram(), FakeFeed(), [Freeze()], epochs=1)
    assert seen[0] > 0 and gc.get_freeze_count() == 0  # frozen inside, unfrozen after
    gc.freeze()  # a caller's own freeze is left as it is
    try:
        fit(FakeProgram(), FakeFeed(), [Freeze()], epochs=1)
        assert seen[1] > 0 and gc.get_freeze_count() > 0  # not unfrozen by the loop
    finally:
        gc.unfreeze()


def test_a_failing_loop_closes_its_hooks_and_feed():
    class Boom(LoopHook):
        def after_execution(self, run, ex):
            raise RuntimeError("boom")

    rec, feed = Recorder(), FakeFeed()
    with pytest.raises(RuntimeError, match="boom"):
        fit(FakeProgram(), feed, [rec, Boom()])
    assert rec.events[-1] == "close failing=True" and "end" not in rec.events
    assert feed.closed == 1


def test_nan_rolls_back_to_the_last_checkpoint_and_skips_those_batches(tmp_path):
    program, feed = FakeProgram(), FakeFeed(nan_at={(1, 2)})
    history = History()
    ckpt = checkpointing(tmp_path, epochs=2, on_nan="rollback", history=history)
    with pytest.warns(UserWarning, match="rolled back to step 8"):
        state = fit(program, feed, [ckpt, history_hook(history)], epochs=2)
    # The NaN of execution 2 is seen once it finished (execution 3 was in flight by then);
    # epoch 1 ran again from the epoch-0 checkpoint, without execution 2.
    assert program.trained == [0, 1, 2, 3, 10, 11, 12, 13, 10, 11, 13]
    assert feed.resumed == [(1, 0, 0, {"read": 4})]  # the epoch-0 checkpoint's position
    assert float(state.params["w"]) == 0 + 1 + 2 + 3 + 10 + 11 + 13
    assert int(state.step) == 7 * STEPS
    assert history.epoch == [0, 1]


def history_hook(history):
    """The History callback on the loop's epoch events (what CallbackHook does for fit)."""

    class Hook(LoopHook):
        def begin(self, run):
            history.on_train_begin()

        def epoch_end(self, run, epoch, logs):
            history.on_epoch_end(epoch, logs)

    return Hook()


def test_preemption_saves_stops_and_the_next_run_resumes_there(tmp_path):
    rec, program, feed = Recorder(preempt_at_step=10), FakeProgram(), FakeFeed()
    with pytest.raises(Preempted) as stopped:
        fit(program, feed, [checkpointing(tmp_path, epochs=2), rec], epochs=2)
    # SIGTERM came after the execution that ended at step 10 (the Recorder, listed after
    # checkpointing, ends each execution before it, as fit's callbacks do):
    # every process agrees on that execution (alone: at once), saves there and stops.
    assert stopped.value.code == 0 and stopped.value.step == 10
    assert rec.events[-2:] == ["preemption", "close failing=True"]
    assert [info.step for info in CheckpointManager(tmp_path).steps()][-1] == 10

    rec, program, feed = Recorder(), FakeProgram(), FakeFeed()
    state = fit(program, feed, [rec, checkpointing(tmp_path, epochs=2)], epochs=2)
    assert feed.resumed == [(1, 1, 2, {"read": 11})]
    assert program.trained == [11, 12, 13]  # the rest of epoch 1, nothing twice
    assert int(state.step) == 2 * EXECUTIONS * STEPS
    assert float(state.params["w"]) == sum(range(4)) + sum(range(10, 14))
    assert rec.events.count("epoch_begin 1") == 1


def test_closing_events_go_to_the_hooks_in_reverse():
    """Hooks nest as `with` blocks: the first listed (the heartbeat, in fit) begins first and
    ends and closes last; a hook listed after checkpointing (the callbacks) ends each
    execution and each epoch before it."""
    log = []

    class Named(LoopHook):
        def __init__(self, name):
            self.name = name

        def begin(self, run):
            log.append(f"begin {self.name}")

        def after_execution(self, run, ex):
            if ex.step == STEPS:
                log.append(f"after {self.name}")

        def epoch_end(self, run, epoch, logs):
            log.append(f"epoch_end {self.name}")

        def end(self, run, logs):
            log.append(f"end {self.name}")

        def close(self, run, failing):
            log.append(f"close {self.name}")

    fit(FakeProgram(), FakeFeed(), [Named("outer"), Named("inner")], epochs=1)
    assert log == ["begin outer", "begin inner", "after inner", "after outer",
                   "epoch_end inner", "epoch_end outer", "end inner", "end outer",
                   "close inner", "close outer"]


def test_an_epochs_checkpoint_is_saved_at_its_end_with_what_the_callbacks_did(tmp_path):
    """Saved right after the callbacks' epoch end (History has the epoch), before the next
    epoch begins: a process killed in between still has it."""
    history, saved = History(), []

    class NextEpoch(LoopHook):
        def epoch_begin(self, run, epoch):
            saved.append([i.step for i in CheckpointManager(tmp_path).steps()])

    ckpt = checkpointing(tmp_path, epochs=2, history=history)
    fit(FakeProgram(), FakeFeed(), [NextEpoch(), ckpt, history_hook(history)], epochs=2)
    assert saved == [[], [EXECUTIONS * STEPS]]
    tree = {"state": abstract(initial_state()), "sums": abstract(FakeProgram().zeros())}
    restored = CheckpointManager(tmp_path).restore(tree, step=EXECUTIONS * STEPS)
    assert restored.meta["history"]["epoch"] == [0]
    assert restored.meta["position"] == {"epoch": 1, "execution": 0, "steps_in_epoch": 0}
    assert restored.data_states == [{"read": 4}]


def test_the_final_saves_are_awaited_inside_the_heartbeat_loop(tmp_path, monkeypatch):
    """Waiting for the last checkpoints is part of fit(): `podkit launch` watches beats then,
    and its --exit-timeout counts from the end of the loop, which on_train_end follows."""
    status = tmp_path / "heartbeat"
    monkeypatch.setenv(heartbeat.ENV_HEARTBEAT_FILE, str(status))
    seen = []

    class Watched(CheckpointManager):
        def wait(self):
            if self._thread is not None:  # a save in flight (async)
                seen.append(("wait", heartbeat.read_status(status)["watch"]))
            super().wait()

    class TrainEnd(LoopHook):  # where fit's callbacks are: on_train_end in close()
        def close(self, run, failing):
            if not failing:
                seen.append(("on_train_end", heartbeat.read_status(status)["watch"]))

    def run(directory, *more):
        manager = Watched(directory)
        ckpt = Checkpointing([Saver(manager, every_epoch=True)], manager, None, None,
                             {"fit": {"epochs": 2}})
        fit(FakeProgram(), FakeFeed(), [HeartbeatHook("training"), ckpt, TrainEnd(), *more],
            epochs=2)

    run(tmp_path / "whole")
    assert seen == [("wait", "beats")] * 2 + [("on_train_end", "exit")]

    class Boom(LoopHook):  # fails with epoch 0's save in flight
        def epoch_begin(self, run, epoch):
            if epoch == 1:
                raise RuntimeError("boom")

    seen.clear()
    with pytest.raises(RuntimeError, match="boom"):
        run(tmp_path / "failing", Boom())
    assert seen == [("wait", "beats")]  # the save in flight, awaited inside the loop
