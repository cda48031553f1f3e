"""The step-time model against hand-computed steps."""

import dataclasses

import pytest

from podkit import sim
from podkit.errors import ConfigError
from podkit.sim import collectives as coll
from podkit.sim.program import CollectiveOp, Program
from podkit.sim.step import DEFAULTS, Efficiency, device_share, efficiency_for, estimate

EFF = Efficiency(matmul=0.5, memory=0.5, overlap=0.5)


def program(mesh, flops=1e12, bytes_accessed=1e9, collectives=(), memory=1 << 30):
    return Program(mesh=mesh, global_batch=64, flops=flops, xla_flops=None,
                   bytes_accessed=bytes_accessed, collectives=tuple(collectives), params=1000,
                   param_bytes=4000, optimizer_bytes=8000, activation_bytes=0,
                   memory_per_device_bytes=memory, tokens_per_sample=128,
                   model_kind="transformer")


def test_a_compute_bound_step_without_collectives():
    pod = sim.pod("tpu-v5e:2x2")
    est = estimate(program({"data": 4}), pod, EFF)
    # 1e12 FLOPs at half of 197e12; 1e9 bytes at half of 819e9 B/s: the FLOPs win.
    assert est.flops_s == pytest.approx(1e12 / (0.5 * 197e12))
    assert est.memory_s == pytest.approx(1e9 / (0.5 * 819e9))
    assert est.step_time_s == pytest.approx(est.flops_s) and est.bound == "compute"
    assert est.mfu == pytest.approx(0.5)  # all of the step is FLOPs at half the peak
    assert est.tokens_per_s == pytest.approx(64 * 128 / est.step_time_s)
    assert est.fits and est.to_json()["fits"] is True


def test_batch_axis_collectives_hide_behind_compute_and_tensor_parallel_ones_do_not():
    pod = sim.pod("tpu-v5e:4x4")
    mesh = {"data": 4, "model": 4}
    ops = [CollectiveOp("all-reduce", 1 << 28, 4, ("data",)),
           CollectiveOp("all-reduce", 1 << 20, 4, ("model",), count=8)]
    est = estimate(program(mesh, collectives=ops), pod, EFF)
    layout = coll.layout(pod, mesh)
    grads = coll.collective_time("all-reduce", 1 << 28, layout.group("data")).total
    acts = 8 * coll.collective_time("all-reduce", 1 << 20, layout.group("model")).total
    assert est.communication_s == pytest.approx(grads + acts)
    # Half of the compute time hides the gradient all-reduce; the activations' are exposed.
    hidden = 0.5 * est.compute_s
    assert est.exposed_communication_s == pytest.approx(acts + max(0.0, grads - hidden))
    assert est.step_time_s == pytest.approx(est.compute_s + est.exposed_communication_s)


def test_memory_beyond_the_usable_hbm_does_not_fit():
    pod = sim.pod("tpu-v5e:2x2")
    est = estimate(program({"data": 4}, memory=16 << 30), pod, EFF)
    assert not est.fits and est.usable_memory_bytes < 16 << 30


def test_a_mesh_that_is_not_the_pod_is_an_error_naming_both():
    with pytest.raises(ConfigError, match=r"\{'data': 8\} has 8 devices.*tpu-v5e:2x2 has 4"):
        estimate(program({"data": 8}), sim.pod("tpu-v5e:2x2"), EFF)


def test_an_efficiency_outside_0_1_is_an_error():
    with pytest.raises(ConfigError, match="matmul=1.5"):
        Efficiency(matmul=1.5, memory=0.5, overlap=0.5)


def test_convolution_flops_run_at_their_own_efficiency():
    pod = sim.pod("tpu-v5e:1")
    p = dataclasses.replace(program({"data": 1}), conv_flops=0.75e12)
    est = estimate(p, pod, Efficiency(matmul=0.5, memory=0.5, overlap=0.5, conv=0.25))
    # 0.25e12 matmul FLOPs at half the peak, 0.75e12 convolution FLOPs at a quarter
    assert est.flops_s == pytest.approx(0.25e12 / (0.5 * 197e12) + 0.75e12 / (0.25 * 197e12))
    # without a conv efficiency, convolutions run as matmuls
    assert estimate(p, pod, EFF).flops_s == pytest.approx(1e12 / (0.5 * 197e12))


def test_calibrated_efficiencies_are_read_from_the_hardware_files(tmp_path, monkeypatch):
    path = tmp_path / "mine.toml"
    path.write_text('[efficiency.tpu-v5e]\nmatmul = 0.6\nmemory = 1.3\noverlap = 0.8\n'
                    'conv = 0.3\nsource = "measured"\n')
    monkeypatch.setenv("PODKIT_SIM_HARDWARE", str(path))
    eff = efficiency_for(sim.pod("tpu-v5e:4"))
    assert (eff.matmul, eff.memory, eff.overlap, eff.conv, eff.source) == (
        0.6, 1.3, 0.8, 0.3, "measured")
    assert efficiency_for(sim.pod("tpu-v4:4")) == DEFAULTS["tpu"]  # not in the file
    # a chip fitted on a published figure (bench/sim_validate.py refits it)
    assert efficiency_for(sim.pod("tpu-v3:4")).conv == pytest.approx(0.1843)
    # a table may set some keys: the rest are the chip's defaults
    path.write_text('[efficiency.tpu-v4]\nmatmul = 0.6\n')
    monkeypatch.setenv("PODKIT_SIM_HARDWARE", str(path) + "x")  # a new key for the cache
    path.rename(str(path) + "x")
    assert efficiency_for(sim.pod("tpu-v4:4")) == dataclasses.replace(DEFAULTS["tpu"],
                                                                      matmul=0.6)
    bad = tmp_path / "bad.toml"
    bad.write_text('[efficiency.tpu-v4]\nmatmull = 0.6\n')
    with pytest.raises(ConfigError, match=r"\[efficiency.tpu-v4\] has matmull; its keys are "):
        efficiency_for(sim.pod("tpu-v4:4"), paths=[bad])
    bad.write_text('[efficiency.tpu-v4]\nmatmul = 1.6\n')
    with pytest.raises(ConfigError, match=r"bad.toml.*efficiency matmul=1.6"):
        efficiency_for(sim.pod("tpu-v4:4"), paths=[bad])
    # an edited file is read again
    bad.write_text('[efficiency.tpu-v4]\nmatmul = 0.7\n# a longer file\n')
    assert efficiency_for(sim.pod("tpu-v4:4"), paths=[bad]).matmul == 0.7
    bad.write_text('efficiency = 3\n')
    with pytest.raises(ConfigError, match=r"efficiency = 3; write one \[efficiency.NAME\]"):
        efficiency_for(sim.pod("tpu-v4:4"), paths=[bad])


@pytest.mark.parametrize("bad", [{"memory": 2.5}, {"conv": 0.0}, {"matmul": "0.5"},
                                 {"link": float("nan")}, {"overhead_s": "1ms"},
                                 {"overhead_s": -1.0}])
def test_an_efficiency_out_of_its_range_names_it(bad):
    values = {"matmul": 0.5, "memory": 0.5, "overlap": 0.5, **bad}
    with pytest.raises(ConfigError, match=f"{next(iter(bad))}="):
        Efficiency(**values)


def test_links_run_at_the_efficiencys_share_of_their_bandwidth_and_critical_ops_are_exposed():
    pod = sim.pod("h100:8")
    op = CollectiveOp("all-reduce", 1 << 30, 8, ("data",))
    group = coll.layout(pod, {"data": 8}).group("data")
    cost = coll.collective_time("all-reduce", 1 << 30, group)
    eff = Efficiency(matmul=0.5, memory=0.5, overlap=1.0, link=0.8)
    (timed,) = estimate(program({"data": 8}, collectives=[op]), pod, eff).collectives
    assert timed.seconds == pytest.approx(cost.latency_s + cost.bandwidth_s / 0.8)
    assert not timed.exposed  # a batch-axis all-reduce hides behind compute
    critical = dataclasses.replace(op, critical=True)
    est = estimate(program({"data": 8}, collectives=[critical]), pod, eff)
    assert est.collectives[0].exposed
    assert est.exposed_communication_s == pytest.approx(timed.seconds)


def test_devices_share_a_cpu_pods_cores_and_not_a_tpus(monkeypatch):
    from podkit.sim import cpu
    monkeypatch.setattr(cpu, "cores", lambda: 2)
    eff = dataclasses.replace(DEFAULTS["cpu"], parallel=0.5)
    # one device spreads half its step over 2 cores: 1 / (0.5 + 0.25); 2 devices get a core
    # each; 4 and 8 take turns on the 2 cores
    assert [device_share(sim.pod(f"cpu:{n}"), eff) for n in (1, 2, 4, 8)] == pytest.approx(
        [4 / 3, 1.0, 0.5, 0.25])
    assert device_share(sim.pod("tpu-v5e:8"), eff) == 1.0
