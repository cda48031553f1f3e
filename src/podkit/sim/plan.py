"""The planner: every mesh of a pod for a model, estimated and ranked.

    ranked = sim.plan.plan(sim.plan.Transformer(...), sim.hardware.pod("tpu-v5p:128"),
                           global_batch=512)
    ranked[0].step_time_s, ranked[0].mesh

A model is anything that gives its `Program` for a mesh (`ModelSpec.program(mesh, batch)`): the
analytic transformer and ResNet-50 (`Transformer`, `ResNet50`), or a compiled program
(`Compiled`, extracted once on a small mesh and `scale()`d to each candidate). The candidates
are every data x fsdp x model factorization of the pod's chip count that the model's dims
allow (heads and ff divisible by `model`, the batch by data x fsdp); each is estimated
(`step.estimate`) and ranked: meshes that fit before meshes that do not, then by step time.
So a mesh that does not fit is never ranked above one that does.

Scaling efficiency is weak scaling: throughput per chip on the mesh over one chip's at the
same per-chip batch, one chip being the model on a single device of the same kind (whether
it would fit or not: the question is what communication and sharding cost, not memory).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from podkit.errors import ConfigError
from podkit.sim import analytic
from podkit.sim import hardware as hw
from podkit.sim import program as prog
from podkit.sim.step import Efficiency, Estimate, efficiency_for, estimate

AXES = ("data", "fsdp", "model")


class ModelSpec(Protocol):
    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program: ...

    def model_axes(self) -> tuple[str, ...]: ...


@dataclasses.dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer, by its dims (analytic.transformer's keywords in `extra`)."""

    layers: int
    d_model: int
    heads: int
    ff: int
    vocab: int
    seq: int
    extra: tuple[tuple[str, Any], ...] = ()

    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program:
        return analytic.transformer(self.layers, self.d_model, self.heads, self.ff, self.vocab,
                                    self.seq, global_batch, mesh, **dict(self.extra))

    def model_axes(self) -> tuple[str, ...]:
        return AXES


@dataclasses.dataclass(frozen=True)
class ResNet50:
    image_size: int = 224
    extra: tuple[tuple[str, Any], ...] = ()

    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program:
        return analytic.resnet50(global_batch, mesh, self.image_size, **dict(self.extra))

    def model_axes(self) -> tuple[str, ...]:
        return ("data", "fsdp")  # no tensor-parallel ResNet


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A program compiled on a small mesh (`program.extract`), scaled to each candidate."""

    base: prog.Program

    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program:
        return prog.scale(self.base, mesh, global_batch)

    def model_axes(self) -> tuple[str, ...]:
        # scale() cannot grow an axis the compiled mesh lacks (program.py: why)
        return tuple(a for a in AXES if self.base.mesh.get(a, 1) > 1)


def factorizations(chips: int, axes: Sequence[str] = AXES) -> list[dict[str, int]]:
    """Every {axis: size} over `axes` whose sizes multiply to `chips` (sizes of 1 dropped)."""
    if chips < 1:
        raise ConfigError(f"chips={chips}; a pod has at least one chip.")
    out: list[dict[str, int]] = []

    def walk(i: int, left: int, mesh: dict[str, int]) -> None:
        if i == len(axes) - 1:
            out.append({**mesh, axes[i]: left})
            return
        for size in range(1, left + 1):
            if left % size == 0:
                walk(i + 1, left // size, {**mesh, axes[i]: size})

    walk(0, chips, {})
    return [{a: s for a, s in m.items() if s > 1} or {axes[0]: 1} for m in out]


def format_mesh(mesh: Mapping[str, int]) -> str:
    """{"data": 8, "model": 2} -> "data=8,model=2" (what --mesh takes)."""
    return ",".join(f"{a}={s}" for a, s in mesh.items())


def _rank_key(e: Estimate) -> tuple:
    # equal step times (communication all hidden): the mesh that moves less over the links
    return (not e.fits, e.step_time_s, e.communication_s)


def plan(model: ModelSpec, pod: hw.Pod, global_batch: int, *,
         mesh: Mapping[str, int] | None = None, efficiency: Efficiency | None = None,
         baseline: bool = True) -> list[Estimate]:
    """Estimates for every mesh of `pod` the model allows (or the one `mesh` given), ranked:
    fitting meshes first, then by step time (then by the time its collectives take, hidden or
    not). `baseline`: fill in scaling efficiency."""
    eff = efficiency or efficiency_for(pod)
    if mesh is not None:
        mesh = prog.check_mesh(mesh, global_batch)
        chips = math.prod(mesh.values())
        if chips != pod.chips:
            raise ConfigError(
                f"--mesh {format_mesh(mesh)} has {chips} devices and the pod {pod.spec} "
                f"has {pod.chips} chips: the sizes must multiply to {pod.chips}.")
        candidates = [dict(mesh)]
    else:
        candidates = factorizations(pod.chips, model.model_axes())
    estimates: list[Estimate] = []
    refused: dict[str, list[str]] = {}  # why -> the meshes refused for it
    for m in candidates:
        try:
            program = model.program(m, global_batch)
        except ConfigError as e:
            if mesh is not None:  # the user's own mesh: say why it cannot be
                raise
            refused.setdefault(str(e), []).append(format_mesh(m))
            continue
        estimates.append(estimate(program, pod, eff))
    if not estimates:
        raise ConfigError(
            f"no mesh of {pod.chips} chips suits this model with global batch "
            f"{global_batch}: " + " ".join(f"[{', '.join(ms[:3])}{' ...' if len(ms) > 3 else ''}] "
                                           f"{why}" for why, ms in refused.items()))
    if baseline:
        estimates = [_with_scaling(model, pod, e, eff) for e in estimates]
    return sorted(estimates, key=_rank_key)


def one_chip(pod: hw.Pod) -> hw.Pod:
    """A pod of one chip of the same kind."""
    return hw.Pod(pod.chip, tuple(1 for _ in pod.shape), tuple(False for _ in pod.wrap))


def _with_scaling(model: ModelSpec, pod: hw.Pod, est: Estimate, eff: Efficiency) -> Estimate:
    # one data replica's batch (a model axis splits each replica over its chips)
    per_chip = est.global_batch * est.mesh.get("model", 1) / est.chips
    batch = max(1, round(per_chip))
    try:
        single = estimate(model.program({"data": 1}, batch), one_chip(pod), eff)
    except ConfigError:
        return est
    ideal = single.samples_per_s * est.chips
    return dataclasses.replace(est, scaling_efficiency=est.samples_per_s / ideal)
