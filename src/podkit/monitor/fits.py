"""fits.jsonl: a line when a fit's loop starts and one when it ends, written by process 0 (the
run directory's), so that the run's records account its wall time across restarts
(podkit.monitor.wall_time).

    start  {"event": "start", "process": "9f3a0c1d", "pid": 4242, "host": "t1v-0",
            "started": 1764841000.12, "started_from": "/proc/self/stat",
            "loop": 1764841006.80, "step": 90, "restore_s": 0.41, "processes": 2,
            "devices": 8, "time": 1764841007.3}       (+ "elastic": podkit.elastic's record
                                                       on a start on fewer processes)
    end    {"event": "end", "process": "9f3a0c1d", "step": 450, "failing": false,
            "time/productive_s": ..., ..., "time": 1764841090.5}

`started`: where this process's part of the run began (podkit.lifetime.run_start: the
process's start under `podkit train` and `podkit launch`, else the fit() call); `loop`: the
loop's timeline's start; the end line's split is the loop's, to its end (the final save's
stall included). A process killed
writes no end line: its last record in metrics.jsonl (or redone.jsonl) is its last sign of
life.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import jax

from podkit import lifetime
from podkit.cluster import is_lead_process
from podkit.train.hooks import LoopHook, LoopRun
from podkit.train.timeline import LABELS


class FitRecorder(LoopHook):
    """The loop hook of a RunDirectory (`RunDirectory.loop_hook()`); after the callbacks in
    the hook list, so that its start line follows the restore and the directory's own
    set-up (on_train_begin), and its end line comes before on_train_end closes the files."""

    def __init__(self, directory: Any) -> None:
        self.directory = directory
        self._begun = False

    def begin(self, run: LoopRun) -> None:
        if not is_lead_process() or run.timeline is None:
            return
        self._begun = True
        timeline = run.timeline
        started, source = lifetime.run_start()
        restore = sum(b - a for a, b in timeline.intervals["restore"])
        line = {"event": "start", "pid": os.getpid(),
                "host": socket.gethostname(), "started": started, "started_from": source,
                "loop": timeline.started_at, "step": self.directory.start_step,
                "restore_s": restore, "processes": jax.process_count(),
                "devices": jax.device_count(), "time": time.time()}
        if getattr(self.directory, "elastic", None):  # a start on fewer processes
            line["elastic"] = self.directory.elastic
        self.directory.write_fit(line)
        if self.directory.start_step == 0:  # a fresh run: nothing before this process
            self.directory.before = {"startup": max(timeline.started_at - started, 0.0)}
            return
        # A resumed run: its account before this fit, read on a thread (a long run's records
        # take a while to parse; the loop does not wait for them).
        threading.Thread(target=self._before, args=(line,), name="podkit-run-account",
                         daemon=True).start()

    def _before(self, line: dict) -> None:
        from podkit.monitor import records

        try:
            wall = records.load(self.directory.path).wall_time()
        except Exception:  # a live figure only: the report computes it again
            return
        if wall is None or not wall.fits or wall.fits[-1].loop != line["loop"]:  # not ours
            return
        parts = dict(wall.parts)
        mine = wall.fits[-1].parts  # this fit's loop so far: its records add it live
        for k in ("productive", *LABELS, "other", "lost"):
            parts[k] -= mine.get(k, 0.0)
        self.directory.before = parts

    def close(self, run: LoopRun, failing: bool) -> None:
        if not self._begun:
            return
        self._begun = False
        timeline = run.timeline
        timeline.window()  # the time since the last log point: the final save, validation
        line = {"event": "end", "step": int(run.step), "failing": failing,
                **{f"time/{k}_s": v for k, v in timeline.totals.items()},
                "time": time.time()}
        self.directory.write_fit(line)
