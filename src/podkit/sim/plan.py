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
from podkit.strategy import DCN

AXES = ("data", "fsdp", "model")  # the axes inside a slice (across slices: "dcn")


class ModelSpec(Protocol):
    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program: ...

    def model_axes(self) -> tuple[str, ...]: ...


@dataclasses.dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer, by its dims; the rest of analytic.transformer's keywords
    (biases, learned_positions, causal, flash_attention, compute_bytes, ...) in `extra`."""

    layers: int
    d_model: int
    heads: int
    ff: int
    vocab: int
    seq: int
    extra: tuple[tuple[str, Any], ...] = ()
    kv_heads: int | None = None
    head_dim: int | None = None
    gated_mlp: bool = False
    remat: str = "none"

    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program:
        return analytic.transformer(self.layers, self.d_model, self.heads, self.ff, self.vocab,
                                    self.seq, global_batch, mesh, kv_heads=self.kv_heads,
                                    head_dim=self.head_dim, gated_mlp=self.gated_mlp,
                                    remat=self.remat, **dict(self.extra))

    def model_axes(self) -> tuple[str, ...]:
        return AXES

    @classmethod
    def of_config(cls, config: Any, family: str, optimizer_bytes_per_param: int = 8
                  ) -> Transformer | None:
        """The analytic twin of a podkit GPT or Llama-family config as it runs on a chip of
        `family`, or None where the analytic model does not cover it (another model, a remat
        policy it lacks, a CPU: there the compiled numbers are the target's own). Attention
        "auto" is splash on a TPU (causal FLOPs halved, no s^2 scores kept) and XLA's
        elsewhere (the whole score matrix, computed and kept)."""
        model = config.model
        name = getattr(model, "name", "")
        remat = {"none": "none", "full": "full", "nothing_saveable": "full",
                 "minimal": "minimal", "dots_saveable": "minimal"}.get(
                     getattr(model, "remat", ""))
        if name not in ("gpt", "llama") or remat is None or family == "cpu":
            return None
        splash = model.attention == "splash" or (model.attention == "auto" and family == "tpu")
        extra: tuple[tuple[str, Any], ...] = (
            ("causal", splash), ("flash_attention", splash),
            ("compute_bytes", 2 if model.precision == "mixed_bfloat16" else 4),
            ("optimizer_bytes_per_param", optimizer_bytes_per_param),
            ("vocab_multiple", model.vocab_multiple))
        family_keys: dict[str, Any] = {}
        if name == "llama":  # RMSNorm (no biases), RoPE (no position table), SwiGLU, GQA
            extra += (("biases", False), ("learned_positions", False),
                      ("tied_embeddings", model.tie_embeddings), ("qkv_bias", model.qkv_bias),
                      ("qk_norm", model.qk_norm), ("split_kv", False))
            family_keys = {"kv_heads": model.kv_heads or None,
                           "head_dim": model.head_dim or None, "gated_mlp": True}
        return cls(model.layers, model.embed, model.heads, model.mlp,
                   prog.vocab_size(config.data, model), config.data.seq_len, remat=remat,
                   extra=extra, **family_keys)


@dataclasses.dataclass(frozen=True)
class ResNet50:
    image_size: int = 224
    extra: tuple[tuple[str, Any], ...] = ()
    synchronized_bn: bool = True

    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program:
        return analytic.resnet50(global_batch, mesh, self.image_size,
                                 synchronized_bn=self.synchronized_bn, **dict(self.extra))

    def model_axes(self) -> tuple[str, ...]:
        return ("data", "fsdp")  # no tensor-parallel ResNet


TWIN_NOTE = ("FLOPs, memory and HBM traffic from the analytic model of the config (compiled "
             "here on CPU, XLA's buffer assignment and byte count are not the target's: 3x "
             "the memory a TPU v5e compiled for GPT-124M); collectives from the compiled step")


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A program compiled on a small mesh (`program.extract`), scaled to each candidate.

    `twin`: the analytic model of the same config for the target chip (`of_config`).
    XLA:CPU, where the program is compiled, keeps more memory and moves more bytes than XLA on
    a TPU (it computes bfloat16 in float32, fuses less; GPT-124M: 25.6 GiB against the v5e's
    8.7): with a twin, the program's collectives and parameters are the compiled ones and its
    FLOPs, HBM traffic and memory the twin's, its activations at the microbatch's size."""

    base: prog.Program
    twin: ModelSpec | None = None
    microbatches: int = 1
    config: Any = None  # the config compiled, for `retarget`

    @classmethod
    def of_config(cls, base: prog.Program, config: Any, family: str) -> Compiled:
        """The compiled `base` of `config`, with its analytic twin for a chip of `family`."""
        per_param = round(4 * base.optimizer_bytes / base.param_bytes) if base.param_bytes \
            else 8  # float32 weights: the optimizer's bytes per parameter, as compiled
        return cls(base, Transformer.of_config(config, family, per_param),
                   config.train.microbatches, config)

    def retarget(self, family: str) -> Compiled:
        """The same compiled program with the twin for a chip of another family."""
        return self if self.config is None else Compiled.of_config(self.base, self.config,
                                                                   family)

    def program(self, mesh: Mapping[str, int], global_batch: int) -> prog.Program:
        scaled = prog.scale(self.base, mesh, global_batch)
        if self.twin is None:
            return scaled
        m = self.microbatches
        if global_batch % m:
            raise ConfigError(f"global batch {global_batch} is not {m} equal microbatches "
                              f"(train.microbatches = {m}); a multiple of {m}, or --set "
                              "train.microbatches=1.")
        whole = self.twin.program(mesh, global_batch)
        try:
            micro = self.twin.program(mesh, global_batch // m) if m > 1 else whole
        except ConfigError as e:
            raise ConfigError(f"each of the {m} microbatches of {global_batch // m} "
                              f"(train.microbatches = {m}) is split over the mesh: {e}") from None
        # the state's bytes as compiled (exact), the activations the twin's at a microbatch
        memory = scaled.param_bytes + scaled.optimizer_bytes + micro.activation_bytes
        return dataclasses.replace(
            scaled, flops=whole.flops, conv_flops=whole.conv_flops,
            recompute_flops=whole.recompute_flops, bytes_accessed=whole.bytes_accessed,
            activation_bytes=micro.activation_bytes, memory_per_device_bytes=int(memory),
            notes=(*scaled.notes, TWIN_NOTE))

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
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"global_batch={global_batch!r}; samples per step, a positive int.")
    slices = pod.slices
    if global_batch % slices:
        raise ConfigError(f"global_batch={global_batch} does not split over {slices} slices "
                          f"(data parallel across them); use a multiple of {slices}, e.g. "
                          f"{-(-global_batch // slices) * slices}.")
    if not isinstance(model, Compiled):
        model.program({"data": 1}, global_batch)  # the model's own errors, before any mesh's
    if mesh is not None:
        mesh = prog.check_mesh(mesh)
        if mesh.get(DCN, 1) not in (1, slices):
            raise ConfigError(f"--mesh {format_mesh(mesh)}: dcn is the slices, {slices} on "
                              f"{pod.spec}; leave it out (it is added) or give dcn={slices}.")
        mesh = prog.check_mesh({a: n for a, n in mesh.items() if a != DCN},
                               global_batch // slices)
        chips = math.prod(mesh.values())
        if chips != pod.slice_chips:
            what = f"one slice of {pod.spec}" if slices > 1 else f"the pod {pod.spec}"
            raise ConfigError(
                f"--mesh {format_mesh(mesh)} has {chips} devices and {what} "
                f"has {pod.slice_chips} chips: the sizes must multiply to {pod.slice_chips}.")
        candidates = [dict(mesh)]
    else:
        candidates = factorizations(pod.slice_chips, model.model_axes())
    estimates: list[Estimate] = []
    refused: dict[str, list[str]] = {}  # why -> the meshes refused for it
    for m in candidates:
        try:  # one slice's program on its share of the batch; the slices' all-reduce added
            program = prog.across_slices(model.program(m, global_batch // slices), slices)
        except ConfigError as e:
            if mesh is not None:  # the user's own mesh: say why it cannot be
                raise
            refused.setdefault(str(e), []).append(format_mesh(m))
            continue
        estimates.append(estimate(program, pod, eff))
    if not estimates:
        shown = list(refused.items())[:3]
        more = sum(len(ms) for _, ms in list(refused.items())[3:])
        raise ConfigError(
            f"no mesh of {pod.chips} chips suits this model with global batch {global_batch}. "
            + " ".join(f"{ms[0]}: {why}" for why, ms in shown)
            + (f" ({more} more meshes refused; give one with --mesh to see its reason.)"
               if more else "")
            + f" Fix: a global batch that {pod.chips} chips divide (e.g. "
            f"{pod.chips * max(1, -(-global_batch // pod.chips))}), or a smaller pod.")
    single = _one_chip_rate(model, pod, global_batch, eff) if baseline else None
    if single is not None:
        estimates = [dataclasses.replace(e, scaling_efficiency=e.samples_per_s
                                         / (single * e.chips)) for e in estimates]
    return sorted(estimates, key=_rank_key)


def one_chip(pod: hw.Pod) -> hw.Pod:
    """A pod of one chip of the same kind (one slice)."""
    return hw.Pod(pod.chip, tuple(1 for _ in pod.shape), tuple(False for _ in pod.wrap))


def _one_chip_rate(model: ModelSpec, pod: hw.Pod, global_batch: int, eff: Efficiency
                   ) -> float | None:
    """Samples/s of one chip of `pod` running the pod's samples per chip: what every mesh's
    scaling efficiency compares with (the same for all of them, so equal throughput scores
    equally whatever the mesh). Above 1 where sharding takes work off each chip that one chip
    has to do alone (FSDP's optimizer update on 1/n of the state). None where one chip cannot
    run the model (a compiled program scale() cannot shrink to it)."""
    batch = max(1, round(global_batch / pod.chips))
    try:
        return estimate(model.program({"data": 1}, batch), one_chip(pod), eff).samples_per_s
    except ConfigError:
        return None
