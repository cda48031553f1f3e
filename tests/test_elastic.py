"""Elastic resume: a slot that keeps failing is dropped and `podkit train` goes on with fewer
processes, the same global batch (more microbatches), the exact data position and the same
learning-rate schedule; the full count comes back once the slot does (podkit.elastic,
podkit.launch.supervisor)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fast_xla_env, finish, start_cli
from podkit import elastic
from podkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "configs" / "seed_mlp.toml"
WRAPPER = Path(__file__).with_name("launch_scripts") / "elastic_train.py"


@pytest.mark.parametrize("batch,micro,dp,n,full,chosen", [
    (16, 1, 4, 2, 2, 1),  # the full count: the config's own
    (16, 1, 2, 1, 2, 2),  # 4 devices -> 2: 4 per device as before with 2 microbatches
    (16, 2, 2, 1, 2, 4),  # 2 per device as before: 4 microbatches
    (24, 1, 2, 2, 3, 2),  # 3 devices -> 2: 8 per device; 2 microbatches give 6
    (12, 1, 4, 4, 6, 3),  # 6 devices -> 4: 2 per device; 12 is not 2 x 4 parts, 3 x 4 is
    (30, 1, 5, 5, 10, 2),
    (16, 1, 8, 4, 4, 1),  # more processes than the config's count: nothing changes
])
def test_plan_keeps_each_devices_part(batch, micro, dp, n, full, chosen):
    plan = elastic.plan(batch, micro, dp, n, full)
    assert plan.chosen == chosen
    assert batch % (plan.chosen * dp) == 0
    assert plan.part <= plan.full_part
    assert (plan.note() is None) == (n >= full)


def test_plan_refuses_a_batch_that_does_not_divide():
    with pytest.raises(ConfigError, match="data.batch_size = 8 does not divide over it"):
        elastic.plan(8, 1, 3, 3, 4)


def test_full_processes_reads_the_launchers_count(monkeypatch):
    monkeypatch.delenv(elastic.ENV_MAX_PROCESSES, raising=False)
    assert elastic.full_processes(3) == 3
    monkeypatch.setenv(elastic.ENV_MAX_PROCESSES, "4")
    assert elastic.full_processes(3) == 4


def _points(run):
    """Each logged step's loss, from metrics.jsonl (what a resume left there)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            assert r["step"] not in out, f"step {r['step']} logged twice"
            out[r["step"]] = r["loss"]
    return out


SETS = ["train.steps=40", "train.steps_per_execution=1", "train.log_every=1",
        "train.warmup_steps=4", "train.schedule=cosine", "train.verbose=0",
        "data.batch_size=16", "checkpoint.every_steps=8", "checkpoint.keep=20",
        "run.name=elastic"]


def _sets(run_dir, *more):
    out = []
    for s in [*SETS, f"run.dir={run_dir}", *more]:
        out += ["--set", s]
    return out


def test_a_failing_process_is_dropped_and_comes_back(tmp_path):
    """2 processes x 2 CPU devices train; slot 1 dies after the checkpoint of step 8, then
    exits at every start while a file says so (--max-restarts 1: its second failure drops
    it). One process resumes from step 8 with 2 microbatches (the global batch 16, 4 examples
    per device as before); it removes the file, and after --grow-after seconds of training
    the launcher stops it with a checkpoint and both processes go on from there to step 40.

    Against one process resumed from the same checkpoint with 2 microbatches from the start:
    the shrunk stretch is bit-identical (the same program on the same devices from the same
    state and data position); after the grow-back the two sum gradients over other devices in
    another order, so those steps agree to 1e-5 (a skipped or repeated batch is 1e-2)."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    (ctl / "broken").write_text("")
    runs_dir = tmp_path / "runs"
    run = runs_dir / "elastic"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")},
           **fast_xla_env()}
    cmd = [sys.executable, "-m", "podkit.launch.cli", "--processes", "2",
           "--cpu-devices-per-process", "2", "--min-processes", "1", "--max-restarts", "1",
           "--grow-after", "3", "--backoff", "0.05", "--stop-timeout", "1",
           "--events", str(tmp_path / "events.jsonl"), "--",
           sys.executable, str(WRAPPER), str(ctl), str(run / "checkpoints"), "--",
           "train", str(SEED), *_sets(runs_dir)]
    launched = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=400)
    assert launched.returncode == 0, (launched.stdout[-3000:], launched.stderr[-4000:])
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["processes"] for e in events if e["event"] == "start"] == [2, 2, 1, 2]
    out = launched.stdout
    assert ("podkit: elastic: 1 of 2 processes (data-parallel size 2, 4 at the full count): "
            "the global batch 16 stays, train.microbatches 1 -> 2, so that each device takes "
            "4 examples at a time (4 at the full count)") in out
    assert "[0] podkit: resuming from checkpoint step 8 (epoch 1, 8 steps into it)" in out
    assert "train.microbatches: 1 -> 2 (applied from step 8)" in out
    assert "learning rate:" not in out  # the schedule is the run's: no change to report
    grown = [line for line in out.splitlines() if "microbatches: 2 -> 1 (applied from step" in line]
    assert len(grown) == 1, out[-3000:]
    back = int(grown[0].rsplit("step ", 1)[1].rstrip(")"))
    assert 8 < back < 40
    points = _points(run)
    assert sorted(points) == list(range(1, 41))  # every step once: none skipped or repeated
    fits = [json.loads(line) for line in (run / "fits.jsonl").read_text().splitlines()]
    starts = [f for f in fits if f["event"] == "start"]
    assert [(f["step"], f["processes"]) for f in starts] == [(0, 2), (8, 1), (back, 2)]
    assert starts[1]["elastic"]["chosen"] == 2 and "elastic" not in starts[2]

    # The reference: one process from the checkpoint of step 8, 2 microbatches throughout.
    ref_runs = tmp_path / "ref"
    ref = ref_runs / "elastic"
    (ref / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / "step_0000000008",
                    ref / "checkpoints" / "step_0000000008")
    shutil.copy(run / "data_info.json", ref / "data_info.json")
    one, = finish(start_cli("train", str(SEED), "--cpu-devices", "2",
                            *_sets(ref_runs, "train.microbatches=2"), cwd=tmp_path,
                            **fast_xla_env()))
    assert one.returncode == 0, one.stderr[-3000:]
    expected = _points(ref)
    assert sorted(expected) == list(range(9, 41))
    for step in range(9, back + 1):
        assert points[step] == expected[step], (step, points[step], expected[step])
    for step in range(back + 1, 41):
        assert points[step] == pytest.approx(expected[step], rel=1e-5), step

    report, = finish(start_cli("report", str(run), cwd=tmp_path))
    assert report.returncode == 0, report.stderr
    assert "processes per start 2 -> 1 -> 2" in report.stdout
    html = (run / "report.html").read_text()
    assert "elastic starts" in html and "train.microbatches 1 -&gt; 2" in html
