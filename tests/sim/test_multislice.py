"""Multislice: TPU slices joined by the data-center network (podkit.sim), the dcn axis."""

import json
import subprocess
import sys

import pytest

from podkit.errors import ConfigError
from podkit.sim import collectives as coll
from podkit.sim import hardware as hw
from podkit.sim import plan as planner
from podkit.sim import program as prog


def palm(remat: str = "full") -> planner.Transformer:
    # PaLM 540B (Chowdhery et al. 2022, Table 1): 118 layers, d 18432, 48 heads of 256,
    # multi-query attention, SwiGLU MLP 4d, 256k vocabulary (padded to the model axis), tied
    # embeddings, no biases, RoPE, sequences of 2048.
    return planner.Transformer(118, 18432, 48, 73728, 256000, 2048, extra=(
        ("biases", False), ("learned_positions", False), ("tied_embeddings", True)),
        head_dim=256, kv_heads=1, gated_mlp=True, remat=remat)


def test_a_multislice_pod_is_slices_of_one_shape():
    pod = hw.pod("tpu-v4:3072", slices=2)
    assert pod.chips == 6144 and pod.slice_chips == 3072 and pod.slices == 2
    assert pod.spec == "2 x tpu-v4:12x16x16"
    assert pod.one_slice() == hw.pod("tpu-v4:3072")
    with pytest.raises(ConfigError, match="slices=2 is for TPU pods.*h100:128"):
        hw.pod("h100:64", slices=2)
    with pytest.raises(ConfigError, match="tpu-v3 has no data-center network figure"):
        hw.pod("tpu-v3:16", slices=2)
    with pytest.raises(ConfigError, match="slices=0; the number of TPU slices"):
        hw.pod("tpu-v5e:16", slices=0)


def test_the_dcn_axis_is_a_ring_of_slices_on_each_chips_share_of_its_host():
    pod = hw.pod("tpu-v5e:256", slices=4)
    group = coll.layout(pod, {"dcn": 4, "data": 256}).group("dcn")
    assert group.size == 4 and group.fabric == "none+dcn"
    b, n, bw, lat = 1e9, 4, pod.chip.dcn_bandwidth, pod.chip.dcn_latency
    cost = coll.collective_time("all-reduce", b, group)
    assert cost.bandwidth_s == pytest.approx(2 * (n - 1) / n * b / bw)
    assert cost.latency_s == pytest.approx(2 * (n - 1) * lat)
    # over data and dcn: reduce-scatter on ICI, the slices' all-reduce on 1/256, all-gather
    both = coll.layout(pod, {"dcn": 4, "data": 256}).group("dcn", "data")
    inside = coll.layout(pod.one_slice(), {"data": 256}).group("data")
    expect = (coll.collective_time("all-reduce", b, inside).bandwidth_s
              + 2 * (n - 1) / n * b / 256 / bw)
    assert coll.collective_time("all-reduce", b, both).bandwidth_s == pytest.approx(expect)
    with pytest.raises(ConfigError, match="the dcn axis is the slices, dcn = 4"):
        coll.layout(pod, {"data": 1024})


def test_slices_add_one_gradient_all_reduce_over_the_dcn_beside_the_backward():
    one = planner.plan(palm(), hw.pod("tpu-v4:3072"), 1024,
                       mesh={"fsdp": 256, "model": 12})[0]
    two = planner.plan(palm(), hw.pod("tpu-v4:3072", slices=2), 2048,
                       mesh={"fsdp": 256, "model": 12})[0]
    assert two.mesh == {"dcn": 2, "fsdp": 256, "model": 12}
    dcn = [c for c in two.collectives if c.axes == ("dcn",)]
    assert len(dcn) == 1 and dcn[0].kind == "all-reduce" and not dcn[0].exposed
    program = palm().program({"fsdp": 256, "model": 12}, 1024)
    assert dcn[0].bytes == pytest.approx(program.param_bytes, rel=1e-6)  # each chip's shard
    assert two.memory_per_device_bytes == one.memory_per_device_bytes
    assert two.step_time_s == pytest.approx(one.step_time_s, rel=1e-6)  # hidden: weak scaling
    assert two.tokens_per_s == pytest.approx(2 * one.tokens_per_s, rel=1e-6)
    with pytest.raises(ConfigError, match="does not split over 2 slices"):
        planner.plan(palm(), hw.pod("tpu-v4:3072", slices=2), 1025)
    with pytest.raises(ConfigError, match="dcn is the slices, 2"):
        planner.plan(palm(), hw.pod("tpu-v4:3072", slices=2), 2048,
                     mesh={"dcn": 3, "fsdp": 256, "model": 12})


def test_slower_networks_expose_the_cross_slice_all_reduce():
    # The same slices on a DCN of a thousandth the bandwidth: the all-reduce no longer hides.
    pod = hw.pod("tpu-v5e:256", slices=2)
    slow = hw.Pod(hw.dataclasses.replace(pod.chip, dcn_bandwidth=pod.chip.dcn_bandwidth / 1e3),
                  pod.shape, pod.wrap, 2)
    model = planner.Transformer(12, 768, 12, 3072, 32768, 1024)
    fast = planner.plan(model, pod, 1024, mesh={"data": 256})[0]
    slowed = planner.plan(model, slow, 1024, mesh={"data": 256})[0]
    assert fast.exposed_communication_s < 0.05 * fast.step_time_s
    assert slowed.exposed_communication_s > 10 * fast.step_time_s


def test_palm_on_two_pods_fits_in_half_a_chip_with_full_remat_and_not_without():
    # PaLM ran 2 pods of 3,072 v4 chips, 12-way model parallel x 256-way data/weight parallel
    # inside a pod, full rematerialization (its section 4). Its MFU against the published
    # 46.2%: tests/sim/test_validation.py.
    pod = hw.pod("tpu-v4:3072", slices=2)
    full = planner.plan(palm(), pod, 2048, mesh={"fsdp": 256, "model": 12})[0]
    assert full.fits and full.memory_per_device_bytes < 32 * 2 ** 30 * 0.5
    none = planner.plan(palm("none"), pod, 2048, mesh={"fsdp": 256, "model": 12})[0]
    assert not none.fits


def test_plan_takes_slices_from_the_flag(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "podkit.cli", "plan", "--model", "transformer", "--layers", "12",
         "--d-model", "768", "--heads", "12", "--ff", "3072", "--vocab", "32768", "--seq",
         "1024", "--global-batch", "2048", "--pod", "tpu-v5e:256", "--slices", "4", "--json",
         "--top", "1", "--plot", str(tmp_path / "slices.png")], capture_output=True, text=True,
        cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    png = (tmp_path / "slices.png").read_bytes()  # scaling over 1 to 64 slices
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    out = json.loads(done.stdout)
    assert out["pod"] == "4 x tpu-v5e:16x16" and out["chips"] == 1024
    assert out["estimates"][0]["mesh"]["dcn"] == 4


def test_across_slices_keeps_a_slices_work():
    p = planner.Transformer(2, 64, 4, 128, 256, 32).program({"data": 4}, 16)
    q = prog.across_slices(p, 3)
    assert q.mesh == {"dcn": 3, "data": 4} and q.global_batch == 48
    assert q.flops == p.flops and q.memory_per_device_bytes == p.memory_per_device_bytes
    assert q.collectives[-1].axes == ("dcn",) and q.collectives[-1].bytes == p.param_bytes // 4
    assert prog.across_slices(p, 1) is p


def test_the_vocabulary_is_padded_to_128_x_the_model_axis_and_said():
    from podkit.sim import analytic

    assert analytic.padded_vocab(256000, 12) == 256512  # 167 x 1,536
    assert analytic.padded_vocab(32000, 4) == 32000  # a multiple of 128 and of 4 already
    assert analytic.padded_vocab(50257) == 50304  # GPT-2's, as Megatron pads it
    program = palm().program({"fsdp": 256, "model": 12}, 1024)
    assert any("vocabulary 256,000 padded to 256,512" in n for n in program.notes)
    assert program.dims["vocab"] == 256000
    unpadded = palm().program({"fsdp": 1024}, 1024)
    assert not any("padded" in n for n in unpadded.notes)  # 256,000 = 2,000 x 128
