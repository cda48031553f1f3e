"""The run directory: what a training run leaves behind, written by the library.

    model.fit(x, y, run_dir="runs/exp1")      # a notebook gets what `podkit train` gets

    run.json        the resolved run: model and compile config, fit arguments, strategy and
                    devices, versions
    config.toml     the typed config, when the run came from one (`podkit train`)
    shardings.json  one row per parameter and optimizer-state leaf: shape, dtype, spec,
                    bytes per device, kind (`model.sharding_table()`)
    metrics.jsonl   one JSON object per log point (step, epoch, and the loss, metrics,
                    samples_per_s and input_wait of the steps since the previous point), and
                    one per validation
    final.json      the last epoch's logs

Only process 0 writes (files on its own disk, no collective: work after training that every
process could be waiting on must not hide here). A run that continues from a trained state
(step > 0) appends to metrics.jsonl; a fresh one starts it anew (one directory, one run's
metrics).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from podkit import heartbeat
from podkit.cluster import is_lead_process
from podkit.train.hooks import Callback


@dataclasses.dataclass(frozen=True)
class RunDir:
    """`fit(run_dir=RunDir(path, config_toml=...))`: a run directory that also keeps the
    typed config the run came from (what `podkit train` passes); a plain path is the same
    without it."""

    path: str | os.PathLike
    config_toml: str | None = None


class RunDirectory(Callback):
    """Writes the run directory (see the module docstring)."""

    def __init__(self, where: str | os.PathLike | RunDir, run: dict | None = None) -> None:
        super().__init__()
        where = where if isinstance(where, RunDir) else RunDir(where)
        self.path = Path(where.path)
        self.run, self.config_toml = run or {}, where.config_toml
        self._file = None

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def on_train_begin(self, logs: dict | None = None) -> None:
        # Every process: where `podkit launch` puts its thread stacks should it hang.
        heartbeat.set_run_dir(self.path)
        if not is_lead_process():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "run.json").write_text(json.dumps(self.run, indent=2, default=str) + "\n")
        if self.config_toml is not None:
            (self.path / "config.toml").write_text(self.config_toml)
        if self.model is not None:
            (self.path / "shardings.json").write_text(
                json.dumps(self.model.sharding_table(), indent=1) + "\n")
        fresh = int(getattr(self.model.state, "step", 0)) == 0 if self.model else True
        self._file = open(self.metrics_path, "w" if fresh else "a", buffering=1)

    def on_log(self, step: int, logs: dict) -> None:
        record: dict[str, Any] = {"step": step, "epoch": logs["epoch"]}
        for key, value in logs.items():
            if key.startswith("window/"):
                record[key.removeprefix("window/")] = value
        record["samples_per_s"] = logs["samples_per_s"]
        record["input_wait"] = logs.get("input_wait", 0.0)
        self._write(record)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        val = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if val:
            step = int(self.model.state.step) if self.model is not None else None
            self._write({"step": step, "epoch": epoch, **val})

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            (self.path / "final.json").write_text(json.dumps(logs or {}, indent=2) + "\n")
