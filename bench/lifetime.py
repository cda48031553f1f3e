"""How fast a multi-process job ends: the figures issue 18 asks for, measured on real processes.

    .venv/bin/python bench/lifetime.py [--steps 6] [--exit-timeout 10] [--repeats 3]

1. done -> exit: `podkit launch --processes 2 --cpu-devices-per-process 4 -- podkit train
   configs/gpt_small.toml --set train.steps=N` (the shipped config, its 200-token text sample
   included): seconds from process 0's "done:" line to the launcher's exit.
2. hang detection: two processes that finish fit() and then hang in a phase of their own,
   under `--exit-timeout E`: seconds from the end of fit() to the launcher's failure report,
   and from there to the launcher's exit (stacks collected, group stopped).
3. SIGTERM -> exit outside fit(): one process alone, and two under the launcher (SIGTERM to
   the launcher, forwarded).

Each figure is the median of --repeats runs; every run is a fresh set of processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TERM_JOB = ROOT / "tests" / "launch_scripts" / "term_job.py"
# --all-output: the timings read every process's lines ("ready" from each).
LAUNCH = [sys.executable, "-m", "podkit.launch.cli", "--all-output"]


class Timed:
    """A process whose output lines are stamped with the time they arrived."""

    def __init__(self, cmd: list[str], cwd: str, **env: str) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
        self.proc = subprocess.Popen(cmd, cwd=cwd, env={**clean, **env}, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line))
                self._cond.notify_all()

    def wait_line(self, needle: str, count: int = 1, timeout: float = 600) -> float:
        """When the count-th line containing `needle` arrived."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hits = [t for t, line in self.lines if needle in line]
                if len(hits) >= count:
                    return hits[count - 1]
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    tail = "".join(line for _, line in self.lines[-40:])
                    raise SystemExit(f"never saw {needle!r} x{count}:\n{tail}")
                self._cond.wait(0.5)

    def exit_time(self, timeout: float = 600) -> float:
        self.proc.wait(timeout=timeout)
        return time.monotonic()


def done_to_exit(steps: int, work: str) -> float:
    p = Timed([*LAUNCH, "--processes", "2", "--cpu-devices-per-process", "4",
               "--max-restarts", "0", "--", sys.executable, "-m", "podkit.cli", "train",
               str(ROOT / "configs" / "gpt_small.toml"), "--set", f"train.steps={steps}",
               "--set", f"run.dir={work}/runs", "--set", "checkpoint.enabled=false"], work)
    done = p.wait_line("] done:")
    end = p.exit_time()
    assert p.proc.returncode == 0, "".join(line for _, line in p.lines[-40:])
    return end - done


def hang_detection(exit_timeout: float, work: str) -> tuple[float, float]:
    events = Path(work) / "events.jsonl"
    p = Timed([*LAUNCH, "--processes", "2", "--cpu-devices-per-process", "1",
               "--exit-timeout", str(exit_timeout), "--max-restarts", "0", "--events",
               str(events), "--", sys.executable, str(TERM_JOB), "after_fit", work], work)
    ready = min(p.wait_line("ready", 1), p.wait_line("ready", 2))
    reported = p.wait_line("is hung in phase")
    end = p.exit_time()
    failure = next(e for e in map(json.loads, events.read_text().splitlines())
                   if e["event"] == "failure")
    assert failure["kind"] == "exit_timeout", failure
    return reported - ready, end - reported


def sigterm_to_exit(processes: int, work: str) -> float:
    job = [sys.executable, str(TERM_JOB), "after_fit", work]
    if processes == 1:
        p = Timed(job, work, PODKIT_CPU_DEVICES="1")
    else:
        p = Timed([*LAUNCH, "--processes", str(processes), "--cpu-devices-per-process", "1",
                   "--"] + job, work)
    p.wait_line("ready", processes)
    t0 = time.monotonic()
    p.proc.send_signal(signal.SIGTERM)
    end = p.exit_time(timeout=120)
    expected = 143 if processes == 1 else 0
    assert p.proc.returncode == expected, (p.proc.returncode, p.lines[-20:])
    return end - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--exit-timeout", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []

    def median(fn, *a):
        values = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="podkit-lifetime-") as work:
                values.append(fn(*a, work))
        return values

    runs = median(done_to_exit, args.steps)
    rows.append(("2-process gpt_small: 'done' -> launcher exit (text sample included)",
                 statistics.median(runs), runs))
    hangs = median(hang_detection, args.exit_timeout)
    detect = [h[0] for h in hangs]
    rows.append((f"hung after fit(): end of fit -> reported (--exit-timeout "
                 f"{args.exit_timeout:g})", statistics.median(detect), detect))
    stop = [h[1] for h in hangs]
    rows.append(("hung after fit(): reported -> launcher exit (stacks, group stopped)",
                 statistics.median(stop), stop))
    for n in (1, 2):
        runs = median(sigterm_to_exit, n)
        rows.append((f"SIGTERM -> exit outside fit(), {n} process(es)"
                     + (" under the launcher" if n > 1 else ""), statistics.median(runs), runs))
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'median s':>9}  runs")
    for what, med, values in rows:
        print(f"{what:<{width}}  {med:>9.2f}  {', '.join(f'{v:.2f}' for v in values)}")


if __name__ == "__main__":
    main()
