"""A run directory's records, read back: what `podkit report` and `podkit doctor` work from.

    run = records.load("runs/seed_mlp")
    run.points        # metrics.jsonl's log points (step, loss, samples_per_s, mfu, ...)
    run.validations   # its validation records (val_loss, ...)
    run.final, run.meta, run.recompiles

A run directory holds one run: fits that continue it (a resume, a `podkit launch` restart)
append to metrics.jsonl, and each fit's telemetry counts from its own start. `segments`
splits the log points where a count starts again. fits.jsonl says when each fit's process and
loop started, and redone.jsonl holds the log points a failed process wrote past the checkpoint
its successor resumed from: `wall_time()` accounts every second of the run from its first
process's start to its last record (podkit.monitor.wall_time), which `time_split` and
`goodput` report. A run directory written before fits.jsonl existed gets the older account:
the loops' splits, and the time between one fit's last point and the next one's loop as
"down".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError
from podkit.monitor.wall_time import LOOP_PARTS, PARTS, WallTime, breakdown

TIME_PARTS = LOOP_PARTS
"""The loop's split (each record's time/<part>_s); PARTS adds startup, lost, down, idle."""


@dataclasses.dataclass
class RunRecords:
    path: Path
    meta: dict[str, Any]  # run.json
    points: list[dict[str, Any]]  # log points, in file order
    validations: list[dict[str, Any]]
    final: dict[str, Any]
    recompiles: list[dict[str, Any]]
    fits: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # fits.jsonl
    redone: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # redone.jsonl

    @property
    def name(self) -> str:
        return self.path.name

    def segments(self) -> list[list[dict[str, Any]]]:
        """The log points of each fit (a new fit's cumulative compile count or time parts
        start again from its own beginning)."""
        out: list[list[dict[str, Any]]] = []
        previous = 0.0
        for p in self.points:
            # Log points between two telemetry points carry no time split: they continue.
            timed = "time/productive_s" in p
            total = sum(p.get(f"time/{k}_s", 0.0) for k in TIME_PARTS) if timed else previous
            if not out or total < previous - 1e-9 or p.get("step", 0) <= out[-1][-1].get(
                    "step", 0):
                out.append([])
            out[-1].append(p)
            previous = total
        return out

    def wall_time(self) -> WallTime | None:
        """Every second of the run by where it went, across its restarts (None for a run
        directory without fits.jsonl)."""
        return breakdown(self.fits, self.points + self.validations + self.redone)

    def time_split(self) -> dict[str, float]:
        """Seconds by where they went (PARTS), over every fit of the run and the time between
        them: `wall_time().parts`, or for records without fits.jsonl the loops' splits and,
        as "down", the time between one fit's last log point and the next one's loop."""
        wall = self.wall_time()
        if wall is not None:
            return dict(wall.parts)
        split = dict.fromkeys(PARTS, 0.0)
        segments = self.segments()
        timed = [[p for p in seg if "time/productive_s" in p] for seg in segments]
        timed = [seg for seg in timed if seg]
        for segment in timed:
            last = segment[-1]
            for k in TIME_PARTS:
                split[k] += last.get(f"time/{k}_s", 0.0)
        for a, b in zip(timed, timed[1:], strict=False):
            # A fit called again by the same process (a notebook) is no restart; the time
            # between its fits was nobody's.
            if a[-1].get("process") is not None and a[-1].get("process") == b[0].get("process"):
                continue
            if "time" in a[-1] and "time" in b[0]:
                first = b[0]
                own = sum(first.get(f"time/{k}_s", 0.0) for k in TIME_PARTS)
                split["down"] += max(first["time"] - own - a[-1]["time"], 0.0)
        return split

    def restarts(self) -> int:
        """Fits that continued the run in a new process."""
        wall = self.wall_time()
        if wall is not None:
            return wall.restarts
        segments = [seg for seg in self.segments() if seg]
        return sum(1 for a, b in zip(segments, segments[1:], strict=False)
                   if a[-1].get("process") is None or a[-1].get("process") != b[0].get(
                       "process"))

    def goodput(self) -> float | None:
        split = self.time_split()
        total = sum(split.values())
        return split["productive"] / total if total > 0 else None


def load(path: str | Path) -> RunRecords:
    """The records of a run directory; a ConfigError naming what is missing."""
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        hint = (" (it is a checkpoint directory: pass the run directory above it)"
                if (path / "COMMIT.json").exists() or path.name == "checkpoints" else "")
        raise ConfigError(f"{path} holds no metrics.jsonl{hint}: pass a run directory "
                          "(runs/NAME) that `podkit train` or fit(run_dir=...) wrote.")
    points, validations = [], []
    for record in _lines(metrics):
        if any(k.startswith("val_") for k in record):
            validations.append(record)
        else:
            points.append(record)

    def read(name: str, default: Any) -> Any:
        try:
            return json.loads((path / name).read_text())
        except (OSError, ValueError):
            return default

    return RunRecords(path, read("run.json", {}), points, validations, read("final.json", {}),
                      read("recompiles.json", []), _lines(path / "fits.jsonl"),
                      _lines(path / "redone.jsonl"))


def _lines(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's records ([] when it is missing); a last line cut short by a killed
    process is left out, any other that is not JSON is a ConfigError."""
    if not path.is_file():
        return []
    out = []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if n == len(lines):  # a process killed while writing: its last line is cut short
                continue
            raise ConfigError(f"{path}:{n} is not JSON ({line[:60]!r}); the file is "
                              "damaged.") from None
    return out
