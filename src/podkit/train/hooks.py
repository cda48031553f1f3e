"""Callbacks (Keras's name for hooks): side effects of the loop, each at its own interval.

The loop calls `on_log` at its log points with metrics it already fetched (one execution
late, so the host never waits for the device just to report).
"""

from __future__ import annotations

import json
import os
from typing import Any


class Callback:
    """Base class: override the events you need. `model` is set by fit()."""

    model: Any = None

    def on_train_begin(self, logs: dict | None = None) -> None: ...
    def on_train_end(self, logs: dict | None = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None: ...

    def on_log(self, step: int, logs: dict) -> None:
        """At each log point: `logs` has the epoch's running means (`loss`, metrics), the
        window's means (`window/loss`, ...), `samples_per_s`, `epoch`, `steps_in_epoch`."""


class History(Callback):
    """Per-epoch means, as Keras's History: `history.history["loss"][epoch]`."""

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            if key == "step":  # a position, not a metric
                continue
            self.history.setdefault(key, []).append(value)


class MetricsLogger(Callback):
    """Appends one JSON object per log point to a metrics.jsonl file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._file = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed at train end

    def on_log(self, step: int, logs: dict) -> None:
        record = {"step": step, "epoch": logs["epoch"]}
        for key, value in logs.items():
            if key.startswith("window/"):
                record[key.removeprefix("window/")] = value
        record["samples_per_s"] = logs["samples_per_s"]
        record["input_wait"] = logs.get("input_wait", 0.0)
        self._write(record)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        val = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if val:
            self._write({"step": logs.get("step"), "epoch": epoch, **val})

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
