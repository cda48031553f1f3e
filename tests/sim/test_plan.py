"""The planner: candidate meshes, ranking, bad input; `podkit plan` on an analytic model."""

import json

import pytest

from podkit import sim
from podkit.errors import ConfigError
from podkit.sim import plan

GPT = plan.Transformer(8, 1024, 16, 4096, 32000, 1024)


def test_factorizations_cover_every_mesh_once():
    meshes = plan.factorizations(8)
    assert len(meshes) == 10  # ordered triples of 8 = 2^3: C(3 + 2, 2)
    assert {"data": 8} in meshes and {"data": 2, "fsdp": 2, "model": 2} in meshes
    assert all(sizes_product(m) == 8 for m in meshes)
    assert len({tuple(sorted(m.items())) for m in meshes}) == len(meshes)


def sizes_product(mesh):
    out = 1
    for s in mesh.values():
        out *= s
    return out


def test_no_mesh_that_does_not_fit_ranks_above_one_that_does():
    # 16 GiB chips and a 1.3B model: replicated 16 times (data=16) its state does not fit,
    # and that mesh would be faster than some that do.
    big = plan.Transformer(24, 2048, 16, 8192, 32000, 512)
    ranked = plan.plan(big, sim.pod("tpu-v5e:4x4"), 16)
    fits = [e.fits for e in ranked]
    assert True in fits and False in fits
    slowest_fitting = max(e.step_time_s for e in ranked if e.fits)
    assert any(not e.fits and e.step_time_s < slowest_fitting for e in ranked)
    assert fits == sorted(fits, reverse=True)  # every fitting mesh first
    fitting = [e.step_time_s for e in ranked if e.fits]
    assert fitting == sorted(fitting)


def test_meshes_the_model_cannot_take_are_left_out_and_a_given_one_is_an_error():
    ranked = plan.plan(plan.Transformer(2, 96, 3, 96, 300, 16), sim.pod("tpu-v5e:2x2"), 8)
    assert all(e.mesh.get("model", 1) == 1 for e in ranked)  # 3 heads: no model axis of 2/4
    with pytest.raises(ConfigError, match="heads"):
        plan.plan(plan.Transformer(2, 96, 3, 96, 300, 16), sim.pod("tpu-v5e:2x2"), 8,
                  mesh={"data": 2, "model": 2})
    with pytest.raises(ConfigError, match=r"data=2,fsdp=2,model=2.*8 devices.*4 chips"):
        plan.plan(GPT, sim.pod("tpu-v5e:2x2"), 8, mesh={"data": 2, "fsdp": 2, "model": 2})


def test_scaling_efficiency_is_one_without_communication_and_below_with_it():
    ranked = plan.plan(GPT, sim.pod("tpu-v5e:2x2"), 32)
    assert all(0 < e.scaling_efficiency <= 1.0 + 1e-9 for e in ranked)
    one = plan.plan(GPT, plan.one_chip(sim.pod("tpu-v5e:2x2")), 8)
    assert one[0].scaling_efficiency == pytest.approx(1.0)


@pytest.fixture
def run_plan(capsys):
    """`podkit plan ARGS` in this process (what the command line runs): (exit code, stdout,
    stderr)."""
    from podkit.cli import main

    def run(*args):
        code = main(["plan", *args])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_podkit_plan_json_has_the_documented_keys(run_plan):
    code, out, err = run_plan("--model", "transformer", "--layers", "8", "--d-model", "1024",
                              "--heads", "16", "--ff", "4096", "--vocab", "32000", "--seq",
                              "1024", "--global-batch", "64", "--pod", "tpu-v5p:8", "--json",
                              "--top", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["pod"] == "tpu-v5p:2x2x2" and len(result["estimates"]) == 3
    for e in result["estimates"]:
        assert {"step_time_s", "mfu", "tokens_per_s", "memory_per_device_bytes", "fits",
                "scaling_efficiency"} <= e.keys()


def test_podkit_plan_says_when_a_chip_is_priced_at_the_uncalibrated_default(run_plan,
                                                                           tmp_path):
    # A v5p has no calibration: a compute-bound step's MFU is the default matmul share (0.8),
    # and the table alone would show it as if predicted (docs/planner.md's GPT-124M example).
    small = ("--model", "transformer", "--layers", "2", "--d-model", "256", "--heads", "4",
             "--ff", "1024", "--vocab", "2048", "--seq", "128", "--global-batch", "8",
             "--top", "1")
    code, _, err = run_plan(*small, "--pod", "tpu-v5p:8")
    assert code == 0 and "tpu-v5p is not calibrated" in err and "matmul 0.8," in err, err
    code, out, _ = run_plan(*small, "--pod", "tpu-v5p:8", "--json")
    assert code == 0 and json.loads(out)["efficiency"]["calibrated"] is False
    # the v5e's measured table, and a table of the user's own, are named as such
    code, _, err = run_plan(*small, "--pod", "tpu-v5e:8")
    assert code == 0 and "not calibrated" not in err and "fitted on a TPU v5 lite" in err, err
    mine = tmp_path / "mine.toml"
    mine.write_text('[efficiency.tpu-v5p]\nmatmul = 0.5\nsource = "our v5p, 2026-12"\n')
    code, _, err = run_plan(*small, "--pod", "tpu-v5p:8", "--hardware", str(mine))
    assert code == 0 and "matmul 0.5," in err and "our v5p, 2026-12" in err, err
    mine.write_text("[efficiency.tpu-v5p]\nmatmul = 0.5\n")  # no source of its own
    code, _, err = run_plan(*small, "--pod", "tpu-v5p:8", "--hardware", str(mine))
    assert code == 0 and "an [efficiency.tpu-v5p] table over the TPU defaults" in err, err


@pytest.mark.parametrize("args, match", [
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v9:8"], "unknown hardware"),
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v4:8", "--mesh",
      "data=4"], "data=4 has 4 devices"),
    (["--model", "transformer", "--pod", "tpu-v4:8"], "needs --layers"),
    (["--pod", "tpu-v4:8"], "needs a config"),
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v4:8", "--plot-against",
      "a100"], "add --plot FILE.png"),
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v4:8", "--set",
      "model.remat=full"], "--set model.remat=full overrides a config value"),
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v4:8", "--heads", "12"],
     "--heads does not apply to --model resnet50"),
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v4:8", "--plot",
      "/no/such/folder/x.png"], "the folder /no/such/folder does not exist"),
    (["--model", "resnet50", "--global-batch", "64", "--pod", "tpu-v4:8", "--mesh",
      "data=8,data=1"], "names 'data' twice"),
    # the model's own error, not a list of meshes
    (["--model", "transformer", "--layers", "2", "--d-model", "770", "--heads", "12", "--ff",
      "64", "--vocab", "64", "--seq", "16", "--global-batch", "8", "--pod", "tpu-v4:8"],
     "podkit: error: d_model=770 is not divisible by heads=12"),
])
def test_podkit_plan_bad_input_names_it(run_plan, args, match):
    code, _, err = run_plan(*args)
    assert code == 2 and match in err, err


def test_podkit_plot_writes_a_png_and_checks_the_other_chip(tmp_path, run_plan):
    png = tmp_path / "scaling.png"
    code, out, err = run_plan("--model", "resnet50", "--global-batch", "512", "--pod",
                              "tpu-v4:8", "--per-device-bn", "--plot", str(png),
                              "--plot-against", "a100", "--top", "1")
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # per-device BatchNorm: nothing on the critical path, all communication hidden
    assert "100.0%   compute" in out
    code, _, err = run_plan("--model", "resnet50", "--global-batch", "512", "--pod",
                            "tpu-v4:8", "--plot", str(png), "--plot-against", "b200")
    assert code == 2 and "unknown hardware 'b200'" in err


def test_a_compiled_gpt_takes_flops_and_memory_from_its_analytic_twin():
    from test_program import CONFIG, TINY, compiled

    from podkit.config import load

    base = compiled("dp")
    config = load(CONFIG, [*TINY, "train.microbatches=2"])
    twin = plan.Transformer.of_config(config, "tpu")
    assert twin is not None and dict(twin.extra)["causal"]  # splash on a TPU
    assert plan.Transformer.of_config(config, "gpu").extra != twin.extra  # XLA's attention
    spec = plan.Compiled.of_config(base, config, "tpu")
    assert spec.twin == twin and spec.microbatches == 2
    mesh = {"data": 16}
    got = spec.program(mesh, 64)
    scaled = plan.prog.scale(base, mesh, 64)
    assert got.collectives == scaled.collectives and got.params == scaled.params
    assert got.flops == twin.program(mesh, 64).flops
    # activations at the microbatch's size
    assert plan.TWIN_NOTE in got.notes
    # the state as compiled, the activations the twin's
    assert got.memory_per_device_bytes == (scaled.param_bytes + scaled.optimizer_bytes
                                           + twin.program(mesh, 32).activation_bytes)
    # 64 sequences in microbatches of 32 cannot be split over 64 replicas; 63 are not 2 parts
    with pytest.raises(ConfigError, match=r"each of the 2 microbatches of 32 \(train.micro"):
        spec.program({"data": 64}, 64)
    with pytest.raises(ConfigError, match=r"63 is not 2 equal microbatches"):
        spec.program({"data": 1}, 63)
    # retargeted for a GPU: XLA's attention, whole scores
    assert dict(spec.retarget("gpu").twin.extra)["causal"] is False
    assert spec.retarget("cpu").twin is None  # on a CPU the compiled numbers are its own
