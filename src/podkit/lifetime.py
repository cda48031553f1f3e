"""When this process started, as Unix time: where a run's startup begins (goodput across
restarts, podkit.monitor.wall_time).

    started, source = lifetime.process_start()    # (1764841000.12, "/proc/self/stat")

The kernel's own record is the earliest honest one: /proc/self/stat's starttime (clock ticks
since boot, on the boot clock) is when the process was created, so it includes the
interpreter's start and every import that ran before podkit's (a user's `import torch`, say),
which a time taken at podkit's import would leave out. It is turned into Unix time against
CLOCK_BOOTTIME read now (not /proc/stat's btime, a whole second, which would put the start up
to a second off); it is known to one clock tick (10 ms at the usual CLK_TCK of 100, rounded
down). Where there is no /proc (macOS), the time podkit was imported stands in: `import
podkit` imports this module first.
"""

from __future__ import annotations

import os
import time

IMPORTED = time.time()
"""Unix time podkit was imported (the fallback where the kernel's record cannot be read)."""

_cached: tuple[float, str] | None = None
_for_run = False  # the process was started to run the job (the CLI, the launcher's children)
_fit_called: float | None = None  # when this process's latest fit() was called


def started_for_run() -> None:
    """Say that this process was started to run the job (`podkit train` does): its start is
    the run's, imports and data preparation before fit() included."""
    global _for_run
    _for_run = True


def fit_called() -> None:
    """Note that fit() was called now (Trainer.fit's first line)."""
    global _fit_called
    _fit_called = time.time()


def run_start() -> tuple[float, str]:
    """Where this process's part of a run begins, as (Unix time, what it is): the process's
    start where the process was started for the run (`started_for_run`, or a child of `podkit
    launch`); else the latest fit() call: a notebook or a test runner may have started hours
    before, doing other things, and none of that is the run's startup."""
    if _for_run or os.environ.get("PODKIT_LAUNCH_ID") or _fit_called is None:
        return process_start()
    return _fit_called, "fit() called"


def process_start() -> tuple[float, str]:
    """(Unix time this process started, where that figure came from: "/proc/self/stat" or
    "podkit import")."""
    global _cached
    if _cached is None:
        _cached = _read()
    return _cached


def _read() -> tuple[float, str]:
    try:
        with open("/proc/self/stat") as f:
            text = f.read()
        # The fields after the command name, which may itself hold spaces and parentheses.
        fields = text.rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime (fields here start at field 3)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        now = time.time()
        if 0.0 <= age < now:  # a sane age (a container's odd clocks: the fallback)
            return now - age, "/proc/self/stat"
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return IMPORTED, "podkit import"


def _forget_in_child() -> None:
    """A forked child is a process of its own: it reads its own start again."""
    global _cached, _for_run, _fit_called
    _cached, _for_run, _fit_called = None, False, None


os.register_at_fork(after_in_child=_forget_in_child)
