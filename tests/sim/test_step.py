"""The step-time model against hand-computed steps."""

import pytest

from podkit import sim
from podkit.errors import ConfigError
from podkit.sim import collectives as coll
from podkit.sim.program import CollectiveOp, Program
from podkit.sim.step import Efficiency, estimate

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
