"""The step-time model: what one train step of a `Program` costs on a `Pod`.

    est = sim.step.estimate(program, sim.hardware.pod("tpu-v5p:128"))
    est.step_time_s, est.mfu, est.memory_per_device_bytes, est.fits

A step is compute, then what of its communication compute cannot hide, then a fixed cost:

- compute: a roofline over the whole step, max(matmul FLOPs / (peak x matmul efficiency) +
  convolution FLOPs / (peak x conv efficiency), bytes accessed / (HBM bandwidth x memory
  efficiency)). The efficiencies are per chip and per op class (`Efficiency`), fitted by
  calibration where we have the chip (bench/sim_calibrate.py, written to calibration.toml's
  `[efficiency.CHIP]` tables) and defaults with their sources where we do not. They are
  step-level: what a real step reaches, its elementwise work, layout changes and launch gaps
  included, not a kernel's peak (a v5e runs an 8192^3 matmul at 94% of peak, podkit's
  GPT-124M step at 46% and ResNet-50's convolutions at 34%).
- communication: every collective of the program on the links its mesh axes land on
  (`collectives.group`, `collective_time`), times its count. Collectives over a `model`
  (tensor-parallel) axis sit between the matmuls that need their result: all exposed.
  So are those marked `critical` (BatchNorm's statistics in the analytic ResNet-50).
  Collectives over batch axes (`data`, `fsdp`: gradient reductions, weight gathers) run
  asynchronously beside the other layers' compute, as XLA's latency-hiding scheduler places
  them: `overlap` of the compute time can hide them, the rest is exposed.
- overhead: a fixed cost per step (the host's dispatch; podkit's loop on CPU).

MFU is the program's model FLOPs (podkit's count, or the analytic model's) over the step time
and the pod's peak. Memory is the program's per-device bytes against the chip's HBM, less what
XLA keeps for itself (`HBM_USABLE`). Scaling efficiency compares a mesh's throughput per chip
with one chip's at the same per-device work (`podkit.sim.plan`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from podkit.errors import ConfigError
from podkit.sim import collectives as coll
from podkit.sim import cpu
from podkit.sim import hardware as hw
from podkit.sim.hardware import Pod
from podkit.sim.program import Program

MEMORY_MAX = 2.0
"""The largest memory efficiency accepted (see Efficiency.memory)."""

HBM_USABLE = 0.94
"""The share of a chip's memory a program may use: XLA keeps some for itself (its runtime,
program code, fragmentation; TPU runtimes report ~94-96% of HBM as the usable limit)."""

TP_AXES = ("model",)


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """How close a step runs to a chip's peaks; fitted by calibration, or a stated default."""

    matmul: float  # fraction of peak FLOP/s that the step's matmul FLOPs run at
    # Bytes accessed per second over the HBM's bandwidth. Up to MEMORY_MAX, not 1: a compiled
    # program's bytes are XLA's count, which on a TPU includes fusion operands that stay in
    # on-chip memory (ResNet-50 on a v5e: 1.57x what the HBM could move in its step time).
    memory: float
    overlap: float  # fraction of compute time that batch-axis collectives can hide behind
    overhead_s: float = 0.0  # per step
    source: str = ""
    conv: float | None = None  # fraction of peak for convolution FLOPs; None: as `matmul`
    # fraction of the links' spec bandwidth that collectives reach (the bandwidth term only),
    # every tier alike: ICI, NVLink and the network
    link: float = 1.0
    # cpu only: the fraction of one device's step that XLA:CPU spreads over the cores it may
    # use (the rest runs on one core; podkit.sim.cpu.speedup)
    parallel: float = 1.0

    def __post_init__(self) -> None:
        for name, top in (("matmul", 1.0), ("memory", MEMORY_MAX), ("overlap", 1.0),
                          ("conv", 1.0), ("link", 1.0), ("parallel", 1.0)):
            value = getattr(self, name)
            if name == "conv" and value is None:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or not (
                    0 < value <= top or (name == "overlap" and value == 0)):  # NaN: neither
                raise ConfigError(f"efficiency {name}={value!r}; a number in (0, {top:g}].")
        o = self.overhead_s
        if isinstance(o, bool) or not isinstance(o, int | float) or not 0 <= o < math.inf:
            raise ConfigError(f"efficiency overhead_s={o!r}; seconds, a number >= 0.")

    @property
    def conv_or_matmul(self) -> float:
        return self.matmul if self.conv is None else self.conv


# Defaults where no calibration applies (docs/sim-validation.md: sources). TPU: MaxText
# reaches 60-72% MFU on large dense models (its README's table), so its matmuls run above that
# (0.8; so the MaxText 32B case of bench/sim_validate.py is calibrated on it, not held out);
# XLA overlaps most asynchronous collectives; convolutions as podkit's ResNet-50 ran on
# the one TPU measured (a v5e: 0.34). GPU: large bf16 GEMMs reach ~70-80% of dense peak, less
# overlap (NCCL kernels share the SMs with compute); convolutions as NVIDIA's ResNet-50 v1.5
# on one A100 (2,470 images/s in mixed precision: 0.195 of 312 TFLOP/s); NVLink at the 20.6
# GB/s of a link's 25 that NCCL's topology model assumes (src/graph/topo.h SM90_NVLINK_BW; 20.0
# for SM80; the 8x H100 bus-bandwidth case of bench/sim_validate.py agrees by this). CPU:
# calibration.
DEFAULTS = {
    "tpu": Efficiency(0.8, 0.8, 0.9, 0.0, "default (docs/sim-validation.md)", conv=0.34),
    "gpu": Efficiency(0.7, 0.8, 0.7, 0.0, "default (docs/sim-validation.md)", conv=0.195,
                      link=20.6 / 25),
    "cpu": Efficiency(0.5, 0.5, 0.0, 0.0, "default, not calibrated"),
}


# Chips we cannot measure, calibrated on one published figure for a small slice (so that a
# pod-scale figure can be predicted, not fitted: docs/sim-validation.md).
PUBLISHED = {
    # Haiku's ImageNet example (examples/imagenet/README.md, train.py): ResNet-50, 90 epochs of
    # 1,281,167 images in 130 min on 32 v3 TensorCores (16 chips), 32 images per core,
    # per-device BatchNorm under pmap: 14,783 images/s. bench/sim_validate.py refits it.
    "tpu-v3": dataclasses.replace(DEFAULTS["tpu"], conv=0.1843, source=(
        "conv fitted on Haiku's ImageNet example: ResNet-50 on 16 v3 chips, 14,783 images/s")),
    # NCCL's topology model credits an A100's NVLink 3 link with 20.0 GB/s of its 25
    # (src/graph/topo.h SM80_NVLINK_BW), an H100's with 20.6 (the GPU default).
    "a100": dataclasses.replace(DEFAULTS["gpu"], link=20.0 / 25, source=(
        "default; link: NCCL's SM80_NVLINK_BW")),
}


def efficiency_for(pod: Pod, overrides: Mapping[str, Efficiency] | None = None,
                   paths: Iterable[str | os.PathLike] = ()) -> Efficiency:
    """The efficiency of `pod`'s chip: an override by chip name, else its default (one fitted
    on a published figure, PUBLISHED, else its family's) with the keys the hardware files'
    `[efficiency.NAME]` tables set (calibration.toml, $PODKIT_SIM_HARDWARE's, `paths`; a
    later file's keys over an earlier's). A chip made with `base = "tpu-v5e"` starts from the
    family's default, not from the v5e's table: write its own."""
    name = pod.chip.name
    if overrides and name in overrides:
        return overrides[name]
    eff = PUBLISHED.get(name) or DEFAULTS[pod.chip.family]
    for path in hw.catalog_files(paths):
        table = _tables(*hw.file_version(path)).get(name)
        if table:
            try:
                eff = dataclasses.replace(eff, **table)
            except ConfigError as e:
                raise ConfigError(f"hardware file {str(path)!r}: [efficiency.{name}]: {e}"
                                  ) from None
    return eff


EFFICIENCY_KEYS = ("matmul", "conv", "memory", "overlap", "link", "overhead_s", "parallel",
                   "source")


@functools.lru_cache(maxsize=16)
def _tables(path: str, mtime_ns: int, size: int) -> dict[str, dict[str, Any]]:
    """{chip: its [efficiency.CHIP] keys} of one hardware file, checked: tables of known keys
    (their values are checked by Efficiency)."""
    tables = hw.read_file(path).get("efficiency", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"hardware file {path!r}: efficiency = {tables!r}; write one "
                          "[efficiency.NAME] table per chip (docs/sim-hardware.md).")
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"hardware file {path!r}: efficiency.{name} = {table!r} is "
                              f"not a table; write it as [efficiency.{name}] with its keys "
                              "below.")
        unknown = sorted(set(table) - set(EFFICIENCY_KEYS))
        if unknown:
            raise ConfigError(f"hardware file {path!r}: [efficiency.{name}] has "
                              f"{', '.join(unknown)}; its keys are "
                              f"{', '.join(EFFICIENCY_KEYS)} (docs/sim-hardware.md).")
    return tables


def collective_seconds(cost: coll.Cost, efficiency: Efficiency) -> float:
    """A collective's time with its bandwidth term at `efficiency.link` of the links' spec."""
    return cost.latency_s + cost.bandwidth_s / efficiency.link


@dataclasses.dataclass(frozen=True)
class CollectiveTime:
    kind: str
    axes: tuple[str, ...]
    count: int
    bytes: float  # per op, per device
    seconds: float  # all `count` of them
    # on the critical path (tensor-parallel, or marked critical), or hidden behind compute
    exposed: bool


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One train step of a program on a pod."""

    pod: str
    mesh: dict[str, int]
    global_batch: int
    step_time_s: float
    compute_s: float
    flops_s: float  # the FLOPs' share of the roofline
    memory_s: float  # the memory traffic's share
    communication_s: float  # every collective, as if none overlapped
    exposed_communication_s: float
    overhead_s: float
    mfu: float
    samples_per_s: float
    tokens_per_s: float | None
    memory_per_device_bytes: int
    usable_memory_bytes: int
    fits: bool
    bound: str  # "compute" | "memory" | "communication": what most of the step waits on
    collectives: tuple[CollectiveTime, ...] = ()
    scaling_efficiency: float | None = None  # set by plan: throughput per chip / one chip's
    notes: tuple[str, ...] = ()

    @property
    def chips(self) -> int:
        return math.prod(self.mesh.values())

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["collectives"] = [dataclasses.asdict(c) for c in self.collectives]
        if self.tokens_per_s is None:
            del out["tokens_per_s"]
        return out


def device_share(pod: Pod, efficiency: Efficiency) -> float:
    """One device's share of its chip's peak FLOP/s and memory bandwidth: 1 for a TPU or a
    GPU. A `cpu` pod is this machine: its chip's peak and copy rate are one core's, and its
    devices share the cores (`podkit.sim.cpu.speedup`, with `efficiency.parallel` of a
    device's step spread over the cores it gets)."""
    if pod.chip.family != "cpu":
        return 1.0
    return cpu.speedup(pod.chips, cpu.cores(), efficiency.parallel)


def communication(program: Program, pod: Pod, efficiency: Efficiency | None = None
                  ) -> tuple[CollectiveTime, ...]:
    """Each collective of `program` timed on the links of `pod` its mesh axes land on (their
    bandwidth at `efficiency.link` of the spec)."""
    eff = efficiency or efficiency_for(pod)
    layout = coll.layout(pod, program.mesh)
    out = []
    for op in program.collectives:
        axes = tuple(a for a in op.axes if program.mesh.get(a, 1) > 1)
        if not axes:  # "?" (groups no mesh axis describes) or axes of size 1: nothing moves
            continue
        group = layout.group(*axes)
        if pod.chip.family == "cpu":  # XLA:CPU: one collective per operand, measured terms
            seconds = op.count * cpu.collective_seconds(op.kind, op.bytes, op.operands, group,
                                                        pod, eff.link)
        else:
            seconds = collective_seconds(
                coll.collective_time(op.kind, op.bytes, group) * op.count, eff)
        out.append(CollectiveTime(op.kind, axes, op.count, float(op.bytes), seconds,
                                  exposed=op.critical or any(a in TP_AXES for a in axes)))
    return tuple(out)


def estimate(program: Program, pod: Pod, efficiency: Efficiency | None = None) -> Estimate:
    """What one step of `program` (compiled or scaled for its mesh) costs on `pod`."""
    if program.devices != pod.chips:
        raise ConfigError(
            f"the program's mesh {program.mesh} has {program.devices} devices and the pod "
            f"{pod.spec} has {pod.chips} chips. Fix: a mesh whose sizes multiply to "
            f"{pod.chips} (scale() the program to it), or a pod of {program.devices} chips.")
    eff = efficiency or efficiency_for(pod)
    chip = pod.chip
    hardware_flops = program.flops + program.recompute_flops
    conv = hardware_flops * (program.conv_flops / program.flops if program.flops else 0.0)
    share = device_share(pod, eff)
    peak = chip.peak_flops * share
    flops_s = ((hardware_flops - conv) / (peak * eff.matmul)
               + conv / (peak * eff.conv_or_matmul))
    memory_s = program.bytes_accessed / (chip.hbm_bandwidth * share * eff.memory)
    compute_s = max(flops_s, memory_s)
    timed = communication(program, pod, eff)
    exposed_tp = sum(c.seconds for c in timed if c.exposed)
    hidden_kind = sum(c.seconds for c in timed if not c.exposed)
    exposed = exposed_tp + max(0.0, hidden_kind - eff.overlap * compute_s)
    step = compute_s + exposed + eff.overhead_s
    samples_per_s = program.global_batch / step
    tokens = program.tokens_per_step
    usable = int(chip.hbm_bytes * HBM_USABLE)
    parts = {"compute": flops_s, "memory": memory_s, "communication": exposed}
    return Estimate(
        pod=pod.spec, mesh=dict(program.mesh), global_batch=program.global_batch,
        step_time_s=step, compute_s=compute_s, flops_s=flops_s, memory_s=memory_s,
        communication_s=exposed_tp + hidden_kind, exposed_communication_s=exposed,
        overhead_s=eff.overhead_s,
        mfu=program.flops * program.devices / (step * peak * pod.chips),
        samples_per_s=samples_per_s,
        tokens_per_s=None if tokens is None else tokens / step,
        memory_per_device_bytes=int(program.memory_per_device_bytes),
        usable_memory_bytes=usable, fits=program.memory_per_device_bytes <= usable,
        bound=max(parts, key=lambda k: parts[k]), collectives=timed,
        notes=tuple(program.notes))
