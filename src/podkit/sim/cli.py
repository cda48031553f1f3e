"""`podkit plan`: the planner's command line (plan.py).

    podkit plan CONFIG --pod tpu-v4:2048 [--slices N] [--set K=V ...] [--global-batch B]
    podkit plan --model transformer --layers L --d-model D --heads H --ff F --vocab V --seq S
                --global-batch B --pod tpu-v5p:128 [--kv-heads K] [--gated-mlp] [--remat R]
    podkit plan --model resnet50 --global-batch B --pod tpu-v3:1024 [--per-device-bn]
    ... [--mesh data=...,fsdp=...,model=...] [--top N] [--json] [--plot FILE.png]
        [--plot-against KIND] [--hardware FILE.toml]

A config's model is compiled once on 8 virtual CPU devices (data=2, fsdp=2, model=2; without a
model axis where the model has none) and scaled to each mesh of the pod (program.scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError
from podkit.sim import hardware as hw
from podkit.sim import plan as planner
from podkit.sim import program as prog
from podkit.sim.step import DEFAULTS, Efficiency, Estimate, efficiency_for

TRANSFORMER_INTS = ("layers", "d-model", "heads", "ff", "vocab", "seq", "kv-heads", "head-dim")
TRANSFORMER_ONLY = (*TRANSFORMER_INTS, "gated-mlp", "remat")
RESNET_ONLY = ("image-size", "per-device-bn")
COMPILED_MESHES = ({"data": 2, "fsdp": 2, "model": 2}, {"data": 2, "fsdp": 4})
PLOT_CHIPS = tuple(2 ** i for i in range(13))  # 1 .. 4096


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="predict step time, MFU and memory of every mesh of a TPU pod or GPU "
        "cluster, ranked (podkit.sim)")
    p.add_argument("config", nargs="?", help="a podkit config (TOML); or --model")
    p.add_argument("--pod", required=True, metavar="KIND:CHIPS",
                   help="tpu-v4:2048, tpu-v5p:128, tpu-v5e:16x16, h100:64, a100:2048, ...")
    p.add_argument("--slices", type=int, metavar="N",
                   help="N TPU slices of --pod joined by the data-center network, data "
                        "parallel across them (default: the config's [strategy] slices, or 1)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (with CONFIG)")
    p.add_argument("--model", choices=("transformer", "resnet50"),
                   help="an analytic model instead of a config")
    for flag in TRANSFORMER_INTS:
        p.add_argument(f"--{flag}", type=int, metavar="N")
    p.add_argument("--gated-mlp", action="store_true", help="a SwiGLU MLP (LLaMA-style)")
    p.add_argument("--remat", choices=("none", "minimal", "full"),
                   help="what the backward pass recomputes (default none)")
    p.add_argument("--image-size", type=int, help="ResNet-50's input (px, default 224)")
    p.add_argument("--per-device-bn", action="store_true",
                   help="ResNet-50's BatchNorm statistics per device, no all-reduce (PyTorch "
                        "DDP's; default: over the global batch, as podkit's ResNet under jit)")
    p.add_argument("--global-batch", type=int, metavar="B",
                   help="samples per step, all chips (default: the config's batch size)")
    p.add_argument("--mesh", metavar="data=N,fsdp=N,model=N",
                   help="estimate this mesh only (its sizes multiply to the pod's chips)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows shown (default 10)")
    p.add_argument("--json", action="store_true", help="the ranked estimates as JSON")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw scaling efficiency from 1 to 4,096 chips, TPU and GPU")
    p.add_argument("--plot-against", metavar="KIND",
                   help="the other chip of --plot (default: h100 beside a TPU pod, tpu-v4 "
                        "beside a GPU cluster)")
    p.add_argument("--hardware", action="append", default=[], metavar="FILE.toml",
                   help="user hardware (docs/sim-hardware.md: the format)")


def _given(args: argparse.Namespace, flags: tuple[str, ...]) -> list[str]:
    given = [(f, getattr(args, f.replace("-", "_"))) for f in flags]
    return [f"--{f}" for f, value in given if value is not None and value is not False]


def _check_flags(args: argparse.Namespace) -> None:
    """Flags of another kind of model are an error, not silently ignored."""
    if args.config and args.model:
        raise ConfigError(f"podkit plan got a config ({args.config}) and --model "
                          f"{args.model}; give one of the two.")
    if args.set and not args.config:
        raise ConfigError(f"--set {args.set[0]} overrides a config value; give the config "
                          "(`podkit plan CONFIG --set ...`), or the --model flags instead.")
    wrong = (_given(args, TRANSFORMER_ONLY) if args.model != "transformer" else []) + (
        _given(args, RESNET_ONLY) if args.model != "resnet50" else [])
    if wrong:
        what = f"--model {args.model}" if args.model else f"a config ({args.config})"
        fix = "set them in the config with --set" if args.config else "drop them"
        verb = "does" if len(wrong) == 1 else "do"
        raise ConfigError(f"{', '.join(wrong)} {verb} not apply to {what}; {fix}.")


def _model(args: argparse.Namespace, pod: hw.Pod) -> tuple[planner.ModelSpec, int]:
    _check_flags(args)
    if args.model == "transformer":
        need = ("layers", "d_model", "heads", "ff", "vocab", "seq", "global_batch")
        missing = [f"--{n.replace('_', '-')}" for n in need if getattr(args, n) is None]
        if missing:
            raise ConfigError(f"--model transformer needs {', '.join(missing)}.")
        extra = {"biases": False, "learned_positions": False} if args.gated_mlp else {}
        return (planner.Transformer(
            args.layers, args.d_model, args.heads, args.ff, args.vocab, args.seq,
            tuple(sorted(extra.items())), kv_heads=args.kv_heads, head_dim=args.head_dim,
            gated_mlp=args.gated_mlp, remat=args.remat or "none"),  # LLaMA-style if gated
            args.global_batch)
    if args.model == "resnet50":
        if args.global_batch is None:
            raise ConfigError("--model resnet50 needs --global-batch B.")
        size = 224 if args.image_size is None else args.image_size
        return (planner.ResNet50(size, synchronized_bn=not args.per_device_bn),
                args.global_batch)
    if not args.config:
        raise ConfigError("podkit plan needs a config (`podkit plan CONFIG --pod ...`) or "
                          "--model transformer|resnet50 with its dims.")
    base, last = None, None
    for mesh in COMPILED_MESHES:
        try:
            base = prog.extract(args.config, mesh, overrides=args.set)
            break
        except ConfigError as e:  # a model without a model axis (an MLP, a ResNet)
            last = e
    if base is None:
        raise ConfigError(f"could not compile {args.config} for planning: {last}")
    print(f"podkit plan: compiled {args.config} on {planner.format_mesh(base.mesh)} "
          "(virtual CPU devices); scaling it to each mesh", file=sys.stderr)
    config = prog.load_config(args.config, list(args.set))
    return (planner.Compiled.of_config(base, config, pod.chip.family),
            args.global_batch or base.global_batch)


def table(estimates: list[Estimate], top: int) -> str:
    tokens = estimates[0].tokens_per_s is not None
    head = ("rank", "mesh", "step", "MFU", "tokens/s" if tokens else "samples/s",
            "memory/chip", "fits", "scaling", "bound")
    rows = [head]
    for i, e in enumerate(estimates[:top], 1):
        rate = e.tokens_per_s if tokens else e.samples_per_s
        rows.append((str(i), planner.format_mesh(e.mesh), _seconds(e.step_time_s),
                     f"{e.mfu:.1%}", f"{rate:,.0f}",
                     f"{e.memory_per_device_bytes / 2**30:.1f} GiB", "yes" if e.fits else "NO",
                     "-" if e.scaling_efficiency is None else f"{e.scaling_efficiency:.1%}",
                     e.bound))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _plot(path: str, model: planner.ModelSpec, global_batch: int, pod: hw.Pod,
          chips: dict[str, hw.Chip], against: str | None, paths: list[str]) -> None:
    """Weak scaling from 1 to 4,096 chips at the pod's batch per chip, for the pod's chip and
    `against` (default: H100 beside a TPU, TPU v4 beside a GPU)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_chip = max(1, global_batch // pod.chips)
    if pod.slices > 1:
        return _plot_slices(path, model, per_chip, pod, paths)
    other = against or ("h100" if pod.chip.family == "tpu" else "tpu-v4")
    other = hw.chip(other, chips).name  # an unknown kind fails here, listing the known ones
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in (pod.chip.name, other):
        xs, ys = [], []
        for n in PLOT_CHIPS:
            try:
                target = planner.one_chip(hw.pod(f"{name}:{max(n, 4)}", chips)) if n == 1 \
                    else hw.pod(f"{name}:{n}", chips)
                eff = efficiency_for(target, paths=paths)
                spec = model.retarget(target.chip.family) if isinstance(
                    model, planner.Compiled) else model
                best = planner.plan(spec, target, per_chip * n, efficiency=eff)[0]
            except ConfigError:  # no slice of n chips of this kind
                continue
            xs.append(n)
            ys.append(1.0 if n == 1 else best.scaling_efficiency)
        ax.plot(xs, ys, marker="o", label=name)
    top = max(1.05, max((y for line in ax.get_lines() for y in line.get_ydata()),
                        default=1.0) + 0.05)
    _save_plot(fig, ax, path, "chips", f"{per_chip} samples per chip, best mesh at each size",
               top)


def _save_plot(fig: Any, ax: Any, path: str, xlabel: str, title: str, top: float) -> None:
    """A weak-scaling plot's axes, labels and file (both of `podkit plan --plot`'s)."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=2)
    ax.set_ylim(0, top)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("scaling efficiency (weak, per chip vs one chip)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


SLICE_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def _plot_slices(path: str, model: planner.ModelSpec, per_chip: int, pod: hw.Pod,
                 paths: list[str]) -> None:
    """Weak scaling over slices of the pod's shape (1 to 64, and the pod's own count), at
    the pod's batch per chip, the best mesh inside a slice at each count; beside it the same
    with the DCN at a tenth of its bandwidth (what a slower or shared network costs)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(set(SLICE_COUNTS) | {pod.slices})
    slow_chip = dataclasses.replace(pod.chip, dcn_bandwidth=pod.chip.dcn_bandwidth / 10)
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, chip in ((f"{pod.one_slice().spec} slices", pod.chip),
                        ("the same, DCN at 1/10 the bandwidth", slow_chip)):
        xs, ys = [], []
        for n in counts:
            target = dataclasses.replace(pod, chip=chip, slices=n)
            eff = efficiency_for(target, paths=paths)
            try:
                best = planner.plan(model, target, per_chip * target.chips, efficiency=eff)[0]
            except ConfigError:
                continue
            xs.append(n)
            ys.append(best.scaling_efficiency)
        ax.plot(xs, ys, marker="o", label=label)
    _save_plot(fig, ax, path, f"slices of {pod.slice_chips} chips (data parallel over the DCN)",
               f"{per_chip} samples per chip, best mesh inside a slice", 1.05)


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ConfigError(f"--top {args.top}; show at least one row.")
    if args.plot_against and not args.plot:
        raise ConfigError(f"--plot-against {args.plot_against} names the other chip of a "
                          "plot; add --plot FILE.png.")
    if args.plot and not args.plot.endswith(".png"):
        raise ConfigError(f"--plot {args.plot}: the plot is a PNG; name a FILE.png.")
    if args.plot and not Path(args.plot).resolve().parent.is_dir():
        raise ConfigError(f"--plot {args.plot}: the folder {Path(args.plot).parent} does not "
                          "exist; create it or name a PNG in an existing folder.")
    if args.global_batch is not None and args.global_batch < 1:
        raise ConfigError(f"--global-batch {args.global_batch}; at least 1 sample per step.")
    chips = hw.catalog(args.hardware)
    slices = args.slices
    if slices is None and args.config:  # the config's own, before its compile
        slices = prog.load_config(args.config, list(args.set)).strategy.slices
    pod = hw.pod(args.pod, chips, slices=1 if slices is None else slices)
    if args.plot_against:
        hw.chip(args.plot_against, chips)  # an unknown kind fails now, not after the table
    efficiency = efficiency_for(pod, paths=args.hardware)  # a bad table before the compile
    model, global_batch = _model(args, pod)
    mesh = prog.parse_mesh(args.mesh) if args.mesh else None
    ranked = planner.plan(model, pod, global_batch, mesh=mesh, efficiency=efficiency)
    if args.json:
        print(json.dumps({"pod": pod.spec, "chips": pod.chips, "global_batch": global_batch,
                          "efficiency": {**dataclasses.asdict(efficiency),
                                         "calibrated": not uncalibrated(pod, efficiency)},
                          "estimates": [e.to_json() for e in ranked[:args.top]]}, indent=1,
                         default=_json_default))
    else:
        print(efficiency_caption(pod, efficiency), file=sys.stderr)
        print(f"{pod.spec}: {pod.chips} x {pod.chip.name}, global batch {global_batch}; "
              f"{len(ranked)} mesh(es), fitting ones first, fastest first")
        print(table(ranked, args.top))
    if args.plot:
        _plot(args.plot, model, global_batch, pod, chips, args.plot_against, args.hardware)
        print(f"podkit plan: wrote {args.plot}", file=sys.stderr)
    return 0


def uncalibrated(pod: hw.Pod, efficiency: Efficiency) -> bool:
    """Whether `efficiency` is the chip family's default as it stands: nothing measured on
    this chip or fitted to a published figure moved it."""
    return efficiency == DEFAULTS[pod.chip.family]


def efficiency_caption(pod: hw.Pod, efficiency: Efficiency) -> str:
    """The efficiencies the table is priced at, and where they come from: a chip nobody
    calibrated gets its family's default, whose MFU is that default's matmul share, not a
    prediction (docs/planner.md), and the table alone would not say so."""
    e = efficiency
    terms = (f"matmul {e.matmul:g}, conv {e.conv_or_matmul:g}, memory {e.memory:g}, "
             f"overlap {e.overlap:g}, link {e.link:g}")
    if uncalibrated(pod, e):
        return (f"podkit plan: {pod.chip.name} is not calibrated: priced at the "
                f"{pod.chip.family.upper()} default efficiencies ({terms}; "
                "docs/sim-validation.md), so a compute-bound step's MFU is that default's, "
                f"not a prediction; an [efficiency.{pod.chip.name}] table (--hardware) sets "
                "your own")
    default = DEFAULTS[pod.chip.family]
    # A table without its own `source` keeps the default's, which would name the wrong origin.
    source = (e.source if e.source and e.source != default.source else
              f"an [efficiency.{pod.chip.name}] table over the {pod.chip.family.upper()} "
              "defaults")
    return f"podkit plan: {pod.chip.name} priced at {terms} ({source})"


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)
