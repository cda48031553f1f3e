"""The run directory: what a training run leaves behind, written by the library.

    model.fit(x, y, run_dir="runs/exp1")      # a notebook gets what `podkit train` gets

    run.json        the resolved run: model and compile config, fit arguments, strategy and
                    devices, versions
    config.toml     the typed config, when the run came from one (`podkit train`)
    shardings.json  one row per parameter and optimizer-state leaf: shape, dtype, spec,
                    bytes per device, kind (`model.sharding_table()`)
    metrics.jsonl   one JSON object per log point (step, epoch, time, and the loss and
                    metrics of the steps since the previous point, with the telemetry of
                    podkit.train.telemetry: samples_per_s, tokens_per_s, step_time_s, mfu,
                    device_idle, input_wait, goodput and time/<where>_s, compiles, compile_s,
                    recompiles, checkpoint_s, memory, grad_norm, learning_rate), and one per
                    validation
    final.json      the last epoch's logs
    recompiles.json every recompile of the model's steps and its cause (podkit.train.recompiles)
    tensorboard/    the same values as TensorBoard event files (podkit.monitor.tensorboard)

Only process 0 writes (files on its own disk, no collective: work after training that every
process could be waiting on must not hide here). A run that continues from a trained state
(step > 0) appends to metrics.jsonl; a fresh one starts it anew (one directory, one run's
metrics).

A run directory is a local path: `gs://` and `s3://` are refused by `check_run_dir` (a
ConfigError naming the URL) before anything is built; checkpoints go to object storage
through fit(checkpoint=URL).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from podkit import heartbeat, paths
from podkit.cluster import is_lead_process
from podkit.errors import ConfigError
from podkit.monitor.tensorboard import RunEvents
from podkit.train.hooks import Callback
from podkit.train.telemetry import PREFIX as TELEMETRY

# Which process wrote a record: fits of one process (a notebook calling fit() again) are not
# restarts (podkit.monitor.records).
PROCESS = os.urandom(4).hex()


@dataclasses.dataclass(frozen=True)
class RunDir:
    """`fit(run_dir=RunDir(path, config_toml=...))`: a run directory that also keeps the
    typed config the run came from (what `podkit train` passes); a plain path is the same
    without it."""

    path: str | os.PathLike
    config_toml: str | None = None


def check_run_dir(where: Any) -> None:
    """A ConfigError for what cannot be a run directory, before anything is built."""
    path = where.path if isinstance(where, RunDir) else where
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"run_dir={where!r} must be a path (str or pathlib.Path) of a "
                          "directory to write the run's records to.")
    if paths.is_url(path):  # a malformed URL (gs:/b, gcs://) is a ConfigError here too
        raise ConfigError(
            f"run_dir={os.fspath(path)!r} is an object store URL: a run directory is appended "
            "to while training (metrics.jsonl, TensorBoard event files, the watchdog's stacks, "
            "heartbeats) and read by `podkit launch` and `podkit report` on this machine, so "
            "it is a local path. Pass a local run_dir and send the checkpoints to the bucket: "
            f"fit(checkpoint={os.fspath(path).rstrip('/') + '/checkpoints'!r}).")
    if Path(path).exists() and not Path(path).is_dir():
        raise ConfigError(f"run_dir={str(path)!r} is a file; pass a directory (it is created "
                          "if missing).")


class RunDirectory(Callback):
    """Writes the run directory (see the module docstring)."""

    def __init__(self, where: str | os.PathLike | RunDir, run: dict | None = None) -> None:
        super().__init__()
        where = where if isinstance(where, RunDir) else RunDir(where)
        self.path = Path(where.path)
        self.run, self.config_toml = run or {}, where.config_toml
        self._file = None
        self._events: RunEvents | None = None
        self._events_dir: Path | None = None
        self._ran = False  # a step or an epoch end was recorded
        self._validated: set[int] = set()  # a kept validation line at the restored step

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
        fresh = self.model.steps_trained == 0 if self.model else True
        if not fresh:
            self._continue_from(self.model.steps_trained)
        self._file = open(self.metrics_path, "w" if fresh else "a", buffering=1)
        if fresh and (self.path / "tensorboard").exists():
            shutil.rmtree(self.path / "tensorboard")  # one directory, one run's curves
        # Opened at the first record: a run resumed at its end writes no empty event file.
        self._events_dir = self.path / "tensorboard"

    def _continue_from(self, step: int) -> None:
        """A resumed run continues metrics.jsonl from its restored step: the records a killed
        run wrote after that step (it trains them again) and a line cut by the kill go, so
        the file has each step once."""
        if not self.metrics_path.is_file():
            return
        kept = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed process, half written
            if record.get("step") is None or record["step"] <= step:
                kept.append(line)
                if record.get("step") == step and any(k.startswith("val_") for k in record):
                    self._validated.add(step)
        self.metrics_path.write_text("".join(f"{line}\n" for line in kept))

    def _board(self) -> RunEvents | None:
        if self._events is None and self._events_dir is not None:
            self._events = RunEvents(self._events_dir)
        return self._events

    def on_log(self, step: int, logs: dict) -> None:
        self._ran = True
        record: dict[str, Any] = {"step": step, "epoch": logs["epoch"], "process": PROCESS}
        for key, value in logs.items():
            if key.startswith("window/"):
                record[key.removeprefix("window/")] = value
        if "samples_per_s" in logs:  # with the telemetry (podkit.train.telemetry.EVERY_S)
            record["samples_per_s"] = logs["samples_per_s"]
        record["input_wait"] = logs.get("input_wait", 0.0)
        for key, value in logs.items():
            if key.startswith(TELEMETRY):
                record[key.removeprefix(TELEMETRY)] = value
        record["time"] = time.time()
        self._write(record)
        # TensorBoard gets the points that carry the telemetry (at most every
        # podkit.train.telemetry.EVERY_S); metrics.jsonl gets every log point.
        if "goodput" in record and self._board() is not None:
            self._events.log_point(step, record)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._ran = True
        val = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        step = self.model.steps_trained if self.model is not None else None
        if val and step in self._validated:
            # A run resumed from a checkpoint taken at an epoch's last step finishes that
            # epoch again (its validation too): the file keeps the line it has.
            self._validated.discard(step)
        elif val:
            self._write({"step": step, "epoch": epoch, **val, "time": time.time()})
            if self._board() is not None:
                self._events.validation(step or 0, val)
        if self._events is not None:
            self._events.flush()

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._file is not None and self.model is not None and self._ran:
            events = [dataclasses.asdict(e) for e in self.model.recompiles.events]
            (self.path / "recompiles.json").write_text(json.dumps(events, indent=1) + "\n")
        if self._events is not None:
            self._events.close()
        self._events, self._events_dir = None, None
        if self._file is not None:
            self._file.close()
            self._file = None
            # A run resumed at its end trained nothing: its records stay as they were.
            if self._ran:
                (self.path / "final.json").write_text(json.dumps(logs or {}, indent=2) + "\n")
