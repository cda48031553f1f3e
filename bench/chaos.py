"""Chaos: a 2-process GPT run with a process SIGKILLed at random, against the same run
uninterrupted. Does the job lose only what it must, and end on the same weights?

    .venv/bin/python bench/chaos.py                  # ~10 minutes a run, a kill every 60-120 s
    .venv/bin/python bench/chaos.py --delete-local   # the killed process's local tier deleted too
    .venv/bin/python bench/chaos.py --minutes 2 --kill-every 30:40
    .venv/bin/python bench/chaos.py --delete-local --reference DIR/reference   # reuse a reference

Both runs are `podkit launch --processes 2 --cpu-devices-per-process 1 -- podkit train
configs/gpt_small.toml` with `strategy.slices = 2` (a `dcn` axis of 2: each process a slice,
the model replicated across them, docs/sharding.md), the same steps and seed, each with its
own run directory and its own compilation cache (so both start cold). The checkpoints:

  local tier       every execution (`checkpoint.local_every_steps` = `train.steps_per_execution`
                   = 10 steps): a local save is a copy of each process's shards to its own disk
                   and to its peer process, dispatched like a step and written on a thread, so
                   it costs the loop little, and a failure redoes at most the execution in
                   flight and the one before it (a save happens at an execution's end, so a
                   finer interval buys nothing).
  persistent tier  every `--persistent-every` steps (default: a fifth of the run, and the
                   end): with two processes its copy off the devices is awaited in save() and
                   Orbax synchronizes the processes, so it is the expensive one; the local tier
                   makes it rare: it is what survives the loss of a machine, which no kill
                   here causes.

The chaos run: its first kill comes a random 60-120 s (`--kill-every A:B`, seeded by --seed)
after its first logged step, each next one that long after the previous kill, each SIGKILL to
one of the two processes chosen at random; `--delete-local` also deletes that process's local
tier directory, so its restart takes its shards from its peer's copy. The launcher restarts the
group at once (`--backoff 0`: a killed process is no crash loop to back off from;
`--stop-timeout 0`: the survivor, stuck in a collective with a dead peer, can save nothing).

Printed: each run's goodput from its wall-time accounting (podkit.monitor.wall_time: the
parts add up to the wall time from the first process's start to the last record), the chaos
run's as a share of the reference's, and each failure's cost: the steps redone and their
seconds (lost), the time from the killed process's last record to the restart (down), the
restarted job's start to its first step minus that step's work (restart: startup, restore,
compile), against the bound "the steps since the last local checkpoint (at the reference's
step time) + 10 s". The final checkpoints' digests (`podkit checkpoint digest`: parameters and
optimizer state) must be equal.

Exit status 1 when the digests differ, a run fails, or a target is missed (goodput >= 90% of
the reference's; each failure within its bound); `--no-targets` checks the digest only (a
short run is mostly start-up: tests/test_bench_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_MINUTE = 140
"""gpt_small's steps per minute in this 2-process job on this machine's 2 cores (0.44 s a
step, measured 2026-12-08 with other jobs' tests beside it): what --minutes turns into
train.steps."""
K = 10  # steps per execution, the local tier's interval and the log interval
BOUND_S = 10.0  # a failure's cost beyond its redone steps
GOODPUT_SHARE = 0.9


def parse_every(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"--kill-every {text!r}: give A:B in seconds, e.g. 60:120") from None
    if not 0 < a <= b:
        raise SystemExit(f"--kill-every {text!r}: need 0 < A <= B")
    return a, b


def run_sets(args: argparse.Namespace, where: Path, name: str, steps: int) -> list[str]:
    persistent = args.persistent_every or max(K, steps // 5 // K * K)
    cache = [f"run.compile_cache={args.compile_cache}"] if args.compile_cache else []
    return [f"run.dir={where}", f"run.name={name}", "strategy.slices=2", *cache,
            f"train.steps={steps}", f"train.steps_per_execution={K}", f"train.log_every={K}",
            "train.verbose=2", "model.sample_tokens=0",
            f"checkpoint.every_steps={persistent}", f"checkpoint.local_every_steps={K}",
            f"checkpoint.local_dir={where / (name + '-local')}", *args.set]


def launch_cmd(config: str, sets: list[str], events: Path) -> list[str]:
    py = sys.executable
    cmd = [py, "-m", "podkit.cli", "launch", "--processes", "2",
           "--cpu-devices-per-process", "1", "--max-restarts", "1000", "--backoff", "0",
           "--stop-timeout", "0", "--events", str(events), "--", py, "-m", "podkit.cli",
           "train", config]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def child_env() -> dict[str, str]:
    # Each run compiles into its own RUN_DIR/compile_cache (so both start cold); a cache the
    # environment names would be shared by the two.
    return {k: v for k, v in os.environ.items()
            if not k.startswith("PODKIT_") and k != "JAX_COMPILATION_CACHE_DIR"}


def read_jsonl(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written
                pass
    return out


def gone(pid: int) -> bool:
    """The process is dead (a zombie or reaped): it writes nothing more."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def run(args: argparse.Namespace, where: Path, name: str, steps: int, chaos: bool) -> dict:
    """One launch to its end; with `chaos`, kills on the way. Returns what happened."""
    run_dir = where / name
    events = where / f"{name}-events.jsonl"
    log = where / f"{name}.log"
    sets = run_sets(args, where, name, steps)
    cmd = launch_cmd(args.config, sets, events)
    rng = random.Random(args.seed)
    low, high = args.kill_every
    kills: list[dict] = []
    t0 = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                cwd=where)
        due = None  # when the next kill is due (Unix time)
        while proc.poll() is None:
            time.sleep(0.1)
            if not chaos or (args.kills is not None and len(kills) >= args.kills):
                continue
            starts = [e for e in read_jsonl(events) if e.get("event") == "start"]
            if not starts:
                continue
            if due is None:  # the first: counted from the first logged step
                points = [p for p in read_jsonl(run_dir / "metrics.jsonl")
                          if isinstance(p.get("step"), int) and "time" in p]
                if points:
                    due = points[0]["time"] + rng.uniform(low, high)
                continue
            if time.time() < due:
                continue
            start = starts[-1]
            index = rng.randrange(len(start["pids"]))
            pid = start["pids"][index]
            if gone(pid):  # the group is restarting right now: the next one
                due = time.time() + 1.0
                continue
            os.kill(pid, signal.SIGKILL)
            killed = time.time()
            deleted = None
            if args.delete_local:
                while not gone(pid):
                    time.sleep(0.001)
                target = where / f"{name}-local" / f"process_{index}"
                deleted = sorted(p.name for p in target.glob("step_*"))
                shutil.rmtree(target, ignore_errors=True)
            kills.append({"time": killed, "process": index, "pid": pid,
                          "restart": start["restart"], "deleted": deleted})
            print(f"  {killed - t0:7.1f} s  SIGKILL process {index} (pid {pid})"
                  + (f"; deleted its local tier ({', '.join(deleted) or 'empty'})"
                     if deleted is not None else ""), flush=True)
            due = killed + rng.uniform(low, high)
    text = log.read_text()
    return {"name": name, "rc": proc.returncode, "run_dir": run_dir, "kills": kills,
            "seconds": time.time() - t0, "log": log, "steps": steps,
            "restores": [ln[len("[0] "):] for ln in text.splitlines()
                         if ln.startswith("[0] podkit: restoring")]}


def accounting(run_dir: Path):
    from podkit.monitor import records

    rec = records.load(run_dir)
    wall = rec.wall_time()
    if wall is None:
        raise SystemExit(f"{run_dir}: no fits.jsonl; cannot account its wall time")
    return rec, wall


def first_point(rec, fit) -> dict | None:
    """A fit's first log point that carries the loop's time split."""
    mine = [p for p in rec.points if p.get("time", 0) >= fit.loop
            and "time/productive_s" in p and (fit.end is None or p["time"] <= fit.end + 1e-6)]
    return min(mine, key=lambda p: p["time"]) if mine else None


def failures(rec, wall, kills: list[dict], step_s: float) -> list[dict]:
    """Each restart of the run: what the failure before it cost."""
    out = []
    fits = wall.fits
    for a, b in zip(fits, fits[1:], strict=False):
        if a.process == b.process:
            continue
        kill = max((k for k in kills if k["time"] <= b.started), key=lambda k: k["time"],
                   default=None)
        first = first_point(rec, b)
        restart = compile_s = None
        if first is not None:
            restart = first["time"] - b.started - first["time/productive_s"]
            compile_s = first.get("time/compile_s", 0.0)
        cost = a.parts.get("lost", 0.0) + a.down_after + (restart or 0.0)
        bound = a.lost_steps * step_s + BOUND_S
        out.append({"kill": kill, "killed_step": a.last_step, "resumed": b.first_step,
                    "lost_steps": a.lost_steps, "lost_s": a.parts.get("lost", 0.0),
                    "down_s": a.down_after, "startup_s": b.parts.get("startup", 0.0),
                    "compile_s": compile_s, "restore_s": b.parts.get("restore", 0.0),
                    "restart_s": restart, "cost_s": cost, "bound_s": bound,
                    "ok": restart is not None and cost <= bound})
    return out


def digest(run_dir: Path) -> tuple[int, str]:
    from podkit.checkpoint import CheckpointManager

    return CheckpointManager(str(run_dir / "checkpoints")).digest()


def show_parts(wall) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in wall.parts.items() if v >= 0.05)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs" / "gpt_small.toml"))
    p.add_argument("--minutes", type=float, default=10.0,
                   help=f"training length of the uninterrupted run ({STEPS_PER_MINUTE} steps a "
                        "minute, rounded to whole executions of 10)")
    p.add_argument("--steps", type=int, default=None, help="instead of --minutes")
    p.add_argument("--kill-every", type=parse_every, default=(60.0, 120.0), metavar="A:B",
                   help="seconds between kills, uniform in [A, B] (default 60:120)")
    p.add_argument("--kills", type=int, default=None, help="at most this many kills")
    p.add_argument("--seed", type=int, default=0, help="of the kills' times and processes")
    p.add_argument("--delete-local", action="store_true",
                   help="also delete the killed process's local checkpoint tier")
    p.add_argument("--persistent-every", type=int, default=0,
                   help="checkpoint.every_steps (default: a fifth of the run)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="passed to podkit train in both runs (repeatable)")
    p.add_argument("--reference", default=None, metavar="RUN_DIR",
                   help="an earlier run of this bench's reference (same config and steps) "
                        "instead of running it again")
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="one compilation cache for both runs (default: each run its own, so "
                        "both start cold; a shared one gives the chaos run's first start the "
                        "reference's programs)")
    p.add_argument("--where", default=None, help="directory for the runs (default: a temp dir)")
    p.add_argument("--no-targets", action="store_true",
                   help="check only that the weights are bit-identical")
    args = p.parse_args()
    steps = args.steps or max(K, round(args.minutes * STEPS_PER_MINUTE / K) * K)
    if steps % K:
        raise SystemExit(f"--steps {steps}: give a multiple of {K} (whole executions)")
    args.config = str(Path(args.config).absolute())
    where = Path(args.where or tempfile.mkdtemp(prefix="podkit-chaos-")).absolute()
    where.mkdir(parents=True, exist_ok=True)
    mode = "kill + delete the local tier" if args.delete_local else "kill"
    print(f"chaos bench: {Path(args.config).name}, {steps} steps, 2 processes as 2 slices; "
          f"a kill every {args.kill_every[0]:g}-{args.kill_every[1]:g} s ({mode}), seed "
          f"{args.seed}; in {where}", flush=True)
    runs = {}
    if args.reference:
        ref_dir = Path(args.reference).absolute()
        import tomllib

        ref_steps = tomllib.loads((ref_dir / "config.toml").read_text())["train"]["steps"]
        if ref_steps != steps:
            raise SystemExit(f"--reference {ref_dir}: a run of {ref_steps} steps, not {steps}")
        runs["reference"] = {"name": "reference", "rc": 0, "run_dir": ref_dir, "kills": [],
                             "restores": []}
    else:
        print("reference (uninterrupted) ...", flush=True)
        runs["reference"] = run(args, where, "reference", steps, chaos=False)
    print("chaos ...", flush=True)
    runs["chaos"] = run(args, where, "chaos", steps, chaos=True)
    bad = [r for r in runs.values() if r["rc"] != 0]
    for r in bad:
        print(f"{r['name']}: the launch exited {r['rc']}; its output ({r['log']}):\n"
              + r["log"].read_text()[-3000:])
    if bad:
        return 1

    missed = []
    walls = {}
    for name, r in runs.items():
        rec, wall = accounting(r["run_dir"])
        walls[name] = (rec, wall)
        print(f"{name:<9} wall {wall.wall:6.1f} s, goodput {wall.goodput:.1%}, "
              f"{wall.restarts} restarts, {wall.lost_steps} steps redone; {show_parts(wall)}")
    ref_wall, chaos_wall = walls["reference"][1], walls["chaos"][1]
    share = chaos_wall.goodput / ref_wall.goodput
    step_s = ref_wall.parts["productive"] / steps
    print(f"chaos goodput / reference goodput: {share:.1%} (target >= {GOODPUT_SHARE:.0%}); "
          f"{len(runs['chaos']['kills'])} kills; the reference's step {step_s * 1e3:.0f} ms")
    # Cross-check: the same steps of useful work in both, so their walls' ratio is the goodput
    # share too, whatever the accounting counted as productive (a killed fit's steps past its
    # last log point that its successor redid are counted productive by the accounting
    # today: the chaos run's productive seconds exceed the reference's by about that).
    print(f"  cross-check: reference wall / chaos wall {ref_wall.wall / chaos_wall.wall:.1%}; "
          f"productive {chaos_wall.parts['productive'] - ref_wall.parts['productive']:+.1f} s "
          "against the reference's")
    if share < GOODPUT_SHARE:
        missed.append(f"goodput share {share:.1%} < {GOODPUT_SHARE:.0%}")
    rows = failures(*walls["chaos"], runs["chaos"]["kills"], step_s)
    print("  failure  process  last logged step  resumed from  lost steps  lost s  down s  "
          "restart s (startup, compile, restore)  cost s  bound s")
    for i, f in enumerate(rows, 1):
        kill = f["kill"] or {}
        restart = "-" if f["restart_s"] is None else (
            f"{f['restart_s']:.1f} ({f['startup_s']:.1f}, {f['compile_s']:.1f}, "
            f"{f['restore_s']:.1f})")
        print(f"  {i:>7}  {kill.get('process', '?'):>7}  {f['killed_step']:>16}  "
              f"{f['resumed']:>12}  {f['lost_steps']:>10}  {f['lost_s']:6.1f}  "
              f"{f['down_s']:6.1f}  {restart:>37}  {f['cost_s']:6.1f}  {f['bound_s']:7.1f}"
              f"{'' if f['ok'] else '  MISSED'}")
        if not f["ok"]:
            missed.append(f"failure {i} cost {f['cost_s']:.1f} s > {f['bound_s']:.1f} s")
    for line in runs["chaos"]["restores"]:
        print(f"  {line}")
    if len(rows) != len(runs["chaos"]["kills"]):
        print(f"  ({len(runs['chaos']['kills'])} kills, {len(rows)} restarts accounted: a kill "
              "before a restarted loop began is accounted as down time of the one before)")
    digests = {name: digest(r["run_dir"]) for name, r in runs.items()}
    same = digests["reference"] == digests["chaos"]
    for name, (step, d) in digests.items():
        print(f"{name:<9} digest {d} (step {step})")
    print("final weights: " + ("bit-identical" if same else "DIFFERENT"))
    if not runs["chaos"]["kills"]:
        print("no kill happened (the run ended first): nothing was tested")
        return 1
    if not same:
        return 1
    if missed and not args.no_targets:
        print("targets missed: " + "; ".join(missed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
