"""What `podkit launch` was asked for (`LaunchConfig`, one field per flag) and its checks: every
bad value is a ConfigError naming the flag and the fix, raised before any process starts."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence

from podkit.errors import ConfigError


@dataclasses.dataclass
class LaunchConfig:
    """What `podkit launch` was asked for; the flags map one to one onto these fields."""

    command: Sequence[str]
    processes: int
    cpu_devices_per_process: int | None = None
    max_restarts: int = 3
    heartbeat_timeout: float = 120.0
    exit_timeout: float = 300.0  # from the end of a process's last loop to its exit
    min_processes: int | None = None  # None: the same as processes (never reshard)
    grow_after: float = 600.0  # a shrunk job's seconds of training before the full count again
    grace: float = 60.0
    backoff: float = 1.0
    backoff_reset: float = 600.0  # an attempt that ran this long starts the doubling anew
    startup_timeout: float | None = None  # None: no bound on the time to the first heartbeat
    stop_timeout: float = 5.0  # SIGTERM -> SIGKILL when stopping the group after a failure
    events_file: str | None = None
    all_output: bool = False  # every process's stdout and library noise, not process 0's only

    def validate(self) -> None:
        """Raise ConfigError naming the bad value and the fix."""
        if not self.command:
            raise ConfigError(
                "no command to launch. Fix: put it after --, e.g. "
                "`podkit launch --processes 2 -- python train.py`."
            )
        if self.processes is None or self.processes < 1:
            raise ConfigError(
                f"--processes {self.processes} must be >= 1; pass the number of processes to "
                "start on this machine, e.g. --processes 2."
            )
        if self.cpu_devices_per_process is not None and self.cpu_devices_per_process < 1:
            raise ConfigError(
                f"--cpu-devices-per-process {self.cpu_devices_per_process} must be >= 1 "
                "(or left out to use the platform's devices)."
            )
        minimum = self.min_processes
        if minimum is not None and not 1 <= minimum <= self.processes:
            raise ConfigError(
                f"--min-processes {minimum} must be between 1 and --processes "
                f"{self.processes}; pass --min-processes {min(max(minimum, 1), self.processes)} "
                "or leave it out (never reshard)."
            )
        if self.max_restarts < 0:
            raise ConfigError(
                f"--max-restarts {self.max_restarts} must be >= 0 (0: never restart)."
            )
        for flag, value in (
            ("--heartbeat-timeout", self.heartbeat_timeout),
            ("--exit-timeout", self.exit_timeout),
            ("--grace", self.grace),
            ("--backoff", self.backoff),
            ("--backoff-reset", self.backoff_reset),
            ("--stop-timeout", self.stop_timeout),
            ("--startup-timeout", self.startup_timeout),
            ("--grow-after", self.grow_after),
        ):
            if value is not None and value != value:  # NaN compares false: it would never fire
                raise ConfigError(f"{flag} nan is not a number of seconds; pass seconds >= 0.")
            if value is not None and value < 0:
                raise ConfigError(f"{flag} {value:g} is negative; pass seconds >= 0.")
        if self.heartbeat_timeout == 0:
            raise ConfigError(
                "--heartbeat-timeout 0 would fail every process at once; pass seconds > 0 "
                "(default 120)."
            )
        if self.exit_timeout == 0:
            raise ConfigError(
                "--exit-timeout 0 would fail every process the moment its training ends; pass "
                "the seconds its work after training may take (default 300)."
            )
        _check_executable(self.command[0])


def _check_executable(program: str) -> None:
    """Fail before starting anything when the command cannot run: no restart loop for a typo."""
    if os.sep in program:
        if not os.path.isfile(program):
            raise ConfigError(f"command {program!r} does not exist; check the path after --.")
        if not os.access(program, os.X_OK):
            raise ConfigError(
                f"command {program!r} is not executable; `chmod +x` it or run it through its "
                "interpreter, e.g. -- python script.py."
            )
    elif shutil.which(program) is None:
        raise ConfigError(
            f"command {program!r} was not found on PATH; check its spelling, activate the "
            "environment that has it, or pass its full path."
        )

