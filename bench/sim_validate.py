"""The pod simulator against published results (docs/sim-validation.md), and the seed question.

    python bench/sim_validate.py            # a table: prediction, published figure, error
    python bench/sim_validate.py --json F   # also the figures as JSON

Each case is set up as its publication ran it (model dims, batch, mesh, chip count), with
podkit.sim's calibrated or default efficiencies -- nothing here is fitted to the figure it
is compared with. Runs in seconds on a CPU: the analytic models, no compilation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from podkit.sim import collectives as coll
from podkit.sim import hardware as hw
from podkit.sim import plan as planner
from podkit.sim import step

IMAGENET_90_EPOCHS = 90 * 1_281_167  # Haiku trains on TRAIN_AND_VALID


def haiku_v3_fit() -> float:
    """The v3's convolution efficiency, refitted on Haiku's ImageNet example: ResNet-50, 90
    epochs in 130 min on 32 v3 TensorCores (16 chips), 32 images per core, per-device
    BatchNorm (pmap). podkit.sim.step.PUBLISHED holds the result; this checks it."""
    model = planner.ResNet50(synchronized_bn=False)
    unit = dataclasses.replace(step.DEFAULTS["tpu"], conv=1.0)
    est = planner.plan(model, hw.pod("tpu-v3:16"), 1024, mesh={"data": 16},
                       efficiency=unit)[0]
    assert est.bound == "compute" and est.exposed_communication_s == 0  # linear in conv
    return IMAGENET_90_EPOCHS / (130 * 60) / est.samples_per_s


def resnet_v3() -> list[dict]:
    """ResNet-50 on v3 pods, the v3 calibrated on Haiku's 16-chip figure (haiku_v3_fit).
    Ying et al. 2018: 1,024 chips, over 1.05 M images/s, global batch 32,768 (32 images per
    chip), BatchNorm over a few replicas ("distributed batch normalization"): modelled as
    per-chip statistics. Haiku's own larger rows: 64 chips (33 min) and 512 chips (5 min, a
    run short enough for its start-up and final evaluation to count). The whole-pod
    synchronized BatchNorm (podkit's own semantics under jit) is shown for what it costs."""
    fitted = haiku_v3_fit()
    used = step.efficiency_for(hw.pod("tpu-v3:16")).conv
    assert abs(fitted - used) < 5e-4, (fitted, used)  # step.PUBLISHED is this fit
    out = []
    per_chip = planner.ResNet50(synchronized_bn=False)
    for chips, batch, published, case, source in (
            (1024, 32768, 1.05e6, "Ying et al. 2018: 1,024 chips, batch 32,768",
             "Ying et al. 2018, abstract"),
            (64, 4096, IMAGENET_90_EPOCHS / (33 * 60), "Haiku: 64 chips, batch 4,096, 33 min",
             "Haiku examples/imagenet README"),
            (512, 32768, IMAGENET_90_EPOCHS / (5 * 60), "Haiku: 512 chips, batch 32,768, 5 min",
             "Haiku examples/imagenet README")):
        est = planner.plan(per_chip, hw.pod(f"tpu-v3:{chips}"), batch,
                           mesh={"data": chips})[0]
        out.append(row(f"ResNet-50 on TPU v3, {case}", est.samples_per_s, published,
                       "images/s", source, est=est))
    synced = planner.ResNet50(synchronized_bn=True)
    est = planner.plan(synced, hw.pod("tpu-v3:1024"), 32768, mesh={"data": 1024})[0]
    out.append(row("the Ying et al. case with BatchNorm synchronized over the pod",
                   est.samples_per_s, 1.05e6, "images/s", "", primary=False, est=est))
    return out


def maxtext_32b() -> dict:
    """MaxText's 32B on v5p-128 (64 chips: v5p-N counts TensorCores, 2 per chip): 71.47% MFU
    (MaxText README's table). Its config (MaxText/configs/v5p/32b.sh): global_parameter_scale
    32 -> 8192 embed, 64 heads of 128, MLP 28672 (SwiGLU), 32 layers, vocab 32000 (base.yml);
    per_device_batch_size 7 (448 sequences of 2048), ici_fsdp -1 (16) x ici_tensor 4,
    remat_policy minimal, no biases, RoPE (no learned positions)."""
    model = planner.Transformer(32, 8192, 64, 28672, 32000, 2048, extra=(
        ("biases", False), ("learned_positions", False)), head_dim=128, gated_mlp=True,
        remat="minimal")
    est = planner.plan(model, hw.pod("tpu-v5p:64"), 448, mesh={"fsdp": 16, "model": 4})[0]
    return row("MaxText 32B, v5p-128 (64 chips), fsdp 16 x tensor 4", est.mfu, 0.7147, "MFU",
               "MaxText README, v5p table", est=est)


PALM_VOCAB = 256000  # padded by the model to 256,512 on model = 12 (analytic.padded_vocab)


def palm_model(remat: str = "full") -> planner.Transformer:
    """PaLM 540B (Chowdhery et al. 2022, Table 1): 118 layers, d 18432, 48 heads of 256,
    multi-query attention (one k/v head, whole on every model device), a SwiGLU MLP of 4d,
    tied input/output embeddings, no biases, RoPE, sequences of 2048, a 256k vocabulary."""
    return planner.Transformer(118, 18432, 48, 73728, PALM_VOCAB, 2048, extra=(
        ("biases", False), ("learned_positions", False), ("tied_embeddings", True)),
        head_dim=256, kv_heads=1, gated_mlp=True, remat=remat)


def palm_540b() -> dict:
    """PaLM 540B on two TPU v4 pods of 3,072 chips (6,144), data parallel across the pods
    over the data-center network, 12-way model x 256-way data/weight (FSDP) parallel inside a
    pod, full rematerialization, batch 2,048 sequences of 2048 tokens: 46.2% MFU (Chowdhery
    et al. 2022, Table 3 and section 4)."""
    est = planner.plan(palm_model(), hw.pod("tpu-v4:3072", slices=2), 2048,
                       mesh={"fsdp": 256, "model": 12})[0]
    return row("PaLM 540B, 2 x 3,072 TPU v4 (multislice), fsdp 256 x model 12", est.mfu,
               0.462, "MFU", "Chowdhery et al. 2022, Table 3", est=est)


def fits() -> list[dict]:
    """Memory per chip of what published systems ran (it must fit), and of the same
    without rematerialization (it must not)."""
    out = []
    for label, remat, ran in (("PaLM 540B per pod, full remat (ran)", "full", True),
                              ("PaLM 540B per pod, no remat", "none", False)):
        est = planner.plan(palm_model(remat), hw.pod("tpu-v4:3072"), 1024,
                           mesh={"fsdp": 256, "model": 12})[0]
        out.append({"case": label, "ran": ran, "fits": est.fits,
                    "memory_gib": est.memory_per_device_bytes / 2**30,
                    "usable_gib": est.usable_memory_bytes / 2**30})
    m = maxtext_32b()
    out.append({"case": "MaxText 32B on v5p-128, remat minimal (ran)", "ran": True,
                "fits": m["fits"], "memory_gib": m["memory_per_device_gib"],
                "usable_gib": hw.chip("tpu-v5p").hbm_bytes * step.HBM_USABLE / 2**30})
    return out


def h100_busbw() -> dict:
    """NCCL's all-reduce bus bandwidth on 8 H100s (one NVLink domain), large messages: about
    370 GB/s (nccl-tests' all_reduce_perf on DGX/HGX H100, without NVLink SHARP)."""
    pod = hw.pod("h100:8")
    eff = step.efficiency_for(pod)
    group = coll.layout(pod, {"data": 8}).group("data")
    size = 8 << 30
    seconds = step.collective_seconds(coll.collective_time("all-reduce", size, group), eff)
    busbw = size / seconds * coll.bus_factor("all-reduce", 8)
    return row("8x H100 all-reduce bus bandwidth, 8 GiB", busbw / 1e9, 370.0, "GB/s",
               "nccl-tests all_reduce_perf, HGX H100")


def row(case: str, predicted: float, published: float, unit: str, source: str, *,
        primary: bool = True, est: step.Estimate | None = None) -> dict:
    out = {"case": case, "predicted": predicted, "published": published, "unit": unit,
           "error": (predicted - published) / published, "source": source,
           "primary": primary}
    if est is not None:
        out.update(step_time_s=est.step_time_s, compute_s=est.compute_s,
                   exposed_communication_s=est.exposed_communication_s, bound=est.bound,
                   fits=est.fits, memory_per_device_gib=est.memory_per_device_bytes / 2**30)
    return out


def seed_question() -> list[dict]:
    """ResNet-50 at 2,048 chips, 64 images per chip: TPU v4 against A100, weak-scaling
    efficiency (throughput per chip against one chip's), under several assumptions."""
    a100 = hw.chip("a100")
    # A 2018-style GPU cluster: one 100 Gb/s Ethernet link per 8-GPU node (12.5 GB/s shared
    # by 8 GPUs), gradient all-reduce after the backward pass (no overlap).
    ethernet = dataclasses.replace(a100, name="a100-100gbe", network_bandwidth=12.5e9 / 8,
                                   network_latency=10e-6)
    cases = []
    for bn in (False, True):
        model = planner.ResNet50(synchronized_bn=bn)
        for label, pod, eff in (
                ("TPU v4", hw.pod("tpu-v4:2048"), None),
                ("A100, InfiniBand (NDR/HDR per GPU)", hw.pod("a100:2048"), None),
                ("A100, 100 GbE per node, no overlap", hw.Pod(ethernet, (256, 8)),
                 dataclasses.replace(step.DEFAULTS["gpu"], overlap=0.0))):
            est = planner.plan(model, pod, 2048 * 64, mesh={"data": 2048}, efficiency=eff)[0]
            cases.append({"hardware": label, "batchnorm": "pod-wide" if bn else "per chip",
                          "scaling_efficiency": est.scaling_efficiency,
                          "images_per_s": est.samples_per_s,
                          "exposed_communication_ms": est.exposed_communication_s * 1e3,
                          "step_ms": est.step_time_s * 1e3})
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    rows = [*resnet_v3(), maxtext_32b(), palm_540b(), h100_busbw()]
    print(f"TPU v3 convolution efficiency fitted on Haiku's 16-chip ResNet-50: "
          f"{haiku_v3_fit():.4f}")
    print(f"{'case':<72} {'predicted':>12} {'published':>12} {'error':>7}")
    for r in rows:
        fmt = (lambda v: f"{v:.2%}") if r["unit"] == "MFU" else (lambda v: f"{v:,.4g}")
        print(f"{r['case']:<72} {fmt(r['predicted']):>12} {fmt(r['published']):>12} "
              f"{r['error']:>+7.1%}{'' if r['primary'] else '  (not the published setup)'}")
    memory = fits()
    print("\nMemory per chip against what published systems ran")
    for f in memory:
        print(f"  {f['case']:<48} {f['memory_gib']:6.1f} GiB of {f['usable_gib']:.1f} usable: "
              f"{'fits' if f['fits'] else 'does NOT fit'}"
              + ("" if f["fits"] == f["ran"] else "  <- the model disagrees with the record"))
    seed = seed_question()
    print("\nResNet-50, 2,048 chips, 64 images per chip: weak-scaling efficiency")
    for c in seed:
        print(f"  {c['hardware']:<38} BatchNorm {c['batchnorm']:<9} "
              f"{c['scaling_efficiency']:>6.1%}  ({c['images_per_s'] / 1e6:.2f} M images/s, "
              f"{c['exposed_communication_ms']:.1f} ms of {c['step_ms']:.1f} ms exposed)")
    if args.json:
        Path(args.json).write_text(json.dumps({"validation": rows, "fits": memory,
                                               "seed": seed}, indent=1))


if __name__ == "__main__":
    main()
