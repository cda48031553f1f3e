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
    fits.jsonl      one line when each fit's loop starts (its process's start time, the
                    loop's, the step it starts from, the seconds its restore took) and one
                    when it ends (the loop's final time split): with redone.jsonl, what
                    accounts the run's wall time across restarts (podkit.monitor.wall_time)
    redone.jsonl    the log points a failed process wrote past the checkpoint its successor
                    resumed from (steps trained again), moved out of metrics.jsonl
    final.json      the last epoch's logs
    recompiles.json every recompile of the model's steps and its cause (podkit.train.recompiles)
    tensorboard/    the same values as TensorBoard event files (podkit.monitor.tensorboard)

Only process 0 writes (files on its own disk, no collective: work after training that every
process could be waiting on must not hide here). A run that continues from a trained state
(step > 0) appends to metrics.jsonl and fits.jsonl; a fresh one starts them anew (one
directory, one run's metrics).

A run directory may be a `gs://` or `s3://` URL (on Cloud TPU VMs, which are ephemeral, run
directories live in buckets). Objects cannot be appended to, so the files are written in a
local copy (`podkit.paths.Mirror`, under $PODKIT_CACHE/mirrors) that process 0 first makes
equal to the bucket (a run resumed on another machine continues its metrics.jsonl and event
files) and pushes there: after the run's first records, every `PUSH_S` seconds of log points
(on a thread: the loop never waits on the bucket), at each epoch's end and, before fit()
returns, once more and waited for. Checkpoints live under the URL itself
(`podkit train`'s default checkpoint directory is RUN_DIR/checkpoints, written by the
checkpoint manager), never in the copy.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from podkit import heartbeat, paths
from podkit.cluster import is_lead_process
from podkit.errors import ConfigError
from podkit.monitor.fits import FitRecorder
from podkit.monitor.tensorboard import RunEvents
from podkit.monitor.wall_time import LOOP_PARTS as TIME_PARTS
from podkit.monitor.wall_time import PARTS as ALL_PARTS
from podkit.train.hooks import Callback
from podkit.train.telemetry import PREFIX as TELEMETRY

# Which process wrote a record: fits of one process (a notebook calling fit() again) are not
# restarts (podkit.monitor.records).
PROCESS = os.urandom(4).hex()

FITS, REDONE = "fits.jsonl", "redone.jsonl"


PUSH_S = 60.0
"""A run directory on a URL is pushed at most this often from log points (and at every
epoch's end and the run's end)."""

# What a run directory's copy never holds: checkpoints live at the URL itself, and the
# compilation cache has its own copy (podkit.compile_cache).
NOT_MIRRORED = ("checkpoints", "compile_cache")


@dataclasses.dataclass(frozen=True)
class RunDir:
    """`fit(run_dir=RunDir(path, config_toml=...))`: a run directory that also keeps the
    typed config the run came from (what `podkit train` passes); a plain path is the same
    without it. `mirror`: the local copy of a run directory on a URL, when the caller made
    (and pulled) it already. `elastic`: what a start on fewer processes changed
    (podkit.elastic), for fits.jsonl."""

    path: str | os.PathLike
    config_toml: str | None = None
    mirror: paths.Mirror | None = None
    elastic: dict | None = None  # a start on fewer processes: podkit.elastic's plan record


def check_run_dir(where: Any) -> None:
    """A ConfigError for what cannot be a run directory, before anything is built."""
    path = where.path if isinstance(where, RunDir) else where
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"run_dir={where!r} must be a path (str or pathlib.Path) of a "
                          "directory to write the run's records to.")
    if paths.is_url(path):  # a malformed URL (gs:/b, gcs://) is a ConfigError here too
        if not os.fspath(path).split("://", 1)[1].strip("/").count("/"):
            raise ConfigError(f"run_dir={os.fspath(path)!r} is a bucket's root; pass a "
                              "directory in it (gs://BUCKET/runs/NAME): the run's copy "
                              "mirrors everything under the URL.")
        if paths.exists(path) and not paths.isdir(path):
            raise ConfigError(f"run_dir={os.fspath(path)!r} is an object, not a directory; "
                              "pass a URL under which to write the run's records.")
        return
    if Path(path).exists() and not Path(path).is_dir():
        raise ConfigError(f"run_dir={str(path)!r} is a file; pass a directory (it is created "
                          "if missing).")


def mirror_of(url: str | os.PathLike) -> paths.Mirror:
    """The local copy a run writes of its run directory on a URL (not pulled yet)."""
    return paths.Mirror(url, skip=NOT_MIRRORED)


_snapshots: list[str] = []


def snapshot_of(url: str | os.PathLike) -> paths.Mirror:
    """A reader's copy of a run directory on a URL (not pulled yet): in a directory of this
    process's own, removed at its exit, so that reading a run (`podkit report` on the machine
    that trains it) never replaces the files the run is appending to in its copy."""
    if not _snapshots:
        made = tempfile.mkdtemp(prefix="podkit-run-")
        _snapshots.append(made)
        atexit.register(shutil.rmtree, made, ignore_errors=True)
    digest = hashlib.sha256(os.fspath(url).encode()).hexdigest()[:16]
    name = os.fspath(url).rstrip("/").rpartition("/")[2]
    return paths.Mirror(url, skip=NOT_MIRRORED, local=Path(_snapshots[0]) / digest / name)


def local_run_dir(where: Any) -> tuple[Path, paths.Mirror | None]:
    """(the local directory the run's files are written in, the Mirror that pushes them when
    `where` is a URL). Process 0 pulls a new mirror first; other processes only use its path
    (heartbeats, the watchdog's stacks)."""
    if isinstance(where, RunDir) and where.mirror is not None:
        return where.mirror.local, where.mirror
    path = where.path if isinstance(where, RunDir) else where
    if not paths.is_url(path):
        return Path(path), None
    mirror = mirror_of(path)
    if is_lead_process():
        mirror.pull()
    return mirror.local, mirror


class RunDirectory(Callback):
    """Writes the run directory (see the module docstring)."""

    def __init__(self, where: str | os.PathLike | RunDir, run: dict | None = None,
                 mirror: paths.Mirror | None = None) -> None:
        super().__init__()
        where = where if isinstance(where, RunDir) else RunDir(where)
        self.path = Path(where.path)
        self.run, self.config_toml = run or {}, where.config_toml
        self.elastic = where.elastic  # fits.jsonl's start line keeps it
        # A run directory on a URL: `path` is its local copy, which process 0 pushes (the
        # others write nothing there but their heartbeats and the watchdog's stacks).
        self.mirror = mirror if is_lead_process() else None
        self._pushing: threading.Thread | None = None
        self._pushed_at = float("-inf")
        self._file = None
        self._events: RunEvents | None = None
        self._events_dir: Path | None = None
        self._ran = False  # a step or an epoch end was recorded
        self._validated: set[int] = set()  # a kept validation line at the restored step
        self.start_step = 0  # the step this fit starts from
        # The run's time before this fit, by part (podkit.monitor.wall_time), once known: the
        # live account across restarts that TensorBoard gets (set by the FitRecorder).
        self.before: dict[str, float] | None = None

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def loop_hook(self) -> FitRecorder:
        """The loop hook that writes this fit's fits.jsonl lines (podkit.monitor.fits)."""
        return FitRecorder(self)

    def write_fit(self, line: dict) -> None:
        """Append a line to fits.jsonl (process 0), naming this process."""
        if is_lead_process() and self._file is not None:
            with open(self.path / FITS, "a") as f:
                f.write(json.dumps({"process": PROCESS, **line}) + "\n")

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
        self.start_step = self.model.steps_trained if self.model else 0
        fresh = self.start_step == 0
        if not fresh:
            self._continue_from(self.start_step)
        else:
            for name in (FITS, REDONE):  # emptied, not removed: a URL's copy keeps it so
                if (self.path / name).exists():
                    (self.path / name).write_text("")
        self._file = open(self.metrics_path, "w" if fresh else "a", buffering=1)
        if fresh and (self.path / "tensorboard").exists():
            shutil.rmtree(self.path / "tensorboard")  # one directory, one run's curves
        # Opened at the first record: a run resumed at its end writes no empty event file.
        self._events_dir = self.path / "tensorboard"
        self._push(wait=True)  # the run's config in the bucket before its first step

    def _push(self, wait: bool = False) -> None:
        """Send the copy's changes to the URL (a run directory on one; process 0). Without
        `wait`, on a thread, one at a time (the loop never waits on the bucket); what a
        failed one did not send goes with the next, and the one that waits (the run's end)
        raises its failure."""
        if self.mirror is None or not is_lead_process():
            return
        if self._pushing is not None and (wait or not self._pushing.is_alive()):
            self._pushing.join()
            self._pushing = None
        if wait:
            self.mirror.push()
            self._pushed_at = time.monotonic()
            return
        if self._pushing is not None:
            return  # one in flight: this one's changes go with the next

        def push() -> None:
            try:
                self.mirror.push()
            except Exception as e:  # the waited push at the end tries again and raises
                warnings.warn(f"podkit: the run directory {self.mirror.url} was not updated "
                              f"({e}); the next push sends what this one did not.",
                              stacklevel=1)

        self._pushed_at = time.monotonic()
        self._pushing = threading.Thread(target=push, name="podkit-run-dir-push", daemon=True)
        self._pushing.start()

    def _continue_from(self, step: int) -> None:
        """A resumed run continues metrics.jsonl from its restored step: the records a killed
        run wrote after that step (it trains them again) and a line cut by the kill go, so
        the file has each step once."""
        if not self.metrics_path.is_file():
            return
        kept, redone = [], []
        for line in self.metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed process, half written
            if record.get("step") is None or record["step"] <= step:
                kept.append(line)
                if record.get("step") == step and any(k.startswith("val_") for k in record):
                    self._validated.add(step)
            else:
                redone.append(line)
        if redone:  # the failed process's time past the checkpoint: lost (wall_time)
            with open(self.path / REDONE, "a") as f:
                f.write("".join(f"{line}\n" for line in redone))
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
            self._events.log_point(step, {**record, **self._across_restarts(record)})
        if self.mirror is not None and self._file is not None and \
                time.monotonic() - self._pushed_at >= PUSH_S:
            self._file.flush()
            if self._events is not None:
                self._events.flush()
            self._push()

    def _across_restarts(self, record: dict) -> dict[str, float]:
        """The run's account so far, across its restarts ("run_time/<part>_s" and
        "run_goodput"): the time before this fit's loop, plus the loop's own split."""
        before = self.before
        if before is None:
            return {}
        parts = {**dict.fromkeys(ALL_PARTS, 0.0), **before}
        for k in TIME_PARTS:
            parts[k] = parts.get(k, 0.0) + record.get(f"time/{k}_s", 0.0)
        total = sum(parts.values())
        out = {f"run_time/{k}_s": v for k, v in parts.items()}
        if total > 0:
            out["run_goodput"] = parts["productive"] / total
        return out

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._ran = True
        val = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        step = self.model.steps_trained if self.model is not None else None
        if val and step in self._validated:
            # A run resumed from a checkpoint taken at an epoch's last step finishes that
            # epoch again (its validation too): the file keeps the line it has.
            self._validated.discard(step)
        elif val:
            self._write({"step": step, "epoch": epoch, "process": PROCESS, **val,
                         "time": time.time()})
            if self._board() is not None:
                self._events.validation(step or 0, val)
        if self._events is not None:
            self._events.flush()
        if self._file is not None:
            self._file.flush()
        self._push()

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def after_failure(self) -> None:
        """fit() is raising (a NaN stop, out of memory, an error): the records written so far
        are closed and, for a URL, pushed at once (on an ephemeral VM they are what says
        why), a push that fails only warned: the error being raised is the one to see."""
        if self._events is not None:
            self._events.close()
            self._events = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.mirror is not None:
            try:
                self._push(wait=True)
            except Exception as e:
                warnings.warn(f"podkit: the run directory {self.mirror.url} was not updated "
                              f"after the failure ({e}); its records are in {self.path}.",
                              stacklevel=1)

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
            self._push(wait=True)
