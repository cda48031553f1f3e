"""The FLOPs of a traced program: what MFU divides by the devices' peak.

    flops, notes = count(traced.jaxpr)      # a jax.stages.Traced's ClosedJaxpr

Counted: matrix multiplications (`dot_general`: 2 x batch x M x N x K) and convolutions (2 x
output elements x the kernel's elements per output feature), the model FLOPs that MFU is
conventionally about, each loop body times its trip count. XLA's own cost analysis of the
compiled program counts a loop's body once, and podkit's steps are loops (steps_per_execution,
microbatches, scanned layers): that is why the count is taken on the jaxpr (docs/design.md).

Custom kernels (Pallas) state their FLOPs through `cost_estimate`; Pallas splash attention,
which does not, is counted as the attention it computes: forward 4 x B x H x Tq x Tk x D, the
backward 8 x (in one fused kernel or dq and dkv kernels), halved when the call sits under the
`causal_attention` name scope podkit's kernel wrapper opens (the usual causal convention;
what splash skips). Anything else a kernel does is not counted and named in `notes`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
from jax.extend import core

from podkit.kernels.attention import CAUSAL_SCOPE


@dataclasses.dataclass(frozen=True)
class Flops:
    """FLOPs by op class: matrix multiplications (attention kernels too: matmuls inside) and
    convolutions. They run at different shares of a chip's peak (a large matmul near it, a
    ResNet's convolutions far below), which the pod simulator's per-class efficiencies need
    (podkit.sim.step)."""

    dot: float = 0.0
    conv: float = 0.0

    @property
    def total(self) -> float:
        return self.dot + self.conv

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.dot + other.dot, self.conv + other.conv)

    def __mul__(self, times: float) -> Flops:
        return Flops(self.dot * times, self.conv * times)


def count(jaxpr: Any) -> tuple[float, list[str]]:
    """(FLOPs, notes) of a ClosedJaxpr or Jaxpr; notes name what could not be counted."""
    flops, notes = count_by_class(jaxpr)
    return flops.total, notes


def count_by_class(jaxpr: Any) -> tuple[Flops, list[str]]:
    """(FLOPs by op class, notes) of a ClosedJaxpr or Jaxpr, in one walk."""
    notes: list[str] = []
    return _jaxpr(getattr(jaxpr, "jaxpr", jaxpr), notes, ""), sorted(set(notes))


def _jaxpr(jaxpr: Any, notes: list[str], scope: str) -> Flops:
    """`scope`: the name stack of the equation holding this jaxpr (nested name stacks are
    relative to it)."""
    return sum((_eqn(e, notes, scope) for e in _live(jaxpr)), Flops())


def _live(jaxpr: Any) -> list[Any]:
    """The equations whose results reach the jaxpr's outputs (or that have effects): XLA
    removes the others, so they cost nothing (a whole-batch forward traced only for its
    timestep masks, podkit.train.step's microbatches). A loop body's outputs all count, and
    so does all of a call (pjit, remat) any of whose outputs is read: liveness is not
    carried into it."""
    used = {v for v in jaxpr.outvars if isinstance(v, core.Var)}
    live = []
    for e in reversed(jaxpr.eqns):
        if e.effects or any(v in used for v in e.outvars if not isinstance(v, core.DropVar)):
            live.append(e)
            used.update(v for v in e.invars if isinstance(v, core.Var))
    return live[::-1]


def _subjaxprs(params: dict) -> list[Any]:
    out = []
    for value in params.values():
        for v in value if isinstance(value, list | tuple) else (value,):
            inner = getattr(v, "jaxpr", None)
            if inner is not None and hasattr(getattr(inner, "jaxpr", inner), "eqns"):
                out.append(getattr(inner, "jaxpr", inner))
            elif hasattr(v, "eqns"):
                out.append(v)
    return out


def _eqn(e: Any, notes: list[str], scope: str) -> Flops:
    name = e.primitive.name
    scope = f"{scope}/{e.source_info.name_stack}"
    if name == "dot_general":
        return Flops(dot=_dot(e))
    if name == "conv_general_dilated":
        return Flops(conv=_conv(e))
    if name == "pallas_call":
        return Flops(dot=_pallas(e, notes, scope))
    if name == "scan":
        return _jaxpr(e.params["jaxpr"].jaxpr, notes, scope) * e.params["length"]
    if name == "cond":  # the costliest branch, whole (its classes together)
        return max((_jaxpr(b.jaxpr, notes, scope) for b in e.params["branches"]),
                   key=lambda f: f.total, default=Flops())
    if name == "while":
        notes.append("a while loop's body is counted once (its trip count is not static)")
        return sum((_jaxpr(j, notes, scope) for j in _subjaxprs(e.params)), Flops())
    inner = sum((_jaxpr(j, notes, scope) for j in _subjaxprs(e.params)), Flops())
    if name == "shard_map" and inner.total:
        mesh = e.params.get("mesh")
        inner = inner * getattr(mesh, "size", 1)  # the body's shapes are one device's
    return inner


def _dot(e: Any) -> float:
    lhs, rhs = (v.aval.shape for v in e.invars[:2])
    (lc, rc), (lb, _) = e.params["dimension_numbers"]
    batch = math.prod(lhs[i] for i in lb)
    contract = math.prod(lhs[i] for i in lc)
    m = math.prod(d for i, d in enumerate(lhs) if i not in lc and i not in lb)
    n = math.prod(d for i, d in enumerate(rhs) if i not in rc and i not in e.params[
        "dimension_numbers"][1][1])
    return 2.0 * batch * m * n * contract


def _conv(e: Any) -> float:
    out = e.outvars[0].aval.shape
    kernel = e.invars[1].aval.shape
    spec = e.params["dimension_numbers"]
    out_features = kernel[spec.rhs_spec[0]] if spec is not None else kernel[0]
    return 2.0 * math.prod(out) * math.prod(kernel) / max(out_features, 1)


def _pallas(e: Any, notes: list[str], scope: str) -> float:
    estimate = e.params.get("cost_estimate")
    if estimate is not None and getattr(estimate, "flops", None) is not None:
        return float(estimate.flops)
    kernel = str(e.params.get("name") or e.params.get("name_and_src_info") or "")
    if kernel.startswith(("splash_mha", "splash_mqa")):
        # q and k: ([batch,] heads, time, head_dim); the batch is folded into the kernel's
        # grid, or vmapped away (one sequence per call inside shard_map).
        # (The block masks the kernel also takes are integer arrays.)
        shapes = [v.aval.shape for v in e.invars if len(v.aval.shape) >= 3
                  and jnp.issubdtype(v.aval.dtype, jnp.floating)]
        if len(shapes) >= 2:
            q, k = shapes[0], shapes[1]
            per = 2.0 * math.prod(q[:-2]) * q[-2] * k[-2] * q[-1]  # one Tq x Tk x D product
            # Products of (Tq x Tk x D) a kernel contributes to the model's count: the
            # forward's two (q k, p v); the backward's four (dp, dq, dk, dv), all in the fused
            # dkv kernel (it also returns dq) or two each in split dq and dkv kernels.
            fused = "_dkv" in kernel and sum(len(v.aval.shape) >= 3 and jnp.issubdtype(
                v.aval.dtype, jnp.floating) for v in e.outvars) >= 3
            matmuls = 4 if fused else 2
            causal = CAUSAL_SCOPE in scope
            return matmuls * per * (0.5 if causal else 1.0)
    notes.append(f"Pallas kernel {kernel or '?'} states no cost estimate: its FLOPs are not "
                 "counted")
    return 0.0
