"""A run directory's records read back (podkit.monitor.records): fits that continue one run
(a resume, a `podkit launch` restart) add up, and the time between them is the restart's."""

import json

import pytest

from podkit.errors import ConfigError
from podkit.monitor import doctor, records

PARTS = ("productive", "compile", "checkpoint", "input", "validation", "other")


def _point(step, time, **parts):
    return {"step": step, "loss": 1.0, "samples_per_s": 10.0, "time": time, "goodput": 0.5,
            **{f"time/{k}_s": parts.get(k, 0.0) for k in PARTS}}


def test_two_fits_of_one_run_add_up_and_the_gap_is_the_restart(tmp_path):
    lines = [
        _point(10, 1000.0, productive=5.0, compile=3.0, other=2.0),   # fit 1: 10 s in all
        {"step": 15, "loss": 1.0, "samples_per_s": 10.0, "time": 1003.0},  # no telemetry
        _point(20, 1005.0, productive=9.0, compile=3.0, other=3.0),   # ... 15 s, ends at 1005
        # fit 2 (a restart from step 10) starts counting again: its first point at 1030
        # has 8 s of its own, so 1030 - 8 - 1005 = 17 s went to the restart.
        _point(15, 1030.0, productive=4.0, compile=3.0, other=1.0),
        _point(30, 1040.0, productive=12.0, compile=3.0, other=3.0),
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(p) for p in lines) + "\n")
    run = records.load(tmp_path)
    assert [len(s) for s in run.segments()] == [3, 2]  # the untimed point continues fit 1
    split = run.time_split()
    assert split["productive"] == pytest.approx(21.0)
    assert split["compile"] == pytest.approx(6.0)
    assert split["down"] == pytest.approx(17.0)  # no fits.jsonl: the gap is all "down"
    assert run.goodput() == pytest.approx(21.0 / (15 + 18 + 17))
    titles = [f.title for f in doctor.diagnose(run)]
    assert "restarts" in titles


def test_a_directory_without_metrics_is_named(tmp_path):
    with pytest.raises(ConfigError, match="holds no metrics.jsonl"):
        records.load(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("{not json\n" + json.dumps(_point(5, 1.0)) + "\n")
    with pytest.raises(ConfigError, match="metrics.jsonl:1 is not JSON"):
        records.load(tmp_path)


def test_a_last_line_cut_short_by_a_killed_process_is_left_out(tmp_path):
    text = json.dumps(_point(10, 1000.0, productive=5.0)) + '\n{"step": 15, "loss": 0.1'
    (tmp_path / "metrics.jsonl").write_text(text)
    assert [p["step"] for p in records.load(tmp_path).points] == [10]


def test_fits_called_again_by_one_process_are_no_restarts(tmp_path):
    lines = [dict(_point(10, 1000.0, productive=5.0, other=5.0), process="a"),
             dict(_point(10, 1100.0, productive=5.0, other=5.0), process="a"),  # notebook
             dict(_point(10, 1200.0, productive=5.0, other=5.0), process="b")]  # new process
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(p) for p in lines) + "\n")
    run = records.load(tmp_path)
    assert run.restarts() == 1
    assert run.time_split()["down"] == pytest.approx(90.0)  # 1200 - 10 - 1100


def test_doctor_lists_every_recompile_it_counts_and_input_needs_device_idle(tmp_path):
    lines = [dict(_point(10, 1000.0, productive=9.0, input=0.1, other=0.9), input_wait=0.3)]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[0]) + "\n")
    (tmp_path / "recompiles.json").write_text(json.dumps(
        [{"kind": "predict", "context": f"predict() call {i}", "changes": ["x"]}
         for i in range(2, 6)]))
    findings = {f.title: f for f in doctor.diagnose(records.load(tmp_path))}
    assert "input-bound" not in findings  # the loop waited, the devices did not
    assert "4 recompile(s)" in findings["recompiles"].measured
    assert "and 1 more" in findings["recompiles"].measured
