"""Calibration of podkit's pod simulator (podkit.sim) on the machines we have.

    python bench/sim_calibrate.py tpu --out tpu.json      # on a TPU host, ~5 minutes
    python bench/sim_calibrate.py fit tpu.json            # here: fit, predict, print errors

`tpu` measures, on one chip: the bfloat16 matmul rate (8192^3), the HBM bandwidth (a 2 GiB
copy: read + write), podkit's GPT step (configs/gpt_124m.toml's model, as bench/tpu.py runs
it) at two batch sizes, and ResNet-50 (bench/tpu.py's), each with the Program the simulator
reads from the step XLA compiled for that chip (FLOPs, bytes accessed, memory).

`fit` fits the chip's efficiencies on part of the measurements and predicts the rest:
  matmul efficiency  from the GPT step at the first batch size (compute-bound),
  memory efficiency  from ResNet-50's step (where the roofline's bytes term leads),
then predicts the GPT step at the second batch size, which no fit saw (target: within 15%).
The fitted values go to src/podkit/sim/calibration.toml (`--write`), which podkit.sim reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/tpu.py's contestants


def hbm_bandwidth(gib: float = 2.0, repeats: int = 5) -> float:
    """Bytes/s of a copy of `gib` GiB on the default device: read + write, best of repeats."""
    import jax
    import jax.numpy as jnp

    n = int(gib * 2**30 // 4)
    x = jnp.ones((n,), jnp.float32)
    copy = jax.jit(lambda a: a * 1.0000001)  # one read and one write of every element
    copy(x).block_until_ready()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        copy(x).block_until_ready()
        best = max(best, 2 * n * 4 / (time.perf_counter() - start))
    return best


def gpt_point(args: argparse.Namespace, batch: int) -> dict:
    """podkit's GPT-124M step at `batch` sequences (one microbatch): its time and Program."""
    import podkit as pk
    import tpu as bench_tpu
    from podkit.models.gpt import build_gpt
    from podkit.sim.program import extract_model

    measured = bench_tpu.bench_podkit(args, batch=batch, microbatches=1)
    config, table = bench_tpu.gpt_config()
    seq, vocab = table["data"]["seq_len"], table["data"]["vocab_size"]
    x, y = bench_tpu.tokens(batch, seq, vocab)
    with pk.DataParallel().scope():
        net = build_gpt(config, {"vocab_size": vocab, "seq_len": seq})
        net.compile(optimizer=pk.optimizers.AdamW(learning_rate=6e-4, weight_decay=0.1),
                    loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=10)
    program = extract_model(net, x, y, batch, model_kind="transformer",
                            tokens_per_sample=seq)
    return {"batch": batch, "step_s": 1 / measured["steps_per_s"], "measured": measured,
            "program": program.to_json()}


def resnet_point(args: argparse.Namespace) -> dict:
    import numpy as np

    import podkit as pk
    import tpu as bench_tpu
    from podkit.config import ResNetConfig
    from podkit.models.resnet import build_resnet
    from podkit.sim.program import extract_model

    measured = bench_tpu.bench_resnet(args)
    batch = 128  # bench_resnet's
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 224, 224, 3), dtype=np.float32)
    y = rng.integers(0, 1000, (batch,), dtype=np.int32)
    with pk.DataParallel().scope():
        model = build_resnet(ResNetConfig(depth=50, precision="mixed_bfloat16"),
                             {"classes": 1000, "image_shape": (224, 224, 3)})
        model.compile(optimizer=pk.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=4)
    program = extract_model(model, x, y, batch, model_kind="resnet")
    return {"batch": batch, "step_s": batch / measured["images_per_s"], "measured": measured,
            "program": program.to_json()}


def measure_tpu(args: argparse.Namespace) -> None:
    import jax

    import tpu as bench_tpu

    device = jax.devices()[0]
    args.clock = bench_tpu.CompileClock()
    out = {"device": device.device_kind, "matmul_flops_per_s": bench_tpu.measured_peak(),
           "hbm_bytes_per_s": hbm_bandwidth()}
    print(json.dumps(out), flush=True)
    out["gpt"] = [gpt_point(args, b) for b in args.batches]
    for point in out["gpt"]:
        print(f"gpt batch {point['batch']}: {point['step_s'] * 1e3:.1f} ms/step", flush=True)
    out["resnet"] = resnet_point(args)
    print(f"resnet: {out['resnet']['step_s'] * 1e3:.1f} ms/step", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


def fit(args: argparse.Namespace) -> None:
    from podkit.sim import hardware as hw
    from podkit.sim.program import Program
    from podkit.sim.step import Efficiency, estimate

    data = json.loads(Path(args.measurements).read_text())
    chip = hw.chip(args.chip)
    pod = hw.Pod(chip, tuple(1 for _ in range(chip.torus_dims or 2)),
                 tuple(False for _ in range(chip.torus_dims or 2)))
    print(f"{data['device']}: matmul {data['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s measured "
          f"({data['matmul_flops_per_s'] / chip.peak_flops:.1%} of the {chip.name} peak); HBM "
          f"copy {data['hbm_bytes_per_s'] / 1e9:.0f} GB/s "
          f"({data['hbm_bytes_per_s'] / chip.hbm_bandwidth:.1%} of spec)")
    gpt = [(p["batch"], p["step_s"], Program.from_json(p["program"])) for p in data["gpt"]]
    res = data["resnet"]
    resnet = (res["step_s"], Program.from_json(res["program"]))
    # matmul efficiency from the first GPT point (its FLOPs lead); memory from ResNet's bytes.
    batch0, t0, p0 = gpt[0]
    matmul = (p0.flops + p0.recompute_flops) / (chip.peak_flops * t0)
    memory = resnet[1].bytes_accessed / (chip.hbm_bandwidth * resnet[0])
    eff = Efficiency(min(matmul, 1.0), min(memory, 1.0), 0.9, 0.0,
                     f"fitted: GPT-124M batch {batch0}, ResNet-50 batch {res['batch']}")
    print(f"fitted: matmul efficiency {eff.matmul:.3f}, memory efficiency {eff.memory:.3f}")
    rows = []
    for batch, t, p in gpt:
        e = estimate(p, pod, eff)
        rows.append(("gpt", batch, t, e.step_time_s, e.bound, batch == batch0))
    e = estimate(resnet[1], pod, eff)
    rows.append(("resnet-50", res["batch"], resnet[0], e.step_time_s, e.bound, True))
    print(f"{'model':<10} {'batch':>5} {'measured':>10} {'predicted':>10} {'error':>7}  bound")
    for name, batch, t, pred, bound, fitted in rows:
        print(f"{name:<10} {batch:>5} {t * 1e3:>8.1f}ms {pred * 1e3:>8.1f}ms "
              f"{(pred - t) / t:>+7.1%}  {bound}{'  (fitted)' if fitted else ''}")
    if args.write:
        path = hw.CALIBRATION
        text = path.read_text() if path.exists() else ""
        text += (f"\n[efficiency.{chip.name}]\nmatmul = {eff.matmul:.4f}\n"
                 f"memory = {eff.memory:.4f}\noverlap = {eff.overlap}\n"
                 f"source = \"{eff.source} (bench/sim_calibrate.py fit)\"\n")
        path.write_text(text)
        print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("tpu", help="measure on a TPU chip")
    t.add_argument("--out", default="tpu_calibration.json")
    t.add_argument("--batches", type=int, nargs=2, default=[16, 32])
    t.add_argument("--steps", type=int, default=30)
    f = sub.add_parser("fit", help="fit efficiencies on measurements and predict")
    f.add_argument("measurements")
    f.add_argument("--chip", default="tpu-v5e")
    f.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.mode == "tpu":
        measure_tpu(args)
    else:
        fit(args)


if __name__ == "__main__":
    main()
