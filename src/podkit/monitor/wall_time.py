"""Every second of a run's wall time, across its restarts: from its first process's start to
its last record, as

    startup     a process's start to its loop (interpreter, imports, connect, the data, the
                model): from the kernel's start time (podkit.lifetime) to the loop's timeline
    productive, compile, restore, checkpoint, input, validation, other
                the loop's own split (podkit.train.timeline), up to the moment the process
                reached the step its successor resumed from
    lost        a failed process's time after that moment: the steps it computed past the
                checkpoint its successor resumed from, done again by the successor
    down        from a failed process's last record to the next process's start (detecting the
                failure, the launcher's back-off, and what the killed process did after its
                last record)
    idle        a process between two of its own fit() calls (a notebook)

so that the parts add up to the wall time exactly, by construction (what no part names goes
to "other"), and goodput = productive / wall time.

    wall = breakdown(records.load("runs/gpt").fits, all_records)
    wall.parts, wall.wall, wall.goodput, wall.fits[0].parts

Built from fits.jsonl (a line when each fit's loop starts: the process's start time, the
loop's, the step it starts from, the seconds its restore took; and one when it ends: the loop's
final split) and the log points of metrics.jsonl and redone.jsonl (the points a failed process
wrote past the checkpoint its successor resumed from, which metrics.jsonl keeps each step of
once). Between two of a fit's records that carry the loop's split (the telemetry's, every half
second of device time or so), the split is interpolated linearly in time; after the last one,
the rest is "other".
"""

from __future__ import annotations

import dataclasses
from typing import Any

LOOP_PARTS = ("productive", "compile", "restore", "checkpoint", "input", "validation", "other")
"""The loop's own split, as each metrics.jsonl record's time/<part>_s."""
RESTART_PARTS = ("startup", "lost", "down", "idle")
PARTS = (*LOOP_PARTS, *RESTART_PARTS)


@dataclasses.dataclass
class FitTime:
    """One fit() of the run: one process's loop (a process may run several)."""

    process: str
    started: float  # the process's start (Unix time)
    loop: float  # its loop's start
    end: float  # its last record
    first_step: int  # the step it started from
    last_step: int  # the last step it logged
    parts: dict[str, float]  # startup (or idle), the loop's parts, lost
    ended: bool  # wrote its end line (else: killed, or still running)
    lost_steps: int = 0  # steps past the checkpoint its successor resumed from
    down_after: float = 0.0  # to the next process's start, when one followed
    processes: int | None = None  # the job's processes in this attempt (None: not recorded)
    elastic: str | None = None  # what a start on fewer processes changed (podkit.elastic)


@dataclasses.dataclass
class WallTime:
    start: float  # the first process's start
    end: float  # the last record
    parts: dict[str, float]
    fits: list[FitTime]

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def goodput(self) -> float | None:
        total = sum(self.parts.values())
        return self.parts["productive"] / total if total > 0 else None

    @property
    def restarts(self) -> int:
        """Fits in a new process after the first."""
        return sum(1 for a, b in zip(self.fits, self.fits[1:], strict=False)
                   if a.process != b.process)

    @property
    def lost_steps(self) -> int:
        return sum(f.lost_steps for f in self.fits)


def _is_point(record: dict) -> bool:
    return isinstance(record.get("step"), int) and not any(k.startswith("val_")
                                                           for k in record)


def _split_of(record: dict) -> dict[str, float]:
    return {k: float(record.get(f"time/{k}_s", 0.0) or 0.0) for k in LOOP_PARTS}


def _timed(loop: float, marks: list[tuple[float, dict[str, float]]]
           ) -> list[tuple[float, dict[str, float]]]:
    """(time, cumulative split) from the loop's start, each split made to add up to its time
    since the loop's start (the record is written a moment after the window it closes ends;
    that moment is "other")."""
    out = [(loop, dict.fromkeys(LOOP_PARTS, 0.0))]
    for t, split in sorted(marks, key=lambda m: m[0]):
        if t < out[-1][0]:
            continue
        split = dict(split)
        split["other"] += (t - loop) - sum(split.values())
        out.append((t, split))
    return out


def _split_at(timed: list[tuple[float, dict[str, float]]], t: float) -> dict[str, float]:
    """The loop's cumulative split at time `t`: adds up to t - loop."""
    if t <= timed[0][0]:
        return dict.fromkeys(LOOP_PARTS, 0.0)
    for (t0, a), (t1, b) in zip(timed, timed[1:], strict=False):
        if t0 <= t <= t1:
            w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
            return {k: a[k] + (b[k] - a[k]) * w for k in LOOP_PARTS}
    t_last, last = timed[-1]
    out = dict(last)
    out["other"] += t - t_last
    return out


def _reached(points: list[dict], first_step: int, loop: float, step: int, end: float) -> float:
    """When a fit reached `step` (by its log points; linear between the two around it)."""
    if step <= first_step:
        return loop
    before = [(first_step, loop)] + [(p["step"], p["time"]) for p in points
                                     if p["step"] <= step]
    after = [(p["step"], p["time"]) for p in points if p["step"] > step]
    s0, t0 = max(before, key=lambda x: (x[0], x[1]))
    if s0 == step or not after:
        return t0 if s0 == step else end
    s1, t1 = min(after, key=lambda x: (x[0], x[1]))
    return t0 + (t1 - t0) * (step - s0) / (s1 - s0)


def breakdown(fit_lines: list[dict], records: list[dict]) -> WallTime | None:
    """The run's wall time by part (see the module docstring); None without fits.jsonl's
    lines (records written before podkit kept them)."""
    starts = [f for f in fit_lines if f.get("event") == "start"
              and isinstance(f.get("loop"), int | float)]
    if not starts:
        return None
    ends: dict[int, dict] = {}
    for line in fit_lines:  # an end line closes the latest start of its process
        if line.get("event") == "end":
            for i in range(len(starts) - 1, -1, -1):
                if starts[i].get("process") == line.get("process") and \
                        starts[i]["loop"] <= line.get("time", float("inf")):
                    ends.setdefault(i, line)
                    break
    by_process: dict[Any, list[dict]] = {}  # one pass over the records, however many fits
    for r in records:
        if isinstance(r.get("time"), int | float):
            by_process.setdefault(r.get("process"), []).append(r)
    fits: list[FitTime] = []
    timed_of: list[list] = []
    points_of: list[list[dict]] = []
    for i, s in enumerate(starts):
        process = s.get("process")
        later = [t["loop"] for t in starts[i + 1:] if t.get("process") == process]
        until = min(later) if later else float("inf")
        mine = [r for r in by_process.get(process, []) if s["loop"] <= r["time"] < until]
        end_line = ends.get(i)
        marks = [(r["time"], _split_of(r)) for r in mine if "time/productive_s" in r]
        marks.append((s.get("time", s["loop"]),
                      {**dict.fromkeys(LOOP_PARTS, 0.0), "restore": s.get("restore_s", 0.0)}))
        if end_line is not None:
            marks.append((end_line["time"], _split_of(end_line)))
        times = [r["time"] for r in mine] + [s.get("time", s["loop"])]
        if end_line is not None:
            times.append(end_line["time"])
        points = sorted((r for r in mine if _is_point(r)), key=lambda r: (r["step"], r["time"]))
        first = int(s.get("step") or 0)
        last = max([first] + [p["step"] for p in points])
        if end_line is not None and isinstance(end_line.get("step"), int):
            last = max(last, end_line["step"])
        fits.append(FitTime(process, float(s.get("started", s["loop"])), float(s["loop"]),
                            max(times), first, last, {}, end_line is not None,
                            processes=s.get("processes"),
                            elastic=(s.get("elastic") or {}).get("note")))
        timed_of.append(_timed(s["loop"], marks))
        points_of.append(points)
    parts = dict.fromkeys(PARTS, 0.0)
    for i, fit in enumerate(fits):
        previous = fits[i - 1] if i else None
        if previous is not None and previous.process == fit.process:
            fit.parts["idle"] = max(fit.loop - previous.end, 0.0)
        else:
            fit.parts["startup"] = max(fit.loop - fit.started, 0.0)
        nxt = fits[i + 1] if i + 1 < len(fits) else None
        cut = fit.end
        if nxt is not None and nxt.process != fit.process and fit.last_step > nxt.first_step:
            # The successor resumed from an earlier step: what this one did past it is lost.
            cut = min(_reached(points_of[i], fit.first_step, fit.loop, nxt.first_step,
                               fit.end), fit.end)
            fit.lost_steps = fit.last_step - nxt.first_step
        fit.parts.update(_split_at(timed_of[i], cut))
        fit.parts["lost"] = fit.end - cut
        if nxt is not None and nxt.process != fit.process:
            # Processes of one run follow each other; an overlap (two runs started in one
            # directory at once) is no negative downtime.
            fit.down_after = max(nxt.started - fit.end, 0.0)
            parts["down"] += fit.down_after
        for k, v in fit.parts.items():
            parts[k] += v
    return WallTime(fits[0].started, max(f.end for f in fits), parts, fits)
