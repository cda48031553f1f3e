"""A JAX profiler trace of chosen steps: `fit(profile_steps="10:20", run_dir=...)`, or
`podkit train CONFIG --profile-steps 10:20`.

The trace starts before the execution that runs step A (steps count from 1, as metrics.jsonl
counts them) and stops once the execution that runs step B finished, so with
steps_per_execution k it covers whole executions. It is written under `RUN_DIR/profile/`
(`plugins/profile/<time>/*.xplane.pb`): `tensorboard --logdir RUN_DIR` shows it in the
profile tab (the tensorboard-plugin-profile / xprof package), and Perfetto
(ui.perfetto.dev) opens the trace too. Only process 0 traces on several processes.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import jax

from podkit.errors import ConfigError
from podkit.train.hooks import LoopHook, LoopRun


def parse_profile_steps(value: Any, run_dir: Any) -> tuple[int, int] | None:
    """"10:20" or (10, 20) -> (10, 20); None -> None; anything else a ConfigError."""
    if value is None:
        return None
    try:
        if isinstance(value, str):
            first, last = (int(part) for part in value.split(":"))
        else:
            first, last = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"profile_steps={value!r}: pass \"A:B\" or (A, B), the first and "
                          "last step to trace (steps count from 1).") from None
    if not 1 <= first <= last:
        raise ConfigError(f"profile_steps={value!r}: need 1 <= first <= last.")
    if run_dir is None:
        raise ConfigError("profile_steps needs a run directory to write the trace to: "
                          "fit(..., run_dir=PATH).")
    return first, last


class ProfileSteps(LoopHook):
    """Starts and stops the JAX profiler around steps [first, last] of a fit."""

    def __init__(self, first: int, last: int, run_dir: str | os.PathLike) -> None:
        self.first, self.last = first, last
        self.path = Path(run_dir) / "profile"
        self.active = False
        self.done = False

    def before_execution(self, run: LoopRun) -> None:
        # The next execution runs steps run.step + 1 ... : start once it reaches `first`.
        if self.done or self.active or jax.process_index() != 0:
            return
        if run.step + run.feed.k >= self.first and run.step < self.last:
            self.path.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.path))
            self.active = True

    def execution_finished(self, run: LoopRun, ex: Any) -> None:
        if self.active and ex.step >= self.last:
            self._stop()

    def close(self, run: LoopRun, failing: bool) -> None:
        if self.active:
            self._stop()
        elif not self.done and not failing and jax.process_index() == 0:
            warnings.warn(f"profile_steps {self.first}:{self.last}: the fit ended at step "
                          f"{run.step} before step {self.first}; no profile was written. "
                          "Choose steps the run reaches.", stacklevel=2)

    def _stop(self) -> None:
        jax.profiler.stop_trace()
        self.active, self.done = False, True
        print(f"podkit: profile of steps {self.first}-{self.last} written under {self.path} "
              f"(tensorboard --logdir {self.path.parent}, Profile tab)", file=sys.stderr)
