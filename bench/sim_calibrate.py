"""Calibration of podkit's pod simulator (podkit.sim) on the machines we have.

    python bench/sim_calibrate.py tpu --out tpu.json      # on a TPU host, ~5 minutes
    python bench/sim_calibrate.py fit tpu.json            # here: fit, predict, print errors
    python bench/sim_calibrate.py cpu --out cpu.json      # this machine, ~5 minutes, alone
    python bench/sim_calibrate.py fit-cpu cpu.json        # fit, predict, print errors

`cpu` measures, on this machine: one core's float32 matmul and copy rates; all-reduce and
all-gather from 1 KB to 64 MB on five job shapes (2 and 4 gloo processes of one device, 2
processes of 2 devices, 2 and 4 devices of one process), interleaved; and podkit's step of a
small GPT on 1 device (on one core and on all), on 2 and 4 devices and on 2 processes x 2
devices, each with its Program. `fit-cpu` fits each shape's collective terms per kind on
every other size (podkit.sim.cpu's latency, in-cache and beyond-cache bandwidth), the step's
efficiency and spread fraction on the two 1-device steps, then predicts the other sizes and
the multi-device steps (target: within 25%).

`tpu` measures, on one chip: the bfloat16 matmul rate (8192^3), the HBM bandwidth (a 2 GiB
copy: read + write), podkit's GPT step (configs/gpt_124m.toml's model, as bench/tpu.py runs
it) at two batch sizes, and ResNet-50 (bench/tpu.py's), each with the Program the simulator
reads from the step XLA compiled for that chip (FLOPs, bytes accessed, memory).

`fit` fits the chip's efficiencies on part of the measurements and predicts the rest. Each
model is fitted on its smallest batch and predicted at the other (target: within 15%):
  matmul efficiency  from the GPT step (its FLOPs are matmuls and lead its roofline),
  conv efficiency    from ResNet-50's step, with the memory factor: one step cannot tell its
                     convolutions' time from its memory time (XLA's bytes count), so each is
                     set to give the measured time alone.
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
    import tpu as bench_tpu
    from podkit.sim.program import extract_model

    measured = bench_tpu.bench_podkit(args, batch=batch, microbatches=1)
    config, table = bench_tpu.gpt_config()
    seq, vocab = table["data"]["seq_len"], table["data"]["vocab_size"]
    x, y = bench_tpu.tokens(batch, seq, vocab)
    net = bench_tpu.gpt_model(config, seq, vocab)
    program = extract_model(net, x, y, batch, model_kind="transformer",
                            tokens_per_sample=seq)
    return {"batch": batch, "step_s": 1 / measured["steps_per_s"], "measured": measured,
            "program": program.to_json()}


def resnet_point(args: argparse.Namespace, batch: int) -> dict:
    import numpy as np

    import tpu as bench_tpu
    from podkit.sim.program import extract_model

    measured = bench_tpu.bench_resnet(args, batch=batch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 224, 224, 3), dtype=np.float32)
    y = rng.integers(0, 1000, (batch,), dtype=np.int32)
    program = extract_model(bench_tpu.resnet50_model(), x, y, batch, model_kind="resnet")
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
    out["resnet"] = [resnet_point(args, b) for b in args.resnet_batches]
    for point in out["resnet"]:
        print(f"resnet batch {point['batch']}: {point['step_s'] * 1e3:.1f} ms/step", flush=True)
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
    # Each model is fitted on its smallest batch and predicted at the others.
    gpt = sorted((p["batch"], p["step_s"], Program.from_json(p["program"]))
                 for p in data["gpt"])
    resnet = sorted((p["batch"], p["step_s"], Program.from_json(p["program"]))
                    for p in data["resnet"])
    peak, hbm = chip.peak_flops, chip.hbm_bandwidth
    # matmul: the GPT point (its FLOPs are matmuls, and they lead its roofline).
    batch0, t0, p0 = gpt[0]
    matmul = (p0.flops + p0.recompute_flops) / (peak * t0)
    # conv and memory: the ResNet-50 point. Its step is at once its convolutions' time
    # and (XLA's bytes count) its memory time: one step cannot tell them apart, so each is set
    # to give the measured time alone; the memory factor comes out above 1 (XLA's count
    # includes operands that stay on chip), and the GPT steps stay compute-bound under it.
    rbatch0, rt0, rp0 = resnet[0]
    dot_s = (rp0.flops - rp0.conv_flops) / (peak * matmul)
    conv = rp0.conv_flops / (peak * (rt0 - dot_s))
    memory = max(rp0.bytes_accessed / (hbm * rt0), p0.bytes_accessed / (hbm * t0))
    eff = Efficiency(min(matmul, 1.0), memory, 0.9, 0.0,
                     f"fitted on a {data['device']}: GPT-124M batch {batch0}, ResNet-50 batch "
                     f"{rbatch0}", conv=min(conv, 1.0))
    print(f"fitted: matmul efficiency {eff.matmul:.3f}, conv efficiency {eff.conv:.3f}, "
          f"memory factor {eff.memory:.3f} (the HBM copy measured "
          f"{data['hbm_bytes_per_s'] / hbm:.3f}: XLA counts "
          f"{eff.memory / (data['hbm_bytes_per_s'] / hbm):.2f}x ResNet-50's HBM traffic)")
    rows = []
    for name, points, first in (("gpt", gpt, batch0), ("resnet-50", resnet, rbatch0)):
        for batch, t, p in points:
            e = estimate(p, pod, eff)
            rows.append((name, batch, t, e.step_time_s, e.bound, batch == first))
    print(f"{'model':<10} {'batch':>5} {'measured':>10} {'predicted':>10} {'error':>7}  bound")
    for name, batch, t, pred, bound, fitted in rows:
        print(f"{name:<10} {batch:>5} {t * 1e3:>8.1f}ms {pred * 1e3:>8.1f}ms "
              f"{(pred - t) / t:>+7.1%}  {bound}{'  (fitted)' if fitted else ''}")
    if args.write:
        write_table(f"efficiency.{chip.name}", {
            "matmul": round(eff.matmul, 4), "conv": round(eff.conv, 4),
            "memory": round(eff.memory, 4), "overlap": eff.overlap,
            "source": f"{eff.source} (bench/sim_calibrate.py fit)"})


def write_table(name: str, values: dict) -> None:
    """Sets the table [name] of src/podkit/sim/calibration.toml (replacing it if there), which
    podkit.sim reads: the file is this script's output, one table per calibrated thing."""
    import re

    from podkit.sim import hardware as hw

    path = hw.CALIBRATION
    text = path.read_text() if path.exists() else (
        "# Written by bench/sim_calibrate.py (fit, fit-cpu --write): measured values that\n"
        "# podkit.sim reads over its defaults. Regenerate rather than edit.\n")
    text = re.sub(rf"\n\[{re.escape(name)}\]\n(?:[^\[\n][^\n]*\n|\n(?!\[))*", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text.rstrip("\n"))
    path.write_text(text + "\n\n" + _toml_table(name, values))
    print(f"wrote [{name}] to {path}")


SIZES = tuple(4 ** k * 1024 for k in range(9))  # 1 KB .. 64 MB
FIT_SIZES = SIZES[0:8:2]  # 1 KB, 16 KB, 256 KB, 4 MB: latency and in-cache bandwidth
LARGEST = SIZES[-1]  # 64 MB: beyond the last-level cache
GPT_SETS = ["model.layers=2", "model.embed=256", "model.heads=4", "model.mlp=1024",
            "data.seq_len=128", "data.vocab_size=2048", "model.scan_layers=false",
            "model.vocab_chunk=0", "model.precision=float32"]
GPT_BATCH = 16


ROUNDS = 30


def _interleaved(cases: list, rounds: int) -> list[dict]:
    """Mean seconds of each case's collective, measured in `rounds` interleaved rounds: each
    round times every case for 10 MB's worth of calls (at most 40, at least 1). On a machine
    whose cores the job's processes and threads share, a collective's latency drifts between
    states lasting seconds (0.2 to 2.5 ms for the same 1 KB all-reduce between 2
    processes); interleaving spreads every case
    over the same states, and the mean is what a step pays. Every process of a job makes the
    same calls in the same order (a count from its own timings would leave one waiting
    forever in a collective the others never run), so the repetitions are fixed by size."""
    for _, _, fn, x in cases:
        for _ in range(2):
            fn(x).block_until_ready()
    total = [0.0] * len(cases)
    reps = [max(1, min(40, (10 << 20) // size)) for _, size, _, _ in cases]
    for _ in range(rounds):
        for i, (_, _, fn, x) in enumerate(cases):
            start = time.perf_counter()
            for _ in range(reps[i]):
                fn(x).block_until_ready()
            total[i] += time.perf_counter() - start
    return [{"kind": kind, "bytes": size, "seconds": total[i] / (rounds * reps[i])}
            for i, (kind, size, _, _) in enumerate(cases)]


def cpu_worker(args: argparse.Namespace) -> None:
    """One process of a measurement job (`cpu` starts them)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import podkit as pk

    procs, devices = args.processes, args.devices
    if args.cores:  # before XLA sizes its thread pool (it counts the CPUs it may run on)
        import os
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])
    if procs > 1:
        pk.connect(cpu_devices=devices, coordinator=args.coordinator, num_processes=procs,
                   process_id=args.process_id)
    else:
        pk.connect(cpu_devices=devices)
    out: dict = {"processes": procs, "devices": devices}
    mesh = jax.make_mesh((procs * devices,), ("x",))
    n = procs * devices
    if args.what == "collectives":
        spec = NamedSharding(mesh, P("x"))
        reduce = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh,
                                       in_specs=P("x"), out_specs=P("x")))
        gather = jax.jit(jax.shard_map(lambda a: jax.lax.all_gather(a, "x", tiled=True),
                                       mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        cases = []
        for size in SIZES:
            per = size // 4  # float32 elements of one device's array
            for kind, fn, local in (("all-reduce", reduce, per), ("all-gather", gather,
                                                                  max(per // n, 1))):
                host = np.ones((n * local,), np.float32)
                x = jax.make_array_from_callback(host.shape, spec, lambda i, h=host: h[i])
                cases.append((kind, size, fn, x))
        rows = _interleaved(cases, ROUNDS)
        out["collectives"] = rows
    else:  # the GPT step
        from podkit.sim.program import extract
        out["step"] = _gpt_step(n)
        if procs == 1 and not args.cores:
            mesh_shape = {"data": n} if n > 1 else {"data": 1}
            out["program"] = extract(str(HERE.parent / "configs/gpt_small.toml"), mesh_shape,
                                     overrides=[*GPT_SETS, f"data.batch_size={GPT_BATCH}"],
                                     global_batch=GPT_BATCH).to_json()
        alone = procs == 1 and n == 1 and args.cores == 1  # one core's rates
        out["matmul_flops_per_s"] = _matmul_rate() if alone else None
        out["copy_bytes_per_s"] = hbm_bandwidth(0.25) if alone else None
    if jax.process_index() == 0:
        Path(args.out).write_text(json.dumps(out, default=str))


def _matmul_rate() -> float:
    from gpt import matmul_peak

    return matmul_peak(1024, "float32", calls=8, repeats=5)


def _gpt_step(devices: int) -> float:
    """Seconds per step of podkit's fit() on the small GPT (data parallel over all devices)."""
    import numpy as np

    import podkit as pk
    from podkit.config import load as load_config
    from podkit.models.gpt import build_gpt

    config = load_config(HERE.parent / "configs/gpt_small.toml", list(GPT_SETS))
    seq, vocab = config.data.seq_len, config.data.vocab_size
    x = np.random.default_rng(0).integers(0, vocab, (GPT_BATCH * 40, seq + 1), np.int32)
    with pk.DataParallel().scope():
        net = build_gpt(config.model, {"vocab_size": vocab, "seq_len": seq})
        net.compile(optimizer=pk.optimizers.AdamW(learning_rate=1e-3),
                    loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=5)
    net.fit(x[:, :-1], x[:, 1:], batch_size=GPT_BATCH, epochs=1, steps_per_epoch=10,
            verbose=0)
    start = time.perf_counter()
    net.fit(x[:, :-1], x[:, 1:], batch_size=GPT_BATCH, epochs=1, steps_per_epoch=30,
            verbose=0)
    return (time.perf_counter() - start) / 30


def _run_job(processes: int, devices: int, what: str, out: Path, cores: int = 0) -> dict:
    import os
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    procs = [subprocess.Popen(
        [sys.executable, __file__, "cpu-worker", "--what", what, "--processes", str(processes),
         "--devices", str(devices), "--process-id", str(i), "--coordinator",
         f"127.0.0.1:{port}", "--out", str(out), "--cores", str(cores)], env=env)
        for i in range(processes)]
    for p in procs:
        if p.wait(timeout=900) != 0:
            raise SystemExit(f"a {what} worker ({processes}x{devices}) failed: {p.returncode}")
    return json.loads(out.read_text())


COLLECTIVE_JOBS = ((2, 1), (4, 1), (2, 2), (1, 2), (1, 4))  # processes x devices
STEP_JOBS = ((1, 1, 1), (1, 1, 0), (1, 2, 0), (1, 4, 0), (2, 2, 0))  # ..., cores (0: all)


def _job_key(procs: int, devices: int, cores: int = 0) -> str:
    return f"{procs}x{devices}" + (f"-{cores}core" if cores else "")


def _cache_bytes() -> int:
    """The last-level cache's size (Linux: sysfs), 32 MiB where it cannot be read."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best = 0
    for index in base.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KM")) * scale)
    return best or 32 << 20


def measure_cpu(args: argparse.Namespace) -> None:
    import tempfile

    tmp = Path(tempfile.mkdtemp())
    from podkit.sim import cpu

    if cpu.cores() < 2:
        raise SystemExit("bench/sim_calibrate.py cpu needs 2 cores or more: it measures how "
                         "devices and processes share them")
    result: dict = {"cores": cpu.cores(), "cache_bytes": _cache_bytes(), "collectives": {},
                    "steps": {}}
    for procs, devices in COLLECTIVE_JOBS:
        key = _job_key(procs, devices)
        result["collectives"][key] = _run_job(procs, devices, "collectives",
                                              tmp / f"c{key}.json")["collectives"]
        print(f"collectives {key}: done", flush=True)
    for procs, devices, cores in STEP_JOBS:
        key = _job_key(procs, devices, cores)
        result["steps"][key] = _run_job(procs, devices, "step", tmp / f"s{key}.json", cores)
        print(f"step {key}: {result['steps'][key]['step'] * 1e3:.1f} ms", flush=True)
    one_core = result["steps"][_job_key(1, 1, 1)]
    result["matmul_flops_per_s"] = one_core["matmul_flops_per_s"]  # one core's
    result["copy_bytes_per_s"] = one_core["copy_bytes_per_s"]
    Path(args.out).write_text(json.dumps(result, indent=1))


def fit_collectives(rows: list[dict], cache: int) -> dict[str, dict[str, float]]:
    """Each kind's latency, in-cache and beyond-cache bandwidth for one job shape: latency and
    in-cache bandwidth by least squares (relative error) on every other size within the
    cache (FIT_SIZES: 1 KB, 16 KB, 256 KB, 4 MB), the beyond-cache bandwidth on the largest
    (64 MB); the sizes between (4 KB, 64 KB, 1 MB, 16 MB) are left to predict."""
    import numpy as np

    out = {}
    for kind in ("all-reduce", "all-gather"):
        t = {r["bytes"]: r["seconds"] for r in rows if r["kind"] == kind}
        coeffs = np.array([[1 / t[s], s / t[s]] for s in FIT_SIZES])
        (latency, per_byte), *_ = np.linalg.lstsq(coeffs, np.ones(len(FIT_SIZES)), rcond=None)
        beyond = t[LARGEST] - latency
        if not (latency > 0 and per_byte > 0 and beyond > 0 and max(FIT_SIZES) <= cache
                < LARGEST):
            raise SystemExit(f"{kind}: the measured times {t} do not fit latency + bytes / "
                             f"bandwidth around a {cache >> 20} MB cache; measure again alone")
        out[kind] = {"latency": float(latency), "bandwidth": float(1 / per_byte),
                     "beyond_cache_bandwidth": LARGEST / beyond}
    return out


def fit_cpu(args: argparse.Namespace) -> None:
    import dataclasses
    import os
    import tempfile
    from unittest import mock

    from podkit.sim import cpu
    from podkit.sim import hardware as hw
    from podkit.sim.program import Program
    from podkit.sim.step import MEMORY_MAX, Efficiency, estimate

    data = json.loads(Path(args.measurements).read_text())
    cache = data["cache_bytes"]
    tables = {key: fit_collectives(rows, cache) for key, rows in data["collectives"].items()}
    errors = []
    print(f"{'job':<5} {'kind':<11} {'bytes':>9} {'measured':>10} {'predicted':>10} {'error':>7}")
    for key, rows in data["collectives"].items():
        for r in rows:
            m = cpu.Measured(**tables[key][r["kind"]], cache_bytes=cache)
            pred = m.seconds(r["bytes"])
            err = (pred - r["seconds"]) / r["seconds"]
            fitted = r["bytes"] in (*FIT_SIZES, LARGEST)
            if not fitted:
                errors.append(abs(err))
            print(f"{key:<5} {r['kind']:<11} {r['bytes']:>9} {r['seconds'] * 1e3:>8.3f}ms "
                  f"{pred * 1e3:>8.3f}ms {err:>+7.1%}{'  (fitted)' if fitted else ''}")
    print(f"collectives not fitted on: {len(errors)}, median |error| "
          f"{sorted(errors)[len(errors) // 2]:.1%}, max {max(errors):.1%}, within 25%: "
          f"{sum(e <= 0.25 for e in errors)}/{len(errors)}")
    # The chip's tiers, for job shapes not measured: a ring's latency per step and
    # bandwidth per device, from the in-cache terms of 2 processes (gloo) and 4 devices of
    # one process.
    net, dom = tables["2x1"]["all-reduce"], tables["1x4"]["all-reduce"]
    tiers = {"network_latency": net["latency"] / 2, "network_bandwidth": net["bandwidth"],
             "domain_latency": dom["latency"] / 6, "domain_bandwidth": dom["bandwidth"] * 3 / 2}
    rate, copy = data["matmul_flops_per_s"], data["copy_bytes_per_s"]
    steps = data["steps"]
    one = Program.from_json(steps["1x1"]["program"])
    alone, spread = steps[_job_key(1, 1, 1)]["step"], steps["1x1"]["step"]
    cores = data["cores"]
    # Fitted on the two 1-device steps: the one-core step sets the FLOPs' efficiency (its
    # memory term held at MEMORY_MAX: one step cannot tell the two apart, and XLA:CPU's bytes
    # count is every op's operands and results, most of which stay in the caches), the
    # all-cores step the fraction XLA:CPU spreads over the cores (Amdahl).
    matmul = (one.flops + one.recompute_flops) / (rate * alone)
    parallel = (1 - spread / alone) / (1 - 1 / cores)
    eff = Efficiency(min(matmul, 1.0), MEMORY_MAX, 0.0, 0.0,
                     "fitted: podkit's small GPT step on 1 device, on 1 core and on all",
                     parallel=min(max(parallel, 1e-3), 1.0))
    print(f"one core: matmul {rate / 1e9:.1f} GFLOP/s, copy {copy / 1e9:.1f} GB/s; step "
          f"efficiency {eff.matmul:.3f} (fitted on 1 device, 1 core: {alone * 1e3:.1f} ms), "
          f"parallel {eff.parallel:.3f} (fitted on 1 device, {cores} cores: "
          f"{spread * 1e3:.1f} ms)")
    chip = dataclasses.replace(hw.chip("cpu"), peak_flops=rate, hbm_bandwidth=copy,
                               calibrated=True, **tiers)
    collectives = {"cache_bytes": cache, **tables}
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f, \
            mock.patch.dict(os.environ, {hw.ENV_HARDWARE: f.name}):  # over calibration.toml's
        f.write(_toml_table("collectives.cpu", collectives))
        f.flush()
        step_errors = []
        for key, point in steps.items():
            if "core" in key:
                continue
            procs, devices = map(int, key.split("x"))
            n = procs * devices
            program = Program.from_json(steps[f"1x{n}"]["program"])
            est = estimate(program, hw.Pod(chip, (procs, devices)), eff)
            err = (est.step_time_s - point["step"]) / point["step"]
            if n > 1:
                step_errors.append(abs(err))
            print(f"step {key}: measured {point['step'] * 1e3:.1f} ms, predicted "
                  f"{est.step_time_s * 1e3:.1f} ms ({err:+.1%}; compute "
                  f"{est.compute_s * 1e3:.1f}, collectives "
                  f"{est.exposed_communication_s * 1e3:.1f})"
                  f"{'  (fitted)' if n == 1 else ''}")
    print(f"steps not fitted on: {len(step_errors)}, within 25%: "
          f"{sum(e <= 0.25 for e in step_errors)}/{len(step_errors)}")
    if args.write:
        write_table("chip.cpu", {
            "base": "cpu", "peak_flops": rate, "hbm_bandwidth": copy, **tiers,
            "calibrated": True,
            "source": f"measured on this machine ({cores} cores), bench/sim_calibrate.py cpu + "
                      "fit-cpu: one core's float32 matmul and copy rates; gloo between "
                      "processes, one process's virtual devices"})
        write_table("efficiency.cpu", {
            "matmul": round(eff.matmul, 4), "memory": eff.memory, "overlap": eff.overlap,
            "parallel": round(eff.parallel, 4), "source": f"{eff.source} (bench/sim_calibrate.py)"})
        write_table("collectives.cpu", collectives)


def _toml_key(key: str) -> str:
    import re

    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: object) -> str:
    """TOML for what calibration writes: tables (inline), strings, booleans, finite numbers."""
    import math

    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                                for k, v in value.items()) + " }"
    if isinstance(value, bool | str) or (isinstance(value, int | float)
                                        and math.isfinite(value)):
        return json.dumps(value, ensure_ascii=False)
    raise ValueError(f"calibration has no TOML for {value!r}")


def _toml_table(name: str, values: dict) -> str:
    return f"[{name}]\n" + "".join(f"{_toml_key(k)} = {_toml_value(v)}\n"
                                   for k, v in values.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("tpu", help="measure on a TPU chip")
    t.add_argument("--out", default="tpu_calibration.json")
    t.add_argument("--batches", type=int, nargs=2, default=[16, 32])
    t.add_argument("--resnet-batches", type=int, nargs=2, default=[64, 128])
    t.add_argument("--steps", type=int, default=30)
    f = sub.add_parser("fit", help="fit efficiencies on measurements and predict")
    f.add_argument("measurements")
    f.add_argument("--chip", default="tpu-v5e")
    f.add_argument("--write", action="store_true")
    c = sub.add_parser("cpu", help="measure this machine (run it alone)")
    c.add_argument("--out", default="cpu_calibration.json")
    w = sub.add_parser("cpu-worker", help=argparse.SUPPRESS)
    for flag in ("--what", "--coordinator", "--out"):
        w.add_argument(flag)
    for flag in ("--processes", "--devices", "--process-id", "--cores"):
        w.add_argument(flag, type=int)
    fc = sub.add_parser("fit-cpu", help="fit this machine's tiers and predict")
    fc.add_argument("measurements")
    fc.add_argument("--write", action="store_true")
    args = parser.parse_args()
    {"tpu": measure_tpu, "fit": fit, "cpu": measure_cpu, "cpu-worker": cpu_worker,
     "fit-cpu": fit_cpu}[args.mode](args)


if __name__ == "__main__":
    main()
