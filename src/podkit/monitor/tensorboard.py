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
    goodput/goodput, goodput/<productive|compile|restore|checkpoint|input|validation|other>_s
                                      this fit's loop (podkit.train.timeline)
    goodput_run/goodput, goodput_run/<part>_s
                                      the whole run so far, across its restarts: the parts
                                      above and startup, lost, down, idle
                                      (podkit.monitor.wall_time)
    compile/count, compile/seconds, compile/recompiles
    checkpoint/seconds
    memory/in_use_gib, memory/peak_gib, memory/limit_gib   (where the platform reports it)
"""

from __future__ import annotations

import concurrent.futures
import os
import time
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
    "run_goodput": "goodput_run/goodput",
    "compiles": "compile/count",
    "compile_s": "compile/seconds",
    "recompiles": "compile/recompiles",
    "checkpoint_s": "checkpoint/seconds",
    "memory_in_use_gib": "memory/in_use_gib",
    "memory_peak_gib": "memory/peak_gib",
    "memory_limit_gib": "memory/limit_gib",
}
NOT_SCALARS = {"step", "epoch", "time", "memory"}
FLUSH_S = 10.0  # the file is flushed at least this often, and at validations and the end


def tag_of(key: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key."""
    if key in TAGS:
        return TAGS[key]
    if key.startswith("time/"):
        return "goodput/" + key.removeprefix("time/")
    if key.startswith("run_time/"):
        return "goodput_run/" + key.removeprefix("run_time/")
    return "train/" + key


class RunEvents:
    """The event files of one run directory (see the module docstring). One event per log
    point holds all its scalars, written in the caller's thread by tensorboardX's plain
    record writer (its SummaryWriter hands each scalar to a multiprocessing queue: ~0.2 ms
    apiece, more than a small model's step)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        self._writer = EventsWriter(os.path.join(self.path, "events"))
        self._last_flush = time.monotonic()
        # tensorboardX's flush fsyncs the file (~1.5 ms): at an epoch's end that sat between
        # its last execution and the next epoch's dispatch, with the devices idle. The flushes
        # run on a thread of their own instead (EventsWriter locks its writes and flushes).
        self._flusher = concurrent.futures.ThreadPoolExecutor(1, "podkit-tensorboard")

    def _write(self, step: int, values: dict[str, float]) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        if not values:
            return
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=v)
                                 for tag, v in values.items()])
        self._writer.write_event(Event(wall_time=time.time(), step=int(step), summary=summary))
        if time.monotonic() - self._last_flush > FLUSH_S:
            self.flush()

    def log_point(self, step: int, record: dict[str, Any]) -> None:
        self._write(step, {tag_of(k): float(v) for k, v in record.items()
                           if k not in NOT_SCALARS and isinstance(v, int | float)
                           and not isinstance(v, bool)})

    def validation(self, step: int, logs: dict[str, Any]) -> None:
        self._write(step, {"validation/" + k.removeprefix("val_"): float(v)
                           for k, v in logs.items()
                           if k.startswith("val_") and isinstance(v, int | float)})
        self.flush()

    def flush(self) -> None:
        """Write what is buffered to the file, soon (on the flush thread)."""
        self._flusher.submit(self._writer.flush)
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and close the file, waiting for both."""
        self._flusher.shutdown(wait=True)
        self._writer.close()
