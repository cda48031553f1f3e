"""`podkit compile-report` and model.compile_report(): what XLA did to the train step -- op
counts, fusions, FLOPs, collectives with their mesh axes, memory per device."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit.monitor import compile_report as cr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cli import SEED, podkit_cli


def test_xla_replica_group_spellings_map_to_mesh_axes():
    mesh = {"data": 2, "fsdp": 4}
    explicit = cr.replica_groups("x, replica_groups={{0,1,2,3},{4,5,6,7}}, y")
    assert explicit == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cr.axes_of(explicit[0], mesh) == ("fsdp",)
    iota = cr.replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), ")
    assert iota[0] == [0, 4] and cr.axes_of(iota[0], mesh) == ("data",)
    named = cr.replica_groups("replica_groups=mesh['a'=2,'b'=4] {'a','b'}, use")
    assert named == [list(range(8))] and cr.axes_of(named[0], mesh) == ("data", "fsdp")
    inner = cr.replica_groups("replica_groups=mesh['a'=2,'b'=4] {'a'}, use")
    assert inner[0] == [0, 4]


def test_op_counts_and_shapes_from_hlo_text():
    hlo = """ENTRY main {
  p.1 = f32[8,4]{1,0} parameter(0)
  %t = (f32[], s32[2]) tuple(%a, %b)
  ROOT add.2 = bf16[8,4]{1,0} add(p.1, p.1), metadata={op_name="x"}
}"""
    assert cr.count_ops(hlo) == {"parameter": 1, "tuple": 1, "add": 1}
    assert cr.shape_bytes("bf16[8,4]{1,0}") == 64
    assert cr.shape_bytes("(f32[], s32[2])") == 12


def test_a_combined_all_reduce_with_a_long_tuple_type_is_seen():
    """XLA prints a long tuple with `/*index=N*/` comments: a DP step's combined gradient
    all-reduce, once missed (only a 4-byte all-reduce was reported)."""
    line = ("  %all-reduce.1 = (f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, "
            "/*index=5*/f32[8]{0}) all-reduce(%a, %b, %c, %d, %e, %f), channel_id=1, "
            "replica_groups={{0,1}}, to_apply=%add")
    (found,) = cr.collectives(line, {"data": 2})
    assert (found.kind, found.bytes, found.axes) == ("all-reduce", 5 * 16 + 32, ("data",))
    assert cr.count_ops(line) == {"all-reduce": 1}


def test_a_model_reports_its_fsdp_collectives_and_memory():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 32)).astype(np.float32)
    y = rng.integers(0, 4, 256)
    with pk.FSDP().scope():
        model = pk.Sequential([pk.layers.Dense(64, activation="relu"), pk.layers.Dense(4)])
        model.compile(optimizer="adam", steps_per_execution=2,
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    report = model.compile_report(x, y, batch_size=64)
    assert report.devices == 8 and report.mesh == {"fsdp": 8}
    forward = 2 * 64 * (32 * 64 + 64 * 4)
    assert report.flops_per_step == pytest.approx(forward * 3 - 2 * 64 * 32 * 64, rel=1e-6)
    kinds = {c.kind for c in report.collectives}
    assert {"all-gather", "all-reduce"} <= kinds or {"all-gather", "reduce-scatter"} <= kinds
    assert all(c.axes == ("fsdp",) and c.group_size == 8 for c in report.collectives)
    assert report.fusions > 0 and sum(report.ops_after.values()) > 0
    assert report.memory["peak"] > report.memory["arguments"] > 0
    assert model.steps_trained == 0  # compiled, nothing ran
    text = report.text()
    assert "collectives:" in text and "over fsdp" in text and "memory per device" in text


def test_the_cli_prints_the_report_as_json(tmp_path):
    out = podkit_cli("compile-report", str(SEED), "--cpu-devices", "4", "--json",
                     "--set", "strategy.kind=fsdp", "--set", "strategy.mesh={fsdp = -1}",
                     cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["devices"] == 4 and report["mesh"] == {"fsdp": 4}
    assert report["flops_per_step"] > 0 and report["memory"]["peak"] > 0
    assert {c["kind"] for c in report["collectives"]} & {"all-gather", "all-reduce"}
    assert not (tmp_path / "runs").exists()  # a report trains nothing


def test_the_cli_says_how_to_size_an_fsdp_mesh(tmp_path):
    # The seed config's mesh is { data = -1 }: switched to FSDP, that leaves fsdp no devices.
    out = podkit_cli("compile-report", str(SEED), "--cpu-devices", "4",
                     "--set", "strategy.kind=fsdp", cwd=tmp_path)
    assert out.returncode == 2
    assert "--set 'strategy.mesh={ fsdp = -1 }'" in out.stderr


def test_the_cli_names_a_missing_config(tmp_path):
    out = podkit_cli("compile-report", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert out.returncode == 2 and "nope.toml" in out.stderr
