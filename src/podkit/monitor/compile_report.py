"""What XLA did to a model's train step: `podkit compile-report CONFIG` and
`model.compile_report(x, y, batch_size=...)`.

    report = model.compile_report(x, y, batch_size=128)
    print(report.text())            # or report.to_json()

It holds: HLO instruction counts by opcode before optimization (the lowered module) and after
(the compiled one), the fusions XLA formed, FLOPs per step (podkit's count on the jaxpr, and
XLA's cost analysis, which counts a loop's body once), bytes accessed and arithmetic intensity
(XLA's), every collective of the optimized program (kind, bytes, group size, and the mesh
axes its groups span), and XLA's memory analysis per device.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
from typing import Any

import numpy as np

from podkit.hardware import format_bytes

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute", "collective-broadcast", "ragged-all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                "c128": 16}
# `  name.1 = f32[8]{0} add(a, b), ...` or `  %t = (f32[], s32[]) tuple(...)`: the opcode is
# the word before the first "(" after the result's type.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(\([^=]*?\)|[^\s(]+)\s+([a-z][a-z0-9\-]*)\(")
# XLA prints a long tuple type with `/*index=5*/` comments (a combined gradient all-reduce's
# result): cut before matching, or the instruction is not seen.
_COMMENT = re.compile(r"/\*.*?\*/")
_SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


@dataclasses.dataclass
class Collective:
    kind: str  # "all-reduce", ...
    bytes: int  # of its result, per device
    group_size: int
    groups: int
    axes: tuple[str, ...]  # the mesh axes a group spans ("?" when it cannot be told)
    name: str = ""  # the op it came from (JAX's op_name metadata)


@dataclasses.dataclass
class CompileReport:
    devices: int
    mesh: dict[str, int]
    steps_per_execution: int
    flops_per_step: float  # podkit's count (podkit.train.flops)
    xla_flops_per_execution: float  # XLA's cost analysis (one device, a loop body once)
    bytes_accessed: float  # XLA's cost analysis, one device, per execution
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    fusions: int
    collectives: list[Collective]
    memory: dict[str, int]  # per device: arguments, outputs, aliased, temporaries, code, peak
    notes: list[str] = dataclasses.field(default_factory=list)
    conv_flops_per_step: float = 0.0  # the convolutions' share of flops_per_step
    # The optimized module's text (what podkit.sim reads); not in to_json(): megabytes.
    hlo: str = dataclasses.field(default="", repr=False)

    @property
    def arithmetic_intensity(self) -> float | None:
        """FLOPs per byte accessed (XLA's counts, one execution)."""
        if not self.bytes_accessed:
            return None
        return self.xla_flops_per_execution / self.bytes_accessed

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["hlo"]
        out["arithmetic_intensity"] = self.arithmetic_intensity
        return out

    def __str__(self) -> str:
        return self.text()

    def text(self) -> str:
        lines = [f"train step on {self.devices} device(s), mesh {self.mesh}, "
                 f"{self.steps_per_execution} step(s) per execution"]
        lines.append(f"FLOPs per step: {self.flops_per_step:.4g} (podkit's count, all devices, "
                     f"loops counted whole); XLA's cost analysis of one execution: "
                     f"{self.xla_flops_per_execution:.4g} (one device, a loop body once)")
        intensity = self.arithmetic_intensity
        lines.append(f"bytes accessed per execution and device: "
                     f"{format_bytes(self.bytes_accessed)}; "
                     "arithmetic intensity: "
                     + (f"{intensity:.1f} FLOP/byte" if intensity else "n/a"))
        lines.append("memory per device: " + ", ".join(
            f"{k} {format_bytes(v)}" for k, v in self.memory.items()))
        before, after = sum(self.ops_before.values()), sum(self.ops_after.values())
        lines.append(f"HLO instructions: {before} before optimization, {after} after; "
                     f"{self.fusions} fusions")
        top = sorted(self.ops_after.items(), key=lambda kv: -kv[1])[:12]
        lines.append("  after, by opcode: " + ", ".join(f"{k} {v}" for k, v in top))
        lines.append(f"collectives: {len(self.collectives)}")
        table = collections.Counter((c.kind, c.axes, c.group_size) for c in self.collectives)
        sizes: dict[tuple, int] = collections.defaultdict(int)
        for c in self.collectives:
            sizes[(c.kind, c.axes, c.group_size)] += c.bytes
        for (kind, axes, group), count in sorted(table.items(), key=lambda kv: -sizes[kv[0]]):
            lines.append(f"  {kind:<20} x{count:<4} over {','.join(axes) or '-':<12} "
                         f"groups of {group:<4} {format_bytes(sizes[(kind, axes, group)])} "
                         "in all")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def count_ops(hlo: str) -> dict[str, int]:
    """{opcode: instructions} of an HLO module's text (every computation, fusions' bodies
    included)."""
    counts: collections.Counter = collections.Counter()
    for line in hlo.splitlines():
        m = _INSTRUCTION.match(_COMMENT.sub("", line))
        if m:
            counts[m.group(2)] += 1
    return dict(counts)


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO result type: `f32[32,64]{1,0}` or a tuple of them."""
    total = 0
    for dtype, dims in _SHAPE.findall(shape):
        if dtype in _DTYPE_BYTES:
            total += _DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def replica_groups(line: str) -> list[list[int]] | None:
    """The device groups of a collective, from any of XLA's three spellings."""
    m = re.search(r"replica_groups=\{(\{[0-9,{}\s]*\})\}", line)
    if m:
        return [[int(i) for i in g.split(",") if i.strip()]
                for g in re.findall(r"\{([0-9,\s]*)\}", m.group(1))]
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", line)
    if m:
        dims = [int(d) for d in m.group(1).split(",")]
        reshape = [int(d) for d in m.group(2).split(",")]
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(p) for p in m.group(3).split(",")])
        return ids.reshape(dims[0], -1).tolist()
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        grouped = [n.strip().strip("'") for n in m.group(2).split(",") if n.strip()]
        ids = np.arange(math.prod(sizes)).reshape(sizes)
        inner = [names.index(g) for g in grouped if g in names]
        outer = [i for i in range(len(names)) if i not in inner]
        return ids.transpose(outer + inner).reshape(-1, math.prod(
            sizes[i] for i in inner) if inner else 1).tolist()
    return None


def axes_of(group: list[int], mesh_shape: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes along which a group's devices differ (device ids index the mesh's
    devices in row-major order, as jit assigns them)."""
    names, sizes = list(mesh_shape), list(mesh_shape.values())
    if not group or math.prod(sizes) <= max(group):
        return ("?",)
    coords = np.array(np.unravel_index(np.array(group), sizes)).T
    return tuple(n for i, n in enumerate(names) if len(set(coords[:, i])) > 1)


def collectives(hlo: str, mesh_shape: dict[str, int]) -> list[Collective]:
    """Every collective of an optimized module (async pairs counted once, at their start)."""
    out = []
    devices = math.prod(mesh_shape.values()) if mesh_shape else 1
    for line in hlo.splitlines():
        line = _COMMENT.sub("", line)
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op = m.group(2)
        kind = op.removesuffix("-start")
        if kind not in COLLECTIVES or op.endswith("-done"):
            continue
        groups = replica_groups(line) or [list(range(devices))]
        name = re.search(r'op_name="([^"]*)"', line)
        out.append(Collective(kind, shape_bytes(m.group(1)), len(groups[0]), len(groups),
                              axes_of(groups[0], mesh_shape), name.group(1) if name else ""))
    return out


def build(lowered: Any, compiled: Any, cost: Any, mesh_shape: dict[str, int]
          ) -> CompileReport:
    """The report of one compiled train program (`cost`: its podkit.train.program.StepCost)."""
    before = lowered.as_text(dialect="hlo")
    after = compiled.as_text()
    analysis = compiled.cost_analysis() or {}
    if isinstance(analysis, list):  # older JAX: one dict per device program
        analysis = analysis[0] if analysis else {}
    ops_after = count_ops(after)
    memory = {"arguments": cost.argument_bytes, "outputs": cost.output_bytes,
              "aliased": cost.alias_bytes, "temporaries": cost.temp_bytes,
              "code": cost.code_bytes, "peak": cost.peak_bytes}
    return CompileReport(
        devices=math.prod(mesh_shape.values()) if mesh_shape else 1, mesh=dict(mesh_shape),
        steps_per_execution=cost.steps, flops_per_step=cost.flops_per_step,
        xla_flops_per_execution=float(analysis.get("flops", 0.0)),
        bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
        ops_before=count_ops(before), ops_after=ops_after,
        fusions=ops_after.get("fusion", 0), collectives=collectives(after, mesh_shape),
        memory=memory, notes=list(cost.notes),
        conv_flops_per_step=cost.conv_flops_per_step, hlo=after)


def dumps(report: CompileReport) -> str:
    return json.dumps(report.to_json(), indent=1, default=str)
