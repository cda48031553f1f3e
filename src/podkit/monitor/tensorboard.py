"""TensorBoard event files of a run directory (`runs/<name>/tensorboard/`), written with
tensorboardX (no TensorFlow needed): what metrics.jsonl holds, as scalars by step.

    writer = RunEvents(run_dir / "tensorboard")
    writer.log_point(step, record)          # a metrics.jsonl record of a log point
    writer.validation(step, {"val_loss": 0.3})
    writer.close()

Tags, grouped as TensorBoard shows them (one card per group):

    train/<loss or metric>            the window's mean since the previous log point
    validation/<loss or metric>       at each validation
    optimizer/learning_rate, optimizer/grad_norm
    throughput/samples_per_s, throughput/tokens_per_s, throughput/step_time_s, throughput/mfu
    idle/device_idle, idle/input_wait
    goodput/goodput, goodput/<productive|compile|checkpoint|input|validation|other>_s
    compile/count, compile/seconds, compile/recompiles
    checkpoint/seconds
    memory/in_use_gib, memory/peak_gib, memory/limit_gib   (where the platform reports it)
"""

from __future__ import annotations

import os
from typing import Any

# metrics.jsonl key -> tag, for everything that is not a loss or metric.
TAGS = {
    "learning_rate": "optimizer/learning_rate",
    "grad_norm": "optimizer/grad_norm",
    "samples_per_s": "throughput/samples_per_s",
    "tokens_per_s": "throughput/tokens_per_s",
    "step_time_s": "throughput/step_time_s",
    "mfu": "throughput/mfu",
    "device_idle": "idle/device_idle",
    "input_wait": "idle/input_wait",
    "goodput": "goodput/goodput",
    "compiles": "compile/count",
    "compile_s": "compile/seconds",
    "recompiles": "compile/recompiles",
    "checkpoint_s": "checkpoint/seconds",
    "memory_in_use_gib": "memory/in_use_gib",
    "memory_peak_gib": "memory/peak_gib",
    "memory_limit_gib": "memory/limit_gib",
}
NOT_SCALARS = {"step", "epoch", "time", "memory"}


def tag_of(key: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key."""
    if key in TAGS:
        return TAGS[key]
    if key.startswith("time/"):
        return "goodput/" + key.removeprefix("time/")
    return "train/" + key


class RunEvents:
    """The event files of one run directory (see the module docstring)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from tensorboardX import SummaryWriter

        self.path = os.fspath(path)
        self._writer = SummaryWriter(self.path, flush_secs=10)

    def log_point(self, step: int, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key in NOT_SCALARS or not isinstance(value, int | float) or isinstance(
                    value, bool):
                continue
            self._writer.add_scalar(tag_of(key), float(value), step)

    def validation(self, step: int, logs: dict[str, Any]) -> None:
        for key, value in logs.items():
            if key.startswith("val_") and isinstance(value, int | float):
                self._writer.add_scalar("validation/" + key.removeprefix("val_"),
                                        float(value), step)
        self._writer.flush()

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
