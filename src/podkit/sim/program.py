"""The program model: what one device does in one train step on a mesh, from the program XLA
really compiles -- and that program scaled to a mesh too large to compile here.

    program = extract("configs/gpt_small.toml", {"data": 2, "fsdp": 4})
    big = scale(program, {"data": 64, "fsdp": 16}, global_batch=4096)

`extract` builds the config's model and train step exactly as `podkit train` does (the same
config loader, strategy rules, model builder and compile()), compiles it for the mesh on
virtual CPU devices and reads the optimized HLO and XLA's analyses (podkit.monitor
.compile_report): FLOPs per device (podkit's count on the jaxpr: matmuls and convolutions,
loops counted whole, divided by the devices; XLA's cost analysis beside it), bytes accessed,
memory per device, and every collective with its bytes, group size and the mesh axes its
groups span. What the compile needs of the data is its shapes: text and image data are not
read (a text config compiles for `data.vocab_size` tokens without training its tokenizer);
other data is loaded as `podkit train` would. One step per execution is compiled
(`steps_per_execution` is a host-side loop; the step inside is the same). The program is
XLA:CPU's: it partitions as XLA:TPU does (the same SPMD partitioner) but fuses, combines and
schedules its own way -- it combines a step's gradient all-reduces into one op, and a
scanned layer stack (`scan_layers`) it may partition differently from the unrolled one
(seen: the stacked weights gathered whole before the loop, all-to-alls inside it).

Collectives follow one byte convention: `bytes` is the whole array one device holds in the
operation -- all-reduce: its operand; all-gather: the gathered output; reduce-scatter: the
input before scattering; all-to-all and collective-permute: the array per device. Read from
the HLO text here rather than from compile_report's list, because three things need the
text: a collective whose result is a tuple (XLA combines a step's gradient all-reduces into
one), a collective inside a loop (a scanned layer stack: counted times its trip count), and
XLA:CPU's form of a reduce-scatter: it does not form reduce-scatters, so an FSDP gradient is
an all-reduce whose every user keeps 1/group of it (a per-device slice). Such an all-reduce
is counted as the reduce-scatter XLA:TPU and XLA:GPU make of it (their ReduceScatterCreator
pass rewrites exactly that pattern).

Scaling to a target mesh (`scale`). A compiled mesh is small; the pod is not. The rules:

- FLOPs: the global FLOPs of a step are proportional to the global batch; per device they
  are divided evenly: flops' = flops x (B'/B) x (N/N'). Exact for model FLOPs (every matmul
  of a train step scales with the batch) when the work is balanced over the devices.
- Parameters and optimizer state per device: each leaf's bytes divided by the target sizes
  of the mesh axes it is split over (kept per leaf group in `param_shards`,
  `optimizer_shards`): exact.
- Activations (XLA's temporaries) and bytes accessed beyond the state's own traffic: with the
  per-device batch b = B / (data x fsdp) and the model split k: x (b'/b) x (k/k').
- Collectives keep their count and are re-sized by their axes. group_size' is the product of
  the target sizes of the axes the op spans (an op whose axes all become 1 disappears).
  Bytes: an op over batch axes only (data, fsdp) moves weight-shaped arrays (a gradient, a
  gathered parameter, normalization statistics): its bytes follow the per-device share of
  the parameters along the axes it does not span -- a data-axis gradient all-reduce keeps
  its bytes when only `data` grows, an fsdp all-gather's output stays the whole parameter,
  a data-axis all-reduce of an fsdp-scattered gradient shrinks as fsdp grows. An op whose
  groups span `model` moves activations (Megatron's all-reduces, a vocabulary-parallel
  loss), whole along the hidden width on every model device: bytes x (b'/b), b the samples
  per device.

Limits of the scaling: it cannot create collectives the compiled program has none of, so the
target mesh may not grow an axis that was 1 (or absent) in the compiled mesh (an error says
to compile a mesh with that axis at 2); weight-shaped temporaries (gradients in flight,
FSDP's gathered weights) are scaled as if they were activations; XLA may choose different
fusions, combinations or layouts at another size; and the per-op rule is by axes, not by
what each tensor is. Compile the smallest mesh with the target's axes, per-device batch and
model split for the most faithful figures: then only the state's sharding and the group
sizes change.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from podkit.errors import ConfigError
from podkit.monitor import compile_report as report_lib
from podkit.strategy import DCN, MESH_AXES

BATCH_AXES = (DCN, "data", "fsdp")  # the axes the batch is split over (DEFAULT_RULES)
MODEL_KINDS = ("transformer", "resnet", "other")
# A compile on more virtual CPU devices than this takes minutes: compile a small mesh with the
# same axes and scale() it.
MAX_COMPILE_DEVICES = 64

Shards = tuple[tuple[tuple[str, ...], int], ...]  # ((mesh axes a group is split over, bytes),)


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """Collectives of one kind, size and group, `count` of them per step and device."""

    kind: str  # "all-reduce", "all-gather", "reduce-scatter", "all-to-all", ...
    bytes: int  # per device, the whole array (module docstring: the convention)
    group_size: int
    axes: tuple[str, ...]  # the mesh axes a group spans
    count: int = 1
    # on the critical path whatever its axes: the next op waits for its result (BatchNorm's
    # statistics); otherwise batch-axis collectives may overlap compute (podkit.sim.step)
    critical: bool = False
    # the arrays one op moves: XLA combines a step's gradient all-reduces into one op of many
    # operands (a tuple). One collective to NCCL or a TPU; XLA:CPU runs one per operand, each
    # paying the latency (podkit.sim.cpu)
    operands: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.operands, bool) or not isinstance(self.operands, int) or \
                self.operands < 1:
            raise ConfigError(f"collective {self.kind} of {self.bytes} bytes: operands = "
                              f"{self.operands!r}; the arrays it moves, an integer >= 1.")

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.count


@dataclasses.dataclass(frozen=True)
class Program:
    """What one device does in one train step on `mesh`. Bytes and FLOPs are per device."""

    mesh: dict[str, int]
    global_batch: int  # samples per optimizer step, all devices
    flops: float  # model FLOPs (matmuls, convolutions) per device per step
    xla_flops: float | None  # XLA's cost analysis (elementwise ops too), per device
    bytes_accessed: float  # HBM traffic per device per step
    collectives: tuple[CollectiveOp, ...]
    params: int  # trainable parameters, the whole model
    param_bytes: int  # per device
    optimizer_bytes: int  # per device
    # per device, the step's temporaries: activations kept for the backward pass, gradients
    # and gathered weights in flight (XLA's temporaries; the analytic model's estimate)
    activation_bytes: int
    memory_per_device_bytes: int  # arguments + temporaries + outputs - aliased
    tokens_per_sample: int | None  # sequence length of a text model; None otherwise
    model_kind: str  # "transformer" | "resnet" | "other"
    param_shards: Shards = ()  # whole-model bytes by the mesh axes they are split over
    optimizer_shards: Shards = ()
    dims: dict[str, int] = dataclasses.field(default_factory=dict)  # layers, heads, ...
    # FLOPs per device per step that remat adds (the forward again): hardware FLOPs, not the
    # model's (MFU counts `flops` only, as MaxText does)
    recompute_flops: float = 0.0
    # the convolutions' share of `flops` (their own efficiency in podkit.sim.step)
    conv_flops: float = 0.0
    source: str = "compiled"  # "compiled", "analytic", or "scaled from ..."
    notes: tuple[str, ...] = ()

    @property
    def devices(self) -> int:
        return math.prod(self.mesh.values())

    @property
    def per_device_batch(self) -> float:
        return self.global_batch / math.prod(self.mesh.get(a, 1) for a in BATCH_AXES)

    @property
    def tokens_per_step(self) -> int | None:
        return None if self.tokens_per_sample is None else \
            self.global_batch * self.tokens_per_sample

    def collective_bytes(self, kind: str | None = None) -> int:
        """Bytes per device per step moved by collectives (of one kind)."""
        return sum(c.total_bytes for c in self.collectives if kind in (None, c.kind))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Program:
        d = dict(data)
        d["collectives"] = tuple(CollectiveOp(**{**c, "axes": tuple(c["axes"])})
                                 for c in d["collectives"])
        for key in ("param_shards", "optimizer_shards"):
            d[key] = tuple((tuple(axes), int(b)) for axes, b in d.get(key, ()))
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)


# -- meshes -----------------------------------------------------------------------------------
def check_mesh(mesh: Mapping[str, int], global_batch: int | None = None) -> dict[str, int]:
    """The mesh as {axis: size} in podkit's axis order, checked: known axes, positive int
    sizes, and a global batch the batch axes divide."""
    if not isinstance(mesh, Mapping) or not mesh:
        raise ConfigError(f"mesh={mesh!r}: give the axes and their sizes, e.g. "
                          "{'data': 4, 'fsdp': 2}.")
    for axis, size in mesh.items():
        if axis not in MESH_AXES:
            raise ConfigError(f"unknown mesh axis {axis!r} in mesh={dict(mesh)}; valid axes: "
                              f"{', '.join(MESH_AXES)}.")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"mesh axis {axis!r} has size {size!r}; give each axis a "
                              "positive int (a planned mesh names every size: no -1).")
    out = {a: int(mesh[a]) for a in MESH_AXES if a in mesh}
    if global_batch is not None:
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) \
                or global_batch < 1:
            raise ConfigError(f"global_batch={global_batch!r}; give a positive int (samples "
                              "per optimizer step).")
        split = math.prod(out.get(a, 1) for a in BATCH_AXES)
        if global_batch % split:
            raise ConfigError(
                f"global_batch={global_batch} is not divisible by "
                f"{'dcn x ' if out.get(DCN, 1) > 1 else ''}data x fsdp = {split} of "
                f"mesh={out}: each data-parallel replica takes an equal share. Use a "
                f"multiple of {split}, e.g. {max(split, global_batch // split * split)}.")
    return out


def across_slices(program: Program, slices: int) -> Program:
    """`program` (one slice's step on its mesh, its share of the batch) run by `slices` TPU
    slices as data parallel replicas over the data-center network (MaxText's
    `dcn_data_parallelism`): the mesh gets a `dcn` axis, outermost; every chip all-reduces
    its share of the gradients with the same chip of every other slice (the in-slice
    reduction already made them one per replica group inside: the parameters' per-device
    bytes over the in-slice data axis, XLA's hierarchical decomposition). Per-chip work and
    memory are the slice's."""
    if slices == 1:
        return program
    if program.mesh.get(DCN, 1) > 1:
        raise ConfigError(f"the program's mesh {program.mesh} already spans slices.")
    shard = program.param_bytes / program.mesh.get("data", 1)
    op = CollectiveOp("all-reduce", max(int(shard), 1), slices, (DCN,), 1,
                      operands=len(program.param_shards) or 1)
    mesh = {DCN: slices, **{a: n for a, n in program.mesh.items() if a != DCN}}
    return dataclasses.replace(
        program, mesh=mesh, global_batch=program.global_batch * slices,
        collectives=(*program.collectives, op),
        notes=(*program.notes, f"{slices} slices: the gradients all-reduced across them over "
               "the data-center network, beside the backward pass (a batch-axis collective)"))


def check_divides(dims: Mapping[str, int], mesh: Mapping[str, int],
                  splits: Mapping[str, Sequence[str]], where: str) -> None:
    """Each dim named in `splits[axis]` must be divisible by that axis's size."""
    for axis, names in splits.items():
        size = mesh.get(axis, 1)
        for name in names:
            if size > 1 and name in dims and dims[name] % size:
                raise ConfigError(
                    f"{where}{name} = {dims[name]} is not divisible by the mesh's {axis} = "
                    f"{size}: the {axis} axis splits {name} evenly. Pick a {axis} size that "
                    f"divides {dims[name]}, or change {name}.")


def per_device(shards: Shards, mesh: Mapping[str, int]) -> int:
    """Bytes per device of state split as `shards` say on `mesh`."""
    return sum(b // math.prod(mesh.get(a, 1) for a in axes) for axes, b in shards)


# -- reading the optimized HLO ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    type: str  # the result type: `f32[8,4]{1,0}` or a tuple of such
    opcode: str
    operands: tuple[str, ...]
    attrs: str  # everything after the operand list
    line: str


_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_COMMENT = re.compile(r"/\*.*?\*/")
_TRIP_COUNT = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_CALLEE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_SHAPE = re.compile(r"[a-z]+[0-9]*\[([0-9,]*)\]")
_DEVICE_ID = ("partition-id", "replica-id")
_ASYNC_KINDS = {f"{k}-start": k for k in report_lib.COLLECTIVES}


def _close(text: str, start: int) -> int:
    """The index of the bracket closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return len(text) - 1


def _parse(line: str) -> _Instruction | None:
    m = _NAME.match(line)
    if not m:
        return None
    i = m.end()
    if line[i:i + 1] == "(":
        j = _close(line, i)
        type_, i = line[i:j + 1], j + 1
    else:
        j = i
        while j < len(line) and not line[j].isspace():
            j += 1
        type_, i = line[i:j], j
    op = _OPCODE.match(line, i)
    if not op:
        return None
    k = op.end() - 1
    end = _close(line, k)
    args = _COMMENT.sub("", line[k + 1:end])
    if "%" in args:
        operands = tuple(re.findall(r"%([\w.\-]+)", args))
    else:  # printed without %: `add(a, b)` (or `f32[8] a` in older dumps)
        operands = tuple(p.split()[-1] for p in args.split(",") if p.strip())
    return _Instruction(m.group(1), _COMMENT.sub("", type_), op.group(1), operands,
                        line[end + 1:], line)


def _elements(type_: str) -> list[str]:
    """The top-level elements of a tuple type (the type itself when not a tuple)."""
    t = type_.strip()
    if not t.startswith("("):
        return [t]
    out, depth, start = [], 0, 1
    for i, c in enumerate(t[1:-1], start=1):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(t[start:i].strip())
            start = i + 1
    out.append(t[start:-1].strip())
    return [e for e in out if e]


def _count(type_: str) -> int:
    """Elements of an array type (the largest element of a tuple)."""
    return max((math.prod(int(d) for d in dims.split(",") if d)
                for dims in _SHAPE.findall(type_)), default=0)


def _computations(hlo: str) -> tuple[dict[str, list[_Instruction]], str | None]:
    comps: dict[str, list[_Instruction]] = {}
    entry, current = None, None
    for line in hlo.splitlines():
        if line and not line[0].isspace():
            m = _COMPUTATION.match(line)
            if m:
                current = m.group(1)
                comps[current] = []
                if line.startswith("ENTRY"):
                    entry = current
            continue
        if current is not None:
            inst = _parse(line)
            if inst is not None:
                comps[current].append(inst)
    return comps, entry


def _multiplicity(comps: dict[str, list[_Instruction]], entry: str | None
                  ) -> tuple[dict[str, int], dict[str, str]]:
    """How many times each computation runs per execution of the entry -- a while loop's body
    times its trip count (XLA's known_trip_count), a conditional's branches once each -- and,
    for computations whose count is a guess, why."""
    if entry is None:
        return collections.defaultdict(lambda: 1), {}
    mult: dict[str, int] = collections.defaultdict(int)
    guess: dict[str, str] = {}
    mult[entry] = 1
    # Callees are printed before their callers: in reverse, a caller is done before its callees.
    for name in reversed(list(comps)):
        times = mult.get(name, 0)
        if not times:
            continue
        for inst in comps[name]:
            trips, why = 1, guess.get(name)
            if inst.opcode == "while":
                m = _TRIP_COUNT.search(inst.attrs)
                if m:
                    trips = int(m.group(1))
                else:
                    why = "a while loop without a known trip count: counted once"
            for role, callee in _CALLEE.findall(inst.attrs):
                mult[callee] += times * (trips if role == "body" else 1)
                if why and role in ("body", "condition"):
                    guess[callee] = why
                elif guess.get(name):
                    guess[callee] = guess[name]
            for branches in _BRANCHES.findall(inst.attrs):
                for callee in re.findall(r"%?([\w.\-]+)", branches):
                    mult[callee] += times
                    guess[callee] = guess.get(name) or (
                        "a conditional's branches: each counted once (an upper bound)")
    return mult, guess


def _scattered(element: str, consumers: list[_Instruction], group: int,
               by_name: Mapping[str, _Instruction]) -> bool:
    """Whether an all-reduced array is only ever used as this device's 1/group slice (a
    reduce-scatter in XLA:CPU's spelling): every consumer's result is 1/group of it, or the
    consumer indexes it by the device's own id (a slice reduced on the spot, such as a
    gradient's share of the global norm), and at least one consumer is the slice itself."""
    n = _count(element)
    if group <= 1 or n % group or not consumers:
        return False
    sliced = lambda c: _count(c.type) * group == n
    by_device = lambda c: any(getattr(by_name.get(o), "opcode", "") in _DEVICE_ID
                              for o in c.operands)
    return any(sliced(c) for c in consumers) and all(sliced(c) or by_device(c)
                                                     for c in consumers)


def _consumers(users: Mapping[str, list[_Instruction]], value: str, size: int,
               depth: int = 0) -> list[_Instruction]:
    """The users of `value`, seen through unary ops that keep its size (a convert to the
    compute dtype, a bitcast, a copy: plain or as one-operand fusions)."""
    out = []
    for u in users.get(value, []):
        if len(set(u.operands)) == 1 and _count(u.type) == size and depth < 4:
            out += _consumers(users, u.name, size, depth + 1)
        else:
            out.append(u)
    return out


def collectives_from_hlo(hlo: str, mesh: Mapping[str, int], steps: int = 1,
                         notes: list[str] | None = None) -> tuple[CollectiveOp, ...]:
    """Every collective of an optimized HLO module per step (`steps` per execution), merged
    by kind, bytes, group, axes and operands, with the byte convention of the module
    docstring."""
    notes = notes if notes is not None else []
    comps, entry = _computations(hlo)
    mult, guess = _multiplicity(comps, entry)
    devices = math.prod(mesh.values()) if mesh else 1
    found: collections.Counter[tuple[str, int, int, tuple[str, ...], int]] = \
        collections.Counter()
    for name, insts in comps.items():
        times = mult.get(name, 0)
        if not times:
            continue
        by_name = {inst.name: inst for inst in insts}
        users: dict[str, list[_Instruction]] = collections.defaultdict(list)
        for inst in insts:
            for operand in inst.operands:
                users[operand].append(inst)

        for inst in insts:
            kind = _ASYNC_KINDS.get(inst.opcode, inst.opcode)
            if kind not in report_lib.COLLECTIVES:
                continue
            groups = report_lib.replica_groups(inst.line) or [list(range(devices))]
            group = len(groups[0])
            axes = report_lib.axes_of(groups[0], dict(mesh))
            elements = _elements(inst.type)
            if inst.opcode == "all-gather-start" and len(elements) > 1:
                elements = elements[len(elements) // 2:]  # (operands, outputs): the outputs
            elif inst.opcode == "collective-permute-start":
                elements = elements[:1]
            parts: dict[str, int] = collections.defaultdict(int)
            arrays: dict[str, int] = collections.defaultdict(int)  # operands of each part
            if kind == "all-reduce":
                tupled = inst.type.strip().startswith("(")
                for i, element in enumerate(elements):
                    if tupled:
                        gtes = [u for u in users.get(inst.name, [])
                                if u.opcode == "get-tuple-element"
                                and re.search(rf"\bindex={i}\b", u.attrs)]
                        seen = [c for g in gtes
                                for c in _consumers(users, g.name, _count(element))]
                    else:
                        seen = _consumers(users, inst.name, _count(element))
                    scattered = _scattered(element, seen, group, by_name)
                    as_kind = "reduce-scatter" if scattered else kind
                    parts[as_kind] += report_lib.shape_bytes(element)
                    arrays[as_kind] += 1
            else:
                size = sum(report_lib.shape_bytes(e) for e in elements)
                parts[kind] = size * group if kind == "reduce-scatter" else size
                arrays[kind] = max(len(elements), 1)
            for as_kind, size in parts.items():
                if size:
                    found[(as_kind, size, group, axes, arrays[as_kind])] += times
            if name in guess:
                notes.append(f"{kind} inside {guess[name]}")
    steps = max(int(steps), 1)
    out = []
    for (kind, size, group, axes, arrays), count in sorted(found.items()):
        if count % steps:
            notes.append(f"{count} {kind} ops of {size} bytes do not divide into {steps} steps")
        out.append(CollectiveOp(kind, size, group, axes, max(count // steps, 1),
                                operands=arrays))
    return tuple(out)


def merge(ops: Sequence[CollectiveOp]) -> tuple[CollectiveOp, ...]:
    """Ops of the same kind, bytes, group size, axes, criticality and operands as one, their
    counts added."""
    counts: collections.Counter[tuple[str, int, int, tuple[str, ...], bool, int]] = \
        collections.Counter()
    for op in ops:
        if op.count > 0 and op.group_size > 1 and op.bytes > 0:
            counts[(op.kind, op.bytes, op.group_size, op.axes, op.critical, op.operands)] += \
                op.count
    return tuple(CollectiveOp(k, b, g, a, n, c, o)
                 for (k, b, g, a, c, o), n in sorted(counts.items()))


# -- from a compiled model -----------------------------------------------------------------------
def shards_of(tree: Any) -> Shards:
    """Bytes of a tree of arrays (or ShapeDtypeStructs) with shardings, grouped by the mesh
    axes each leaf is split over."""
    out: dict[tuple[str, ...], int] = collections.defaultdict(int)
    for leaf in jax.tree.leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        spec = getattr(getattr(leaf, "sharding", None), "spec", ()) or ()
        named: set[str] = set()
        for entry in spec:
            named.update((entry,) if isinstance(entry, str) else (entry or ()))
        axes = tuple(a for a in MESH_AXES if a in named)
        out[axes] += math.prod(shape) * np.dtype(dtype).itemsize
    return tuple(sorted(out.items()))


def extract_model(model: Any, x: Any, y: Any, batch_size: int, *,
                  model_kind: str = "other", tokens_per_sample: int | None = None,
                  dims: Mapping[str, int] | None = None) -> Program:
    """The Program of a compiled pk.Model's train step for batches of `batch_size` (the global
    batch) shaped like x and y, on the mesh of the strategy it was built under."""
    if model_kind not in MODEL_KINDS:
        raise ConfigError(f"model_kind={model_kind!r}; valid: {', '.join(MODEL_KINDS)}.")
    report = model.compile_report(x, y, batch_size=batch_size)
    mesh = dict(report.mesh)
    devices = max(report.devices, 1)
    notes = list(report.notes)
    collectives = collectives_from_hlo(report.hlo, mesh, report.steps_per_execution, notes)
    flops = report.flops_per_step / devices
    conv_flops = report.conv_flops_per_step / devices
    xla_flops = report.xla_flops_per_execution / max(report.steps_per_execution, 1)
    loops = bool(_TRIP_COUNT.search(report.hlo))
    bytes_accessed = report.bytes_accessed / max(report.steps_per_execution, 1)
    if loops and xla_flops and flops > xla_flops:
        # XLA's cost analysis counts a loop's body once (a scanned layer stack): its bytes are
        # scaled up as its FLOPs fall short of podkit's whole count.
        bytes_accessed *= flops / xla_flops
        notes.append("bytes accessed scaled by podkit's FLOPs / XLA's FLOPs: XLA's cost "
                     "analysis counts a loop's body once")
    abstract = model.layout.abstract
    param_shards = shards_of(abstract.params)
    optimizer_shards = shards_of(abstract.opt_state)
    memory = report.memory
    return Program(
        mesh=mesh, global_batch=int(batch_size), flops=flops, xla_flops=xla_flops,
        conv_flops=conv_flops,
        bytes_accessed=bytes_accessed, collectives=collectives,
        params=sum(math.prod(p.shape) for p in jax.tree.leaves(abstract.params)),
        param_bytes=per_device(param_shards, mesh),
        optimizer_bytes=per_device(optimizer_shards, mesh),
        activation_bytes=int(memory["temporaries"]),
        memory_per_device_bytes=int(memory["arguments"] + memory["temporaries"]
                                    + memory["outputs"] - memory["aliased"]),
        tokens_per_sample=tokens_per_sample, model_kind=model_kind,
        param_shards=param_shards, optimizer_shards=optimizer_shards,
        dims=dict(dims or {}), source="compiled", notes=tuple(dict.fromkeys(notes)))


# -- from a config -------------------------------------------------------------------------------
def _model_facts(config: Any) -> tuple[str, int | None, dict[str, int], dict[str, Sequence[str]]]:
    """(model kind, tokens per sample, dims, {axis: dims it splits}) of a config's model."""
    m, d = config.model, config.data
    if m.name == "gpt":
        dims = {"layers": m.layers, "heads": m.heads, "d_model": m.embed, "ff": m.mlp,
                "vocab": vocab_size(d, m), "seq": d.seq_len}
        return "transformer", d.seq_len, dims, {"model": ("heads", "ff", "vocab"),
                                                "fsdp": ("d_model",)}
    if m.name == "llama":
        dims = {"layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads or m.heads,
                "d_model": m.embed, "ff": m.mlp, "vocab": vocab_size(d, m), "seq": d.seq_len}
        return "transformer", d.seq_len, dims, {"model": ("heads", "kv_heads", "ff", "vocab"),
                                                "fsdp": ("d_model",)}
    if m.name == "resnet":
        dims = {"depth": m.depth, "width": m.width}
        if hasattr(d, "image_size"):
            dims["image_size"] = d.image_size
        return "resnet", None, dims, {"model": ("width",), "fsdp": ("width",)}
    return "other", None, {}, {}


def vocab_size(data: Any, model: Any = None) -> int:
    """The vocabulary a text config's model is built with: a Hugging Face `init_from`'s
    config.json's, else its tokenizer file's, else `vocab_size`."""
    init = getattr(model, "init_from", "")
    if init:
        from podkit.models import hf

        if hf.is_directory(init):
            return hf.model_config(hf.read_config(init))[1]
    tokenizer = getattr(data, "tokenizer", "train")
    if not tokenizer:
        raise ConfigError("[data] needs data.tokenizer (the model's tokenizer.json), or "
                          "[model] init_from = a Hugging Face directory, whose tokenizer it "
                          "takes.")
    if getattr(data, "files", "") and tokenizer != "train":
        from podkit.datasets import tokenizer_files  # local, gs:// or s3://

        return tokenizer_files.load(tokenizer).get_vocab_size()
    return int(data.vocab_size)


def _example(config: Any, batch: int) -> tuple[dict, Any, Any]:
    """(data info, x, y) for one batch: zeros of the data's shapes where the config says them
    (text, images), else the data's first rows."""
    d = config.data
    if d.name == "text":
        t = d.seq_len
        x = np.zeros((batch, t), np.int32)
        return {"vocab_size": vocab_size(d, config.model), "seq_len": t}, x, x.copy()
    if d.name == "instructions":  # packed examples: tokens, positions and segment ids
        t = d.seq_len
        x = np.zeros((batch, t), np.int32)
        info = {"vocab_size": vocab_size(d, config.model), "seq_len": t, "ignore_class": -100}
        return info, ({k: x for k in ("tokens", "positions", "segment_ids")} if d.packing
                      else x), x.copy()
    if d.name == "images":
        shape = (d.image_size, d.image_size, 3)
        return ({"classes": d.classes, "image_shape": shape, "input_shape": shape},
                np.zeros((batch, *shape), np.float32), np.zeros((batch,), np.int32))
    from podkit import datasets

    data = datasets.load(d, seed=config.run.seed)
    x, y = data.first(batch)
    return data.info, x, y


def _strategy(config: Any, mesh: dict[str, int], devices: Sequence[Any]) -> Any:
    """The strategy for `mesh`: the rules of the axes it has (FSDP's for fsdp, Megatron's for
    model), or a custom config's own rules."""
    from podkit import strategy as strategy_lib

    s = config.strategy
    if s.kind == "custom":
        return strategy_lib.Strategy(mesh=mesh, rules=[tuple(r) for r in s.rules],
                                     devices=devices)
    strategy = strategy_lib.Strategy(mesh=mesh, devices=devices)
    rules = (strategy_lib.FSDP_RULES if "fsdp" in mesh else ()) + (
        strategy_lib.TENSOR_PARALLEL_RULES if "model" in mesh else ())
    strategy.rules = rules + strategy.rules  # as FSDP and TensorParallel do
    return strategy


def load_config(config: Any, overrides: Sequence[str] = ()) -> Any:
    """A config file (with overrides) or object as `podkit train` runs it: with `[model]
    init_from` a Hugging Face directory, that model's architecture and tokenizer
    (podkit.models.hf.run_config)."""
    from podkit import config as config_lib

    if isinstance(config, str | os.PathLike):
        config = config_lib.load(config, list(overrides))
    elif overrides:
        raise ConfigError("overrides apply to a config file; with a Config object, change "
                          "its fields (dataclasses.replace) instead.")
    init = getattr(config.model, "init_from", "")
    if init:
        from podkit.models import hf

        if hf.is_directory(init):
            config = hf.run_config(config, init)[0]
    return config


def extract(config: str | os.PathLike | Any, mesh: Mapping[str, int], *,
            overrides: Sequence[str] = (), global_batch: int | None = None,
            allow_subprocess: bool = True) -> Program:
    """The Program of a podkit config's train step (a TOML path with `--set`-style overrides,
    or a loaded Config) on `mesh`, compiled on virtual CPU devices.

    In this process when it has the CPU devices (connect(cpu_devices=N), N >= the mesh's
    devices); else, with allow_subprocess, in a child process given exactly that many."""
    from podkit.cluster import connect

    path = config if isinstance(config, str | os.PathLike) else None
    config = load_config(config, overrides)
    batch = global_batch if global_batch is not None else config.data.batch_size
    mesh = check_mesh(mesh, batch)
    kind, tokens, dims, splits = _model_facts(config)
    check_divides(dims, mesh, splits, "the model's ")
    n = math.prod(mesh.values())
    if n > MAX_COMPILE_DEVICES:
        raise ConfigError(f"mesh={mesh} has {n} devices; compiling for more than "
                          f"{MAX_COMPILE_DEVICES} virtual CPU devices takes too long. Compile "
                          "a smaller mesh with the same axes and scale() it to this one.")
    connect()
    cpu = jax.devices("cpu")
    if len(cpu) < n or jax.process_count() > 1:
        if not allow_subprocess or path is None:
            raise ConfigError(
                f"mesh={mesh} needs {n} CPU devices and this process has {len(cpu)}. Fix: "
                f"call pk.connect(cpu_devices={n}) (or set PODKIT_CPU_DEVICES={n}) before "
                "JAX starts, or pass a config path and allow_subprocess=True.")
        return _in_subprocess(Path(path), mesh, overrides, batch)
    from podkit import runs
    from podkit.models import build_model

    config = dataclasses.replace(
        config, train=dataclasses.replace(config.train, steps_per_execution=1))
    info, x, y = _example(config, batch)
    strategy = _strategy(config, mesh, cpu[:n])
    with strategy.scope():
        model = build_model(config.model, info, seed=config.run.seed)
        runs.compile_from_config(model, config.train, total_steps=config.train.steps or 1000,
                                 ignore_class=info.get("ignore_class"))
    return extract_model(model, x, y, batch, model_kind=kind, tokens_per_sample=tokens,
                         dims=dims)


def _in_subprocess(path: Path, mesh: dict[str, int], overrides: Sequence[str],
                   batch: int) -> Program:
    n = math.prod(mesh.values())
    cmd = [sys.executable, "-m", "podkit.sim.program", str(path), "--mesh",
           ",".join(f"{a}={s}" for a, s in mesh.items()), "--global-batch", str(batch)]
    for override in overrides:
        cmd += ["--set", override]
    env = {**os.environ, "PODKIT_CPU_DEVICES": str(n), "JAX_PLATFORMS": "cpu"}
    for key in ("PODKIT_COORDINATOR", "PODKIT_NUM_PROCESSES", "PODKIT_PROCESS_ID"):
        env.pop(key, None)  # the child is one process of its own
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise ConfigError(f"compiling {path} for mesh={mesh} on {n} CPU devices failed:\n"
                          f"{out.stderr.strip()[-4000:]}")
    return Program.from_json(json.loads(out.stdout.strip().splitlines()[-1]))


# -- scaling -------------------------------------------------------------------------------------
def _weight_ratio(program: Program, target: Mapping[str, int], spanned: Sequence[str]) -> float:
    """How a weight-shaped array reduced or gathered over `spanned` changes in size from the
    program's mesh to `target`: the parameters' per-device share along the other axes."""
    shards = program.param_shards
    if not shards:
        return 1.0
    rest = lambda mesh: {a: s for a, s in mesh.items() if a not in spanned}
    before = per_device(shards, rest(program.mesh))
    return per_device(shards, rest(target)) / before if before else 1.0


def scale(program: Program, target_mesh: Mapping[str, int],
          global_batch: int | None = None) -> Program:
    """`program` on `target_mesh` (by the rules of the module docstring); global_batch
    defaults to the same batch per data-parallel replica."""
    src = program.mesh
    split = lambda mesh: math.prod(mesh.get(a, 1) for a in BATCH_AXES)
    mesh = check_mesh(target_mesh)
    if global_batch is None:
        global_batch = program.global_batch // split(src) * split(mesh)
    mesh = check_mesh(mesh, global_batch)
    grown = [a for a, s in mesh.items() if s > 1 and src.get(a, 1) == 1]
    if grown:
        raise ConfigError(
            f"target mesh {mesh} splits {', '.join(grown)}, which the compiled mesh {src} "
            f"does not: scaling cannot create the collectives an axis brings. Compile a mesh "
            f"with {' and '.join(f'{a} = 2' for a in grown)} (e.g. extract(..., mesh="
            f"{ {**src, **{a: 2 for a in grown}} })) and scale that.")
    splits = {"model": ("heads", "ff", "vocab", "width"), "fsdp": ("d_model", "width")}
    check_divides(program.dims, mesh, splits, "the model's ")
    n, n2 = program.devices, math.prod(mesh.values())
    batch_ratio = global_batch / program.global_batch
    # Samples per device; activations per device also divide by the model split (Megatron's
    # all-reduced activations do not: each model device holds the whole hidden width).
    samples = (global_batch / split(mesh)) / (program.global_batch / split(src))
    local = samples * src.get("model", 1) / mesh.get("model", 1)
    ops = []
    for op in program.collectives:
        group = math.prod(mesh.get(a, 1) for a in op.axes)
        if "?" in op.axes or group <= 1:
            continue
        if "model" in op.axes:
            size = op.bytes * samples
        else:
            size = op.bytes * _weight_ratio(program, mesh, op.axes)
        ops.append(dataclasses.replace(op, bytes=max(int(round(size)), 1), group_size=group))
    param_bytes = per_device(program.param_shards, mesh) if program.param_shards \
        else program.param_bytes
    optimizer_bytes = per_device(program.optimizer_shards, mesh) \
        if program.optimizer_shards else program.optimizer_bytes
    state = 4 * program.param_bytes + 2 * program.optimizer_bytes  # its own traffic
    state2 = 4 * param_bytes + 2 * optimizer_bytes
    activations = int(program.activation_bytes * local)
    memory = (program.memory_per_device_bytes - program.param_bytes - program.optimizer_bytes
              - program.activation_bytes + param_bytes + optimizer_bytes + activations)
    flops_ratio = batch_ratio * n / n2
    return dataclasses.replace(
        program, mesh=mesh, global_batch=global_batch, flops=program.flops * flops_ratio,
        xla_flops=None if program.xla_flops is None else program.xla_flops * flops_ratio,
        recompute_flops=program.recompute_flops * flops_ratio,
        conv_flops=program.conv_flops * flops_ratio,
        bytes_accessed=max(program.bytes_accessed - state, 0.0) * local + state2,
        collectives=merge(ops), param_bytes=param_bytes, optimizer_bytes=optimizer_bytes,
        activation_bytes=activations, memory_per_device_bytes=max(int(memory), 0),
        source=program.source if program.source.startswith("scaled") else
        f"scaled from {program.source} mesh {src}")


# -- a child process: `python -m podkit.sim.program CONFIG --mesh data=2,fsdp=4` -----------------
def parse_mesh(text: str) -> dict[str, int]:
    """`data=2,fsdp=4` -> {"data": 2, "fsdp": 4}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        axis, sep, size = part.partition("=")
        if not sep or not size.strip().isdigit():
            raise ConfigError(f"mesh {text!r}: write axis=size pairs separated by commas, "
                              "e.g. data=2,fsdp=4.")
        if axis.strip() in out:
            raise ConfigError(f"mesh {text!r} names {axis.strip()!r} twice; give each axis "
                              "once, e.g. data=2,fsdp=4.")
        out[axis.strip()] = int(size)
    return out


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m podkit.sim.program")
    parser.add_argument("config")
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--global-batch", type=int, default=None)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args(argv)
    program = extract(args.config, parse_mesh(args.mesh), overrides=args.set,
                      global_batch=args.global_batch, allow_subprocess=False)
    print(json.dumps(program.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
