"""What monitoring costs: podkit with this issue's telemetry (a timeline thread, MFU, goodput,
gradient norm and learning rate in the step, TensorBoard event files) against podkit before
it, the same config and run directory, in one run.

    .venv/bin/python bench/monitor.py --baseline /path/to/old/src        # CPU: seed, gpt_small
    python bench/monitor.py --baseline .bench-baseline/src --configs gpt_124m   # a TPU host

`--baseline` is the `src/` of the podkit to compare against (a `git worktree` of the commit
before the observability work, e.g. `git worktree add /tmp/before e6856f7`, then
/tmp/before/src). Each side runs in a fresh process, rounds interleaved (this machine's speed
drifts): build the config's model, one warm-up fit (compiling), then a timed fit of `--steps`
steps with `run_dir=` (metrics.jsonl on both sides; the monitored side also writes
TensorBoard files and computes the telemetry). Printed: steady samples/s per side (median of
the rounds) and monitored / baseline; the target is >= 0.98.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"seed_mlp": ROOT / "configs" / "seed_mlp.toml",
           "gpt_small": ROOT / "configs" / "gpt_small.toml",
           "gpt_124m": ROOT / "configs" / "gpt_124m.toml"}


def child(args: argparse.Namespace) -> None:
    import jax
    import numpy as np

    import podkit as pk
    from podkit import config as config_lib
    from podkit import datasets
    from podkit.models import build_model

    cluster = pk.connect(cpu_devices=args.cpu_devices)
    del cluster
    config = config_lib.load(CONFIGS[args.config], args.set or [])
    data = datasets.load(config.data, seed=0)
    from podkit import runs  # both sides compile as `podkit train` does

    t = config.train
    with runs.strategy_from_config(config.strategy).scope():
        model = build_model(config.model, data.info, seed=0)
        runs.compile_from_config(model, t)
    x, y = data.train
    batch = config.data.batch_size
    # Whole executions; more steps than an epoch holds wrap around the data.
    steps = max(args.steps // t.steps_per_execution, 1) * t.steps_per_execution
    with tempfile.TemporaryDirectory() as run_dir:
        model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=t.steps_per_execution,
                  verbose=0, run_dir=run_dir)  # compiles
        jax.block_until_ready(model.state.params)
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=steps, verbose=0,
                  run_dir=run_dir, log_every=t.log_every)
        jax.block_until_ready(model.state.params)
        seconds = time.perf_counter() - start
        tb = os.path.isdir(os.path.join(run_dir, "tensorboard"))
    print(json.dumps({"samples_per_s": steps * batch / seconds, "steps": steps,
                      "seconds": seconds, "tensorboard": tb,
                      "devices": len(np.asarray(jax.devices()))}))


def run_side(src: str, config: str, steps: int, cpu_devices: int | None,
             overrides: list[str]) -> dict:
    # This side's podkit first; other entries (a TPU host's wheels) kept, other src/ dropped.
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).name != "src"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, *rest]))
    cmd = [sys.executable, __file__, "--child", "--config", config, "--steps", str(steps)]
    for item in overrides:
        cmd += ["--set", item]
    if cpu_devices:
        cmd += ["--cpu-devices", str(cpu_devices)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{src} {config} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="src/ of the podkit to compare against")
    parser.add_argument("--configs", nargs="+", default=["seed_mlp", "gpt_small"],
                        choices=sorted(CONFIGS))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-devices", type=int, default=None)
    parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                        help="a config override for every side (repeatable)")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--config", default="seed_mlp")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not args.baseline:
        raise SystemExit("--baseline PATH is required: the src/ of podkit before the "
                         "monitoring (e.g. a git worktree of the commit before it)")
    sides = {"baseline": args.baseline, "monitored": str(ROOT / "src")}
    for config in args.configs:
        got: dict[str, list[float]] = {s: [] for s in sides}
        for _ in range(args.rounds):
            for side, src in sides.items():
                got[side].append(run_side(src, config, args.steps, args.cpu_devices,
                                          args.set or [])["samples_per_s"])
        med = {s: statistics.median(v) for s, v in got.items()}
        print(f"{config}: baseline {med['baseline']:,.0f} samples/s, monitored "
              f"{med['monitored']:,.0f} samples/s -> monitored / baseline "
              f"{med['monitored'] / med['baseline']:.3f}  (rounds: "
              + "; ".join(f"{s} " + ", ".join(f"{v:,.0f}" for v in got[s]) for s in sides)
              + ")", flush=True)


if __name__ == "__main__":
    main()
