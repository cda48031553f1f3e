"""The loop's side of checkpoints: where a fit starts, when it saves, preemption, NaN losses.

Resume order, decided here and nowhere else (`Checkpointing.start`):
  1. the newest valid checkpoint of the run's own manager (fit(checkpoint=...),
     BackupAndRestore, `[checkpoint]` of a config) when it is ahead of the model;
  2. else an explicit `resume=PATH` (a checkpoint directory, or one step directory in it);
  3. else a fresh start.

A checkpoint holds, besides the TrainState, the epoch's running metric sums (so a resumed
epoch reports the same loss as an uninterrupted one), the position in the data, the History
so far and the run's config. Saves happen at execution boundaries, never inside one.

Preemption: SIGTERM during fit() makes every process save at the same execution and leave
with exit status 0 (`Preempted`, a SystemExit). `podkit.termination.Preemptible` turns SIGTERM
into that notice while the fit runs and picks the execution (with several processes, through
the coordination service). A SIGTERM that arrives after the last execution is obeyed once the
final saves are committed: exit status 143, as anywhere outside training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podkit import agree, jobenv, termination
from podkit.checkpoint import tiers
from podkit.checkpoint.manager import CheckpointManager
from podkit.errors import ConfigError, InputError, TrainingError
from podkit.train import state as state_lib
from podkit.train.feeds import DataPosition, Feed
from podkit.train.hooks import InFlight, LoopHook, LoopRun
from podkit.train.step import STEP_SUMS

ON_NAN = (None, "stop", "rollback")
# What a checkpoint of an older podkit may lack: the train step's own sums (gradient norm and
# learning rate, added with the run telemetry) start from zero then.
OPTIONAL = (f"sums.{STEP_SUMS}.",)
AGREE_EVERY = 16  # executions between agreements on a time-based save (several processes)


class Preempted(SystemExit):
    """Raised out of fit() after the final checkpoint of a preempted run: exit status 0 (or
    $PODKIT_PREEMPTED_EXIT_CODE)."""

    def __init__(self, step: int, directory: str) -> None:
        # 0, unless the job's manifest asks for another status (a Kubernetes Job counts a pod
        # that exits 0 as done: `podkit submit k8s` sets one its failure policy restarts on).
        super().__init__(jobenv.preempted_exit_code())
        self.step, self.directory = step, directory

    def __str__(self) -> str:
        return f"preempted at step {self.step}; checkpoint saved in {self.directory}"


@dataclasses.dataclass
class Saver:
    """One manager and what makes it save: its own schedule, every epoch end, or a request
    from a callback (ModelCheckpoint's best-only)."""

    manager: CheckpointManager
    every_epoch: bool = False
    requested: bool = False
    best_only: bool = False  # saves only what a callback judged better (not on preemption)
    resumes: bool = False  # the run's own manager: fit resumes from it (BackupAndRestore)


class Rollback(Exception):
    """The loop's signal to restart from the last checkpoint (on_nan="rollback"):
    `bad.source.rollback(abstract, feed, bad)` gives the (state, position, sums) to restart
    from."""

    def __init__(self, epoch: int, execution: int, step: int, source: Any = None) -> None:
        super().__init__(epoch, execution, step)
        self.epoch, self.execution, self.step, self.source = epoch, execution, step, source


def for_fit(checkpoint: Any, resume: Any, on_nan: str | None, callbacks: Any, history: Any,
            meta: dict[str, Any]) -> Checkpointing | None:
    """The checkpointing of one fit(): fit(checkpoint=...) and every callback that saves
    checkpoints (`Callback.checkpoint_saver`: ModelCheckpoint, BackupAndRestore); None when
    the fit neither saves, resumes nor watches for NaN."""
    savers, own, final = [], None, True
    if checkpoint is not None:
        own = CheckpointManager.coerce(checkpoint)
        scheduled = own.every_steps is not None or own.every_seconds is not None
        savers.append(Saver(own, every_epoch=not scheduled))
    for cb in callbacks:
        saver = cb.checkpoint_saver()
        if saver is None:
            continue
        if saver.resumes:
            if own is not None:
                raise ConfigError("fit(checkpoint=...) and BackupAndRestore both say where "
                                  "to resume from; use one of them.")
            own, final = saver.manager, False
        savers.append(saver)
    if not savers and resume is None and on_nan is None:
        return None
    return Checkpointing(savers, own, resume, on_nan, meta, final_save=final, history=history)


class Checkpointing(LoopHook):
    """Saves and resumes for one fit() call (see the module docstring), as a hook of its loop:

    begin               watch for preemption, restore (the resume order above)
    execution_finished  on_nan: stop, or roll back (raises Rollback)
    after_execution     the saves that are due; a preemption agreed here saves and stops
    epoch_end           the epoch's saves, at once; listed before the callbacks, it ends the
                        epoch after them (History, ModelCheckpoint's request, a learning rate
                        set are in the checkpoint)
    end, close          the final save; wait for saves in flight
    """

    def __init__(self, savers: list[Saver], resume_from: CheckpointManager | None,
                 explicit: Any, on_nan: str | None, meta: dict[str, Any],
                 final_save: bool = True, history: Any = None) -> None:
        if on_nan not in ON_NAN:
            raise ConfigError(f"on_nan={on_nan!r}: use None, 'stop' or 'rollback'.")
        if on_nan == "rollback" and resume_from is None:
            raise ConfigError("on_nan='rollback' rolls back to the last checkpoint: pass "
                              "fit(checkpoint=DIR) (or BackupAndRestore) too.")
        self.savers, self.resume_from, self.explicit = savers, resume_from, explicit
        self.on_nan, self.meta, self.final_save = on_nan, meta, final_save
        self.history = history  # the History callback, saved with the state
        self.skip: set[tuple[int, int]] = set()  # (epoch, execution) left out after a rollback
        self._preemption: termination.Preemptible | None = None
        self._executions = 0  # this call's executions, the same count on every process
        self._restored_history: tuple[dict, list] | None = None
        self.resumed_step: int | None = None
        self.resumed_tier = "persistent"  # or "local": the persistent tier lacks that step
        self._timeline: Any = None  # the loop's (podkit.train.timeline), from begin()
        # The loop's Program.sums_tree, from begin() (every save comes after it): the packed
        # sums -> the tree a checkpoint keeps.
        self._sums_tree: Callable[[Any], Any] | None = None

    @property
    def active(self) -> bool:
        return bool(self.savers) or self.on_nan is not None

    def step_intervals(self) -> tuple[tuple[str, int], ...]:
        """(what it is, steps) of the managers' `every_steps` and their local tiers'
        `local_every_steps`: saves fall between executions, so steps_per_execution="auto"
        chooses a count that divides them."""
        return tuple((name, every) for s in self.savers for name, every in (
            ("the checkpoints' every_steps", s.manager.every_steps),
            ("the local tier's local_every_steps", s.manager.local
             and s.manager.local.every_steps)) if every)

    # -- start -------------------------------------------------------------------------------
    def start(self, state: Any, abstract: Any, feed: Feed) -> tuple[Any, DataPosition, Any]:
        """(state, position, sums or None) to begin with, by the resume order above."""
        restored = None
        current = state_lib.step_of(state)  # a fresh state still being made: 0, no wait
        if self.resume_from is not None:
            restored, self.resumed_tier = tiers.restore_newest(self.resume_from, abstract,
                                                               optional=OPTIONAL)
            if restored is not None and restored.step <= current:
                restored = None  # this model is already there (a second fit() in a session)
        if restored is None and self.explicit is not None:
            restored = _explicit(self.explicit, abstract)
        if restored is None:
            return state, DataPosition(), None
        return self._adopt(restored, feed)

    def _adopt(self, restored: Any, feed: Feed) -> tuple[Any, DataPosition, Any]:
        from podkit.cluster import is_lead_process

        pos = DataPosition.from_checkpoint(restored.meta["position"], restored.data_states)
        epochs = self.meta.get("fit", {}).get("epochs")
        if not is_lead_process():
            pass
        elif epochs is not None and pos.epoch >= epochs:
            print(f"podkit: checkpoint step {restored.step} is the end of this run ({epochs} "
                  "epochs done): nothing left to train. To train again, use a new run "
                  "directory (run.name) or delete its checkpoints.", flush=True)
        else:
            print(f"podkit: resuming from checkpoint step {restored.step} (epoch {pos.epoch + 1},"
                  f" {pos.steps_in_epoch} steps into it)", flush=True)
            jobenv.record("resumed", step=restored.step)
        feed.resume(pos)
        hist = restored.meta.get("history") or {}
        self._restored_history = (hist.get("history", {}), hist.get("epoch", []))
        self.resumed_step = restored.step
        self.skip |= {tuple(s) for s in restored.meta.get("skip", [])}
        return restored.tree["state"], pos, restored.tree["sums"]

    def watch_preemption(self) -> None:
        """The fit has begun: with savers, SIGTERM from now on is a preemption (a final save
        at a step every process reaches), until close()."""
        if self.savers and self._preemption is None:
            self._preemption = termination.Preemptible()
            self._preemption.open()

    # -- the loop's hook ---------------------------------------------------------------------
    def _clock(self, label: str = "checkpoint") -> Any:
        """The loop's time blocked on checkpoints ("restore": reading the one it resumes
        from), for its timeline (goodput)."""
        timeline = self._timeline
        return timeline.host(label) if timeline is not None else contextlib.nullcontext()

    def begin(self, run: LoopRun) -> None:
        self._timeline = run.timeline
        self.watch_preemption()  # from here to close(), SIGTERM saves instead of exiting
        self._sums_tree = run.program.sums_tree  # checkpoints keep the sums' tree
        with self._clock("restore"):
            state, resumed, sums = self.start(run.cell.value, run.abstract, run.feed)
        run.cell.value, run.skip = state, self.skip
        run.sums = None if sums is None else run.program.packed_sums(sums)
        if self.resumed_step is not None:
            run.position = resumed
        if self._restored_history is not None and self.history is not None:
            self.history.start_from(*self._restored_history)  # History begins from it

    def execution_finished(self, run: LoopRun, ex: InFlight) -> None:
        if self.on_nan is not None:
            self.check_loss(run.program.host_sums(ex.sums), ex.epoch, ex.execution,
                            ex.first_step, ex.step)

    def after_execution(self, run: LoopRun, ex: InFlight) -> None:
        def check() -> None:  # the losses still in flight: a NaN state is never saved
            for entry in run.inflight:
                self.execution_finished(run, entry)

        run.preempted = self._after_execution(run.cell.value, ex.sums, ex.position, ex.step,
                                              ex.first_step, check)

    def preemption(self, run: LoopRun) -> None:
        from podkit.cluster import is_lead_process

        if is_lead_process():
            print(f"podkit: {run.preempted}; exiting with status {run.preempted.code}", flush=True)
            # A job script decides from this whether to requeue (podkit submit slurm).
            jobenv.record("preempted", step=run.preempted.step,
                          checkpoints=str(run.preempted.directory))

    def epoch_end(self, run: LoopRun, epoch: int, logs: dict) -> None:
        self.at_epoch_end(run.cell.value, run.program.zeros(), run.reached, run.step)

    def end(self, run: LoopRun, logs: dict) -> None:
        self.at_train_end(run.cell.value, run.program.zeros(), run.reached, run.step)

    def close(self, run: LoopRun | None = None, failing: bool = False) -> None:
        """SIGTERM ends the process again; let saves in flight finish (also when the fit is
        failing or interrupted: a save that started is worth committing, and a process that
        exits under Orbax's writer thread only leaves noise)."""
        late = False
        if self._preemption is not None:
            self._preemption.close()
            late = self._preemption.received.is_set()  # after the last execution: not lost
            self._preemption = None
        for saver in self.savers:
            try:
                saver.manager.wait()
            except Exception as e:  # the fit's own error wins
                if not failing:
                    raise
                import warnings

                warnings.warn(f"podkit: the checkpoint in flight did not commit: {e}",
                              stacklevel=2)
        if late and not failing:  # the final state is saved: now obey it
            raise termination.terminate(
                f"SIGTERM arrived after the last step; the saves are committed: exiting with "
                f"status {termination.EXIT_CODE}")

    # -- during ------------------------------------------------------------------------------
    def _after_execution(self, state: Any, sums: Any, pos: DataPosition, step: int,
                         previous_step: int,
                         check: Callable[[], Any] | None = None) -> Preempted | None:
        """After each execution is dispatched: saves that are due, and preemption (returned
        once every save is committed). `check` looks at the losses still in flight, so a NaN
        state is never saved."""
        self._executions += 1
        if not self.savers:
            return None
        preempted = self._preempted()
        due = [s for s in self.savers if (preempted and not s.best_only)
               or self._due(s.manager, step, previous_step)]
        # The local tier's saves, where no persistent one is due (it holds the same step).
        local = [s.manager for s in self.savers if s not in due and s.manager.local is not None
                 and not preempted and s.manager.local.due(step, previous_step)]
        if (due or local) and check is not None and self.on_nan is not None:
            check()
        for saver in due:
            self._save(saver.manager, state, sums, pos, step)
        for manager in local:
            self._save(manager, state, sums, pos, step, tier=manager.local)
        if not preempted:
            return None
        for saver in self.savers:
            saver.manager.wait()
        return Preempted(step, self.savers[0].manager.directory)

    def _preempted(self) -> bool:
        return self._preemption is not None and self._preemption.reached(self._executions)

    def _due(self, manager: CheckpointManager, step: int, previous_step: int) -> bool:
        if manager.due_by_steps(step, previous_step):
            return True
        if jax.process_count() == 1 or manager.every_seconds is None:
            return manager.due_by_time()
        # Clocks differ between processes: process 0 decides, every AGREE_EVERY executions
        # (a broadcast is a host round trip; once per execution would stall the pipeline).
        if self._executions % AGREE_EVERY:
            return False
        return agree.process0_decides(bool(manager.due_by_time()))

    def at_epoch_end(self, state: Any, zeros: Any, pos: DataPosition, step: int) -> None:
        """After on_epoch_end (`pos`: the next epoch's start): the epochs' savers and the
        callbacks' requests."""
        for saver in self.savers:
            if saver.every_epoch or saver.requested:
                saver.requested = False
                self._save(saver.manager, state, zeros, pos, step)

    def at_train_end(self, state: Any, zeros: Any, pos: DataPosition, step: int) -> None:
        """The run's own manager ends on the final state; every save is committed."""
        manager = self.resume_from if self.final_save else None
        resumed = self.resumed_step if self.resumed_tier == "persistent" else None
        if manager is not None and step not in (manager.last_requested, resumed):
            self._save(manager, state, zeros, pos, step)
        with self._clock():
            for saver in self.savers:
                saver.manager.wait()

    def _save(self, manager: CheckpointManager, state: Any, sums: Any, pos: DataPosition,
              step: int, tier: Any = None) -> None:
        """A save of `manager`'s persistent tier, or of its local tier (`tier`)."""
        target = tier or manager
        if step == target.last_requested or (manager is self.resume_from
                                            and step == self.resumed_step
                                            and (tier is None) == (self.resumed_tier
                                                                   == "persistent")):
            return  # this step is there already: never rewrite a committed checkpoint
        with self._clock():
            if tier is None:
                for saver in self.savers:  # one save in flight across managers
                    saver.manager.wait()
            history = self.history
            meta = dict(self.meta, position=pos.stored(), skip=sorted(self.skip),
                        history={"history": history.history, "epoch": history.epoch}
                        if history is not None else {})
            target.save(step, {"state": state, "sums": self._sums_tree(sums)},
                        meta=meta, data_state=pos.iterator)

    # -- NaN ---------------------------------------------------------------------------------
    def check_loss(self, sums: dict, epoch: int, execution: int, first_step: int,
                   last_step: int) -> None:
        """Called with an execution's sums (their tree, on the host) once it finished."""
        if self.on_nan is None:
            return
        loss = float(np.asarray(sums["loss"]["total"]))
        if math.isfinite(loss):
            return
        where = (f"step {last_step}" if last_step - first_step <= 1 else
                 f"steps {first_step + 1}-{last_step}")
        if self.on_nan == "stop":
            raise TrainingError(
                f"the loss became {loss} at {where} (epoch {epoch + 1}, execution "
                f"{execution}). Lower the learning rate, check the inputs for NaN/Inf, or pass "
                "on_nan='rollback' with a checkpoint to skip these batches.")
        raise Rollback(epoch, execution, last_step, source=self)

    def rollback(self, abstract: Any, feed: Feed, bad: Rollback) -> tuple[Any, DataPosition, Any]:
        """The newest valid checkpoint, with the offending execution left out from now on."""
        manager = self.resume_from
        manager.wait()
        restored, _ = tiers.restore_newest(manager, abstract, optional=OPTIONAL)
        if restored is None:
            raise TrainingError(
                f"the loss became NaN/Inf at step {bad.step} and {manager.directory} holds no "
                "checkpoint to roll back to yet; save more often (every_steps) or lower the "
                "learning rate.")
        if (bad.epoch, bad.execution) in self.skip:
            raise TrainingError(f"rolled back to step {restored.step} and the loss is NaN/Inf "
                                f"again at step {bad.step}; the state itself is bad.")
        self.skip.add((bad.epoch, bad.execution))
        import warnings

        warnings.warn(f"podkit: the loss became NaN/Inf at step {bad.step}; rolled back to "
                      f"step {restored.step} and skipping those batches (epoch "
                      f"{bad.epoch + 1}, execution {bad.execution}).", stacklevel=2)
        state, pos, sums = self._adopt(restored, feed)
        if self.history is not None:
            self.history.history, self.history.epoch = self._restored_history
        return state, pos, sums


def _explicit(path: Any, abstract: Any) -> Any:
    """`resume=PATH`: a checkpoint directory (its newest valid step) or a step directory."""
    from podkit.checkpoint import format as fmt

    text = os.fspath(path).rstrip("/")
    head, _, tail = text.rpartition("/")
    step = fmt.parse_step(tail)
    manager = CheckpointManager(head if step is not None and head else text)
    restored = manager.restore(abstract, step=step, optional=OPTIONAL)
    if restored is None:
        raise InputError(f"resume={text!r} holds no valid checkpoint (see `podkit checkpoint "
                         f"ls {text}`); pass a directory that does, or drop resume.")
    return restored
