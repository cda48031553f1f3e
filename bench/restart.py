"""A restart after a failure: how soon does it train again? Cold start against a restart that
loads its compiled programs from the run's persistent compilation cache, and one that does not.

    .venv/bin/python bench/restart.py                                   # the seed MLP, CPU
    python bench/restart.py configs/llama_tpu.toml --kill-at 20         # on a TPU VM
    python bench/restart.py configs/gpt_small.toml --set model.layers=2 ...

Every run is a fresh `podkit train CONFIG` process on one run directory:

  cold       a new run directory: no checkpoint, an empty compilation cache. The process is
             SIGKILLed once the checkpoint of step --kill-at is committed (as a failure would).
  restart    the same command again: it restores step --kill-at and loads its programs from
             RUN_DIR/compile_cache; killed again at the next checkpoint.
  no cache   the same again with `--set run.compile_cache=none` (it restores, and compiles).

Each row: seconds from the process's start to its first logged step (the first record in
metrics.jsonl after the step it started from; train.log_every is set to
train.steps_per_execution so that record is the first execution's), and what the process
said of its compile cache. The figure: restart / cold (issue 52's target: <= 0.35x on the
chip's Llama config).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def committed(ckpt: Path, step: int) -> bool:
    return (ckpt / f"step_{step:010d}" / "COMMIT.json").exists()


def first_record(metrics: Path, after: int) -> dict | None:
    if not metrics.exists():
        return None
    for line in metrics.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line being written
            continue
        if rec.get("step", 0) > after and "time" in rec and "val_loss" not in rec:
            return rec
    return None


def one_run(cmd: list[str], run_dir: Path, start_step: int, kill_at: int,
            timeout_s: float, log: Path) -> dict:
    """Start `cmd`; time its first step after `start_step`; SIGKILL it once step `kill_at`
    is committed."""
    t0 = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir.parents[1],
                                start_new_session=True)
        first = None
        while time.time() - t0 < timeout_s:
            if first is None:
                first = first_record(run_dir / "metrics.jsonl", start_step)
            if first is not None and committed(run_dir / "checkpoints", kill_at):
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        ended_by_itself = proc.poll() is not None
        if not ended_by_itself:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # A TPU is released a moment after its process is reaped: libtpu refused a process
        # started at once after one (its lockfile).
        time.sleep(3.0)
    text = log.read_text()
    said = [ln for ln in text.splitlines() if ln.startswith("compile cache:")]
    if first is None:
        raise SystemExit(f"no step was logged within {timeout_s:.0f} s; the process's output "
                         f"({log}):\n{text[-3000:]}")
    return {"first_step_s": first["time"] - t0, "step": first["step"],
            "compiles": first.get("compiles"), "compile_s": first.get("compile_s"),
            "cache": said[-1] if said else "(killed before it said)",
            "ended_by_itself": ended_by_itself}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default=str(ROOT / "configs" / "seed_mlp.toml"))
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="passed to podkit train (repeatable)")
    p.add_argument("--kill-at", type=int, default=20,
                   help="the cold run is killed once this step's checkpoint is committed; the "
                        "restarts resume from it (default 20; also checkpoint.every_steps)")
    p.add_argument("--steps-per-execution", type=int, default=10)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--where", default=None, help="directory for the run (default: a temp dir)")
    args = p.parse_args()
    if args.kill_at % args.steps_per_execution:
        raise SystemExit(f"--kill-at {args.kill_at} must be a multiple of "
                         f"--steps-per-execution {args.steps_per_execution}")

    where = Path(args.where or tempfile.mkdtemp(prefix="podkit-restart-")).absolute()
    where.mkdir(parents=True, exist_ok=True)
    run_dir = where / "runs" / "restart"
    sets = [f"run.dir={where / 'runs'}", "run.name=restart",
            f"train.steps_per_execution={args.steps_per_execution}",
            f"train.log_every={args.steps_per_execution}",
            f"checkpoint.every_steps={args.kill_at}", *args.set]
    base = [sys.executable, "-c", "from podkit.cli import main; main()", "train",
            str(Path(args.config).absolute())]
    rows = []
    for name, extra, start in (("cold", [], 0), ("restart", [], args.kill_at),
                               ("no cache", ["run.compile_cache=none"], 2 * args.kill_at)):
        cmd = base + [a for s in sets + extra for a in ("--set", s)]
        r = one_run(cmd, run_dir, start, start + args.kill_at, args.timeout,
                    where / f"{name.replace(' ', '_')}.log")
        rows.append((name, r))
        print(f"{name:<9} first step after {r['first_step_s']:7.1f} s  (step {r['step']}; "
              f"{r['compiles']} compiles, {r['compile_s'] or 0:.1f} s compiling)  {r['cache']}",
              flush=True)
    cold, warm, nocache = (r["first_step_s"] for _, r in rows)
    print(f"restart / cold: {warm / cold:.3f}x   restart without the cache / cold: "
          f"{nocache / cold:.3f}x   (config {Path(args.config).name}; {where})")


main()
