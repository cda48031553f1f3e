"""Checkpoint throughput, loop stall and recovery: podkit against the disk and plain Orbax.

    .venv/bin/python bench/checkpoint.py                  # ~1.2 GB state, 1 CPU device
    .venv/bin/python bench/checkpoint.py --gb 0.3 --skip-recovery

State: a Dense MLP (4096 -> H -> H -> 10, H chosen for --gb) compiled with Adam, so parameters
plus optimizer state weigh about --gb GB (float32). Every contestant writes and reads the same
arrays on the same disk, in one process, best of --repeats:

  raw      the same bytes written sequentially to one file (write + fsync) and read back:
           the disk's limit for this state (from host memory: on a TPU the copy off the chip
           is outside raw's times and inside orbax's and podkit's; so is the copy back)
  orbax    a plain Orbax StandardCheckpointer: save (until finished) and restore
  podkit   pk.checkpoint.CheckpointManager: save (until committed: checksums, manifests,
           commit record) and restore (every file verified against its checksum, then read)

The page cache is dropped before every read when this process may (root), so reads come from
the disk, not memory. Then:

  stall    fit() with a save every N steps: the time save() blocks the loop against the
           time the save takes until committed (the rest runs while training goes on)
  recovery `podkit launch --processes 2` running a checkpointed job; one worker is SIGKILLed:
           seconds to detection, to the restarted group, to the first step after the restore
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def build_model(gb: float):
    import podkit as pk

    # params ~= 4096*H + H*H + 10*H; state = 3x params (Adam) x 4 bytes
    target = gb * 1e9 / 12
    h = int((-(4106) + (4106**2 + 4 * target) ** 0.5) / 2) // 128 * 128
    with pk.Strategy(mesh={"data": 1}, devices=__import__("jax").devices()[:1]).scope():
        model = pk.Sequential([pk.layers.Dense(h, activation="relu"),
                               pk.layers.Dense(h, activation="relu"), pk.layers.Dense(10)])
        # One step an execution: the stall bench times the loop step by step.
        model.compile(optimizer="adam", steps_per_execution=1,
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    import numpy as np

    # One step, so the optimizer's moments hold real numbers (zeros compress to nothing).
    rng = np.random.default_rng(0)
    model.fit(rng.standard_normal((8, 4096), dtype=np.float32), rng.integers(0, 10, 8),
              batch_size=8, epochs=1, verbose=0)
    return model, h


def nbytes(tree) -> int:
    import jax

    return sum(a.nbytes for a in jax.tree.leaves(tree))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_raw(state, where: Path) -> tuple[float, float]:
    import jax
    import numpy as np

    arrays = [np.asarray(a) for a in jax.tree.leaves(state)]
    path = where / "raw.bin"

    def write():
        with open(path, "wb") as f:
            for a in arrays:
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
            f.flush()
            os.fsync(f.fileno())

    def read():
        with open(path, "rb") as f:
            for a in arrays:
                buf = np.empty(a.shape, a.dtype)
                f.readinto(memoryview(buf).cast("B"))

    w = timed(write)
    drop_caches()
    r = timed(read)
    path.unlink()
    return w, r


def bench_orbax(state, abstract, where: Path) -> tuple[float, float]:
    import orbax.checkpoint as ocp

    from podkit.checkpoint.arrays import abstract_targets, flatten

    flat = flatten(state)
    targets, _ = abstract_targets(abstract)
    ckptr = ocp.StandardCheckpointer()
    path = (where / "orbax").absolute()

    def save():
        ckptr.save(path, flat, force=True)
        ckptr.wait_until_finished()

    w = timed(save)
    drop_caches()
    r = timed(lambda: ocp.StandardCheckpointer().restore(path, targets))
    shutil.rmtree(path)
    return w, r


def bench_podkit(state, abstract, sums, where: Path, step: int) -> tuple[float, float, float]:
    from podkit.checkpoint import CheckpointManager

    manager = CheckpointManager(where / "podkit", keep=1)
    tree = {"state": state, "sums": sums}
    t0 = time.perf_counter()
    manager.save(step, tree, meta={"position": {"epoch": 0, "execution": 0,
                                                "steps_in_epoch": 0}})
    blocking = time.perf_counter() - t0
    manager.wait()
    w = time.perf_counter() - t0
    drop_caches()
    import jax

    zeros = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                         sums)
    r = timed(lambda: manager.restore({"state": abstract, "sums": zeros}))
    manager.close()
    return w, r, blocking


def bench_stall(model, where: Path, every: int, steps: int, copy_on_thread: bool = True) -> dict:
    """fit() with a save every `every` steps against the same fit without: the seconds the
    loop spent inside save() (waiting for the previous save included) against the seconds
    saves were in flight, and the mean step time of the steps that ran while a save was in
    flight against the mean step time without saves. `copy_on_thread=False`: the copy off
    an accelerator awaited inside save(), as before issue 52 (podkit's way with several
    processes)."""
    import numpy as np

    import podkit as pk
    from podkit.checkpoint import CheckpointManager, arrays

    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * 8, 4096), dtype=np.float32)
    y = rng.integers(0, 10, steps * 8).astype(np.int32)
    model.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)  # compile

    class Ends(pk.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.times = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    plain = Ends()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[plain])
    windows, blocks = [], []  # (save() called, committed); seconds inside save()

    class Probe(CheckpointManager):
        def save(self, *a, **k):
            t0 = time.perf_counter()
            super().save(*a, **k)
            blocks.append(time.perf_counter() - t0)
            windows.append([t0, None])

        def wait(self):
            had = self._thread is not None
            super().wait()
            if had and windows and windows[-1][1] is None:
                windows[-1][1] = windows[-1][0] + blocks[-1] + self.last_commit_s

    manager = Probe(where / f"stall-{copy_on_thread}", every_steps=every, keep=1)
    saving = Ends()
    possible = arrays.host_copy_possible
    if not copy_on_thread:
        arrays.host_copy_possible = lambda flat: False
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, checkpoint=manager,
                  callbacks=[saving])
    finally:
        arrays.host_copy_possible = possible
    manager.wait()
    ends = saving.times
    # A step "during a save": it started after a save() returned and ended before the commit.
    during = [b - a for a, b in zip(ends, ends[1:], strict=False)
              if any(s + blk <= a and e is not None and b <= e
                     for (s, e), blk in zip(windows, blocks, strict=True))]
    plain_steps = np.diff(plain.times[1:])  # the first step's dispatch is not a step's time
    return {"saves": len(blocks), "block_s": sum(blocks),
            "saving_s": sum(e - s for s, e in windows if e is not None),
            "during": len(during), "during_step_s": float(np.mean(during)) if during else None,
            "plain_step_s": float(np.mean(plain_steps))}


def config_stall(records: list[dict], every: int) -> dict:
    """From a run's metrics.jsonl records (one per execution): the step time over the spans
    around each save (two records before its step to two after: the blocking and the bytes
    written while the loop goes on) against the spans of four records away from saves.
    Record times are when the loop logged, which with asynchronous dispatch lags the device
    by an execution, so a span is never shorter than four records; validation and compile
    time are taken out."""
    import numpy as np

    recs = [r for r in records if "time" in r and "val_loss" not in r]

    def span(a: dict, b: dict) -> float:
        held = sum(b.get(f"time/{w}_s", 0.0) - a.get(f"time/{w}_s", 0.0)
                   for w in ("validation", "compile"))
        return (b["time"] - a["time"] - held) / (b["step"] - a["step"])

    at = {r["step"]: i for i, r in enumerate(recs)}
    saves = [s for s in at if s % every == 0 and at[s] >= 3 and at[s] + 2 < len(recs)]
    during = [span(recs[at[s] - 2], recs[at[s] + 2]) for s in saves]
    near = {i for s in saves for i in range(at[s] - 2, at[s] + 2)}
    away = [span(recs[i], recs[i + 4]) for i in range(1, len(recs) - 4)  # not the first
            if not near & set(range(i, i + 4)) and recs[i + 4]["step"] % every]
    blocked = [recs[at[s] + 2].get("checkpoint_s", 0.0) - recs[at[s] - 2].get("checkpoint_s", 0.0)
               for s in saves]
    return {"saves": len(saves), "during_s": float(np.mean(during)) if during else None,
            "away_s": float(np.mean(away)) if away else None,
            "blocked_s": float(np.mean(blocked)) if blocked else None}


def bench_config_stall(config: str, where: Path, every: int, sets: list[str]) -> None:
    """`podkit train CONFIG` (a fresh process) saving every `every` steps, logging every
    execution: the step time around saves against away from them (config_stall) and the
    loop's seconds blocked per save."""
    run = where / "runs" / "stall"
    cmd = [sys.executable, "-c", "from podkit.cli import main; main()", "train",
           str(Path(config).absolute()), "--set", f"run.dir={where / 'runs'}",
           "--set", "run.name=stall", "--set", f"checkpoint.every_steps={every}"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"podkit train failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    r = config_stall(records, every)
    if r["during_s"] is None or r["away_s"] is None:
        raise SystemExit(f"too few executions around and away from the saves: {r}; run more "
                         "steps, or save less often (--save-every)")
    print(f"  {Path(config).name}: {r['saves']} saves: {r['during_s'] * 1e3:.1f} ms a step "
          f"around a save against {r['away_s'] * 1e3:.1f} ms away from saves "
          f"({r['during_s'] / r['away_s']:.3f}x, target <= 1.05x); the loop blocked "
          f"{r['blocked_s']:.3f} s a save (checkpoint_s)")


def bench_recovery(where: Path) -> dict:
    """Kill one of two workers under `podkit launch`; time detection, restart, first step."""
    events = where / "events.jsonl"
    ck = where / "recovery"
    cmd = [sys.executable, "-m", "podkit.cli", "launch", "--processes", "2",
           "--cpu-devices-per-process", "1", "--max-restarts", "2", "--backoff", "0.1",
           "--stop-timeout", "1", "--all-output",  # it reads process 1's lines
           "--events", str(events), "--", sys.executable, str(ROOT / "tests" / "ckpt_job.py"),
           str(where / "out.json"), str(ck), "epochs=6", "every=4", "sleep=0.05", "stamp=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    killed_at = None
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"^\[1\] first-step (\S+) pid (\d+)", line)
        if m and killed_at is None:
            deadline = time.monotonic() + 120  # once a checkpoint is committed
            while not any((d / "COMMIT.json").exists() for d in ck.glob("step_*")) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)
            killed_at = time.time()
            os.kill(int(m.group(2)), signal.SIGKILL)
    proc.wait(timeout=120)
    out = "".join(lines)
    recs = [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else []
    failure = next((r for r in recs if r.get("event") == "failure"), None)
    restart = next((r for r in recs if r.get("event") == "start" and r.get("restart", 0) > 0),
                   None)
    resumed = [float(m.group(1)) for m in re.finditer(r"first-step (\S+) pid \d+ resumed", out)]
    return {"rc": proc.returncode, "killed_at": killed_at, "failure": failure,
            "restart": restart, "first_step_after": min(resumed) if resumed else None,
            "log_tail": out[-1500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.2, help="state size (GB)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--skip-recovery", action="store_true")
    parser.add_argument("--steps", type=int, default=48, help="steps of the stall fit()")
    parser.add_argument("--config", default=None,
                        help="instead: podkit train CONFIG with saves every --save-every steps")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="with --config: passed to podkit train (repeatable)")
    parser.add_argument("--save-every", type=int, default=16,
                        help="its saves' interval (steps); saves due while one is in flight "
                             "wait for it, inside save(). With --config: at least 8 "
                             "executions, so that spans away from saves exist")
    args = parser.parse_args()
    if args.config:
        where = Path(args.dir or tempfile.mkdtemp(prefix="podkit-bench-ckpt-"))
        bench_config_stall(args.config, where, args.save_every, args.set)
        return 0
    import podkit as pk

    pk.connect(cpu_devices=1)
    where = Path(args.dir or tempfile.mkdtemp(prefix="podkit-bench-ckpt-"))
    where.mkdir(parents=True, exist_ok=True)
    model, h = build_model(args.gb)
    state = model.state
    size = nbytes(state)
    import jax

    sums = jax.device_put({"loss": {"total": jax.numpy.zeros(()), "count": jax.numpy.zeros(())}})
    cold = drop_caches()
    print(f"checkpoint bench: state {size / 1e9:.2f} GB (Dense 4096->{h}->{h}->10 + Adam) on "
          f"{jax.devices()[0].device_kind}, disk {where}, page cache dropped before reads: "
          f"{cold}, best of {args.repeats}")
    rows = {"raw": [], "orbax": [], "podkit": []}
    blocking = []
    for r in range(args.repeats):
        rows["raw"].append(bench_raw(state, where))
        rows["orbax"].append(bench_orbax(state, model.layout.abstract, where))
        w, rd, b = bench_podkit(state, model.layout.abstract, sums, where, step=r + 1)
        rows["podkit"].append((w, rd))
        blocking.append(b)
        shutil.rmtree(where / "podkit", ignore_errors=True)
    best = {k: (min(v[0] for v in vals), min(v[1] for v in vals)) for k, vals in rows.items()}
    gb = size / 1e9
    for k, (w, rd) in best.items():
        print(f"  {k:<8} save {w:6.2f} s ({gb / w:5.2f} GB/s)   restore {rd:6.2f} s "
              f"({gb / rd:5.2f} GB/s)")
    # Targets: on CPU save >= 0.8x raw; with the state on an accelerator (its copy to host
    # and back inside podkit's times, not raw's) save and restore >= 0.7x.
    target = "0.8x" if jax.default_backend() == "cpu" else "0.7x"
    print(f"  ratio podkit/raw:   save {best['raw'][0] / best['podkit'][0]:.2f}x (target >= "
          f"{target})   restore {best['raw'][1] / best['podkit'][1]:.2f}x (target >= 0.7x)")
    print(f"  ratio podkit/orbax: save {best['orbax'][0] / best['podkit'][0]:.2f}x   restore "
          f"{best['orbax'][1] / best['podkit'][1]:.2f}x")
    print(f"  save() blocked the caller {min(blocking):.2f} s of a {best['podkit'][0]:.2f} s "
          f"save ({min(blocking) / best['podkit'][0]:.1%})")
    ways = [True] if jax.default_backend() == "cpu" else [False, True]
    for way in ways:
        stall = bench_stall(model, where, every=args.save_every, steps=args.steps,
                            copy_on_thread=way)
        how = "" if len(ways) == 1 else (" (copy off the device on the save thread)" if way
                                         else " (copy off the device awaited in save())")
        share = stall["block_s"] / max(stall["saving_s"], 1e-9)
        during = ("no step ran during a save" if stall["during_step_s"] is None else
                  f"{stall['during']} steps during saves: "
                  f"{stall['during_step_s'] * 1e3:.2f} ms a step against "
                  f"{stall['plain_step_s'] * 1e3:.2f} ms without saves "
                  f"({stall['during_step_s'] / stall['plain_step_s']:.3f}x, target <= 1.05x)")
        print(f"  stall in fit(){how}: {stall['saves']} saves, the loop inside save() "
              f"{stall['block_s']:.2f} s of {stall['saving_s']:.2f} s of saving ({share:.1%}, "
              f"target < 5%); {during}")
    if not args.skip_recovery:
        rec = bench_recovery(where)
        if rec["failure"] and rec["restart"] and rec["first_step_after"] and rec["killed_at"]:
            k = rec["killed_at"]
            print(f"  recovery after SIGKILL of 1 of 2 workers: detected "
                  f"{rec['failure']['time'] - k:.2f} s, group restarted "
                  f"{rec['restart']['time'] - k:.2f} s, first step after restore "
                  f"{rec['first_step_after'] - k:.2f} s (launcher exit {rec['rc']})")
        else:
            print("  recovery: could not measure\n" + rec["log_tail"])
    if not args.dir:
        shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
