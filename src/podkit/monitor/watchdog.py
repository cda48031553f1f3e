"""The hang watchdog: when no step completes for `limit_s`, this process writes every thread's
Python stack and its last completed step to the run directory and the log.

    fit(..., watchdog=600)          # seconds; None turns it off

A thread ("podkit-watchdog") looks once a second at the time of the last completed execution
(or the loop's start, or the end of a validation: progress the loop reports). Past the limit it
writes `watchdog-p{process}.txt` into the run directory (with fit(run_dir=...); else only the
log, stderr): what stalled, since when, the last completed step, then faulthandler's dump of
every thread. Once per stall: it arms again when a step completes. Under `podkit launch` it
also puts the stall into the heartbeat status, and the launcher names the process.

The first execution compiles: the clock starts when it finished, so a long first compile is
not a hang (the launcher's --startup-timeout and heartbeat watch that time).
"""

from __future__ import annotations

import faulthandler
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from podkit import heartbeat
from podkit.errors import ConfigError
from podkit.train.hooks import LoopHook, LoopRun

DEFAULT_LIMIT_S = 600.0
POLL_S = 1.0


def check_limit(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value <= 0:
        raise ConfigError(f"watchdog={value!r}: pass the seconds without a completed step "
                          "after which every thread's stack is written (> 0), or None.")
    return float(value)


class Watchdog(LoopHook):
    """fit()'s watchdog (see the module docstring)."""

    def __init__(self, limit_s: float, run_dir: str | os.PathLike | None = None,
                 process: int = 0, stream: Any = None) -> None:
        self.limit_s, self.process = limit_s, process
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.stream = stream
        self.dumps: list[Path | None] = []  # what each stall wrote (None: the log only)
        self._last = time.monotonic()
        self._step = self._dispatched = 0
        self._armed = False  # the first execution finished (compiled)
        self._fired = False
        # The loop's thread notes progress while the polling thread checks: without the lock a
        # check that read the old time could fire again just after progress re-armed it.
        self._lock = threading.Lock()

    # -- the loop's side ---------------------------------------------------------------------
    def begin(self, run: LoopRun) -> None:
        self._step, self._last = run.step, time.monotonic()
        _watching(self, True)

    def execution_finished(self, run: LoopRun, ex: Any) -> None:
        self._progress(ex.step)

    def after_execution(self, run: LoopRun, ex: Any) -> None:
        self._dispatched = run.step  # up to 2 executions run ahead of the finished ones

    def epoch_end(self, run: LoopRun, epoch: int, logs: dict) -> None:
        self._progress(run.step)  # a validation that ran is progress too

    def close(self, run: LoopRun, failing: bool) -> None:
        _watching(self, False)

    def _progress(self, step: int) -> None:
        with self._lock:
            self._last, self._step, self._armed = time.monotonic(), step, True
            if self._fired:
                self._fired = False
                heartbeat.report_stall(None)

    # -- the thread's side -------------------------------------------------------------------
    def check(self) -> None:
        """Called by the polling thread: dump once when the limit passed."""
        with self._lock:  # held through the dump: progress then clears the stall it reported
            silent = time.monotonic() - self._last
            if self._armed and not self._fired and silent > self.limit_s:
                self._fired = True
                self.dump(silent)

    def dump(self, silent: float) -> Path | None:
        """Write the stall's report (header and every thread's stack); returns its file."""
        first = (f"podkit watchdog: no step completed for {silent:.0f} s (limit "
                 f"{self.limit_s:g} s) in process {self.process}, pid {os.getpid()}; the last "
                 f"completed step is {self._step}"
                 + (f" (steps up to {self._dispatched} were dispatched)"
                    if self._dispatched > self._step else ""))
        main = threading.main_thread().ident or 0
        header = (f"{first}.\nEvery thread's Python stack follows, the current thread (the "
                  f"watchdog's) first; the main thread, Thread 0x{main:016x}, shows where "
                  "the loop waits.\n\n")
        target = None
        if self.run_dir is not None:
            target = self.run_dir / f"watchdog-p{self.process}.txt"
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "w", encoding="utf-8") as f:
                    f.write(header)
                    f.flush()
                    faulthandler.dump_traceback(f, all_threads=True)
            except OSError:
                target = None
        stream = self.stream or sys.stderr
        where = f"; every thread's stack is in {target}" if target else ""
        stream.write(first + where + ".\n")
        if target is None:
            stream.write(_stacks())
        stream.flush()
        self.dumps.append(target)
        heartbeat.report_stall({"step": self._step, "silent_s": round(silent, 1),
                                "file": str(target) if target else None})
        return target


# One polling thread per process for every open watchdog (a thread per fit() would cost its
# start on every call).
_active: set[Watchdog] = set()
_lock = threading.Lock()
_pid: int | None = None


def _watching(dog: Watchdog, on: bool) -> None:
    global _pid
    with _lock:
        if on:
            _active.add(dog)
        else:
            _active.discard(dog)
        if on and _pid != os.getpid():
            _pid = os.getpid()
            threading.Thread(target=_poll, name="podkit-watchdog", daemon=True).start()


def _poll() -> None:
    while True:
        time.sleep(POLL_S)
        with _lock:
            dogs = list(_active)
        for dog in dogs:
            dog.check()


def _stacks() -> str:
    """Every thread's stack as text (faulthandler writes to a real file only)."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()

