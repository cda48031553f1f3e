"""Goodput across restarts (podkit.monitor.wall_time): a run's records account every second from
its first process's start to its last record as startup, the loop's parts, lost steps and the
time no process ran, and those add up to the wall time the test measured around real
processes, one of them SIGKILLed between checkpoints."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import helpers
from podkit import lifetime
from podkit.monitor import doctor, records, report, wall_time

ROOT = Path(__file__).resolve().parents[2]
LOOP = ("productive", "compile", "restore", "checkpoint", "input", "validation", "other")


def _split(**parts):
    return {f"time/{k}_s": parts.get(k, 0.0) for k in LOOP}


def _write(path, name, lines):
    (path / name).write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_killed_fit_resumed_from_its_checkpoint_adds_up_with_lost_and_down(tmp_path):
    # Process a: started at 100, its loop at 104 (restore 0.5 s); log points every 10 steps
    # 1 s apart; killed after it logged step 60 at 110. b resumed from the checkpoint at step
    # 45 and started at 115.
    a = [{"process": "a", "step": s, "time": 104.0 + s / 10, "loss": 1.0} for s in
         range(10, 70, 10)]
    a[1].update(_split(restore=0.5, compile=1.0, productive=0.4, other=0.1))  # step 20: 106
    a[3].update(_split(restore=0.5, compile=1.0, productive=2.2, other=0.3))  # step 40: 108
    kept, redone = [p for p in a if p["step"] <= 45], [p for p in a if p["step"] > 45]
    b = [dict(process="b", step=90, time=121.0, loss=1.0, **_split(
        restore=0.2, compile=0.5, productive=2.0, other=0.3))]
    fits = [{"process": "a", "event": "start", "started": 100.0, "loop": 104.0, "step": 0,
             "restore_s": 0.5, "time": 104.6},
            {"process": "b", "event": "start", "started": 115.0, "loop": 118.0, "step": 45,
             "restore_s": 0.2, "time": 118.3},
            {"process": "b", "event": "end", "step": 90, "time": 121.5,
             **_split(restore=0.2, compile=0.5, productive=2.3, other=0.5)}]
    _write(tmp_path, "metrics.jsonl", kept + b)
    _write(tmp_path, "redone.jsonl", redone)
    _write(tmp_path, "fits.jsonl", fits)
    run = records.load(tmp_path)
    wall = run.wall_time()
    assert wall.wall == pytest.approx(21.5)
    assert sum(wall.parts.values()) == pytest.approx(wall.wall, abs=1e-9)
    first, second = wall.fits
    assert first.parts["startup"] == pytest.approx(4.0)
    assert second.parts["startup"] == pytest.approx(3.0)
    # a reached step 45 at 108.5 (between its points at 40 and 50): 1.5 s to its last record
    assert first.lost_steps == 15 and first.parts["lost"] == pytest.approx(1.5)
    assert first.down_after == pytest.approx(5.0) and wall.parts["down"] == pytest.approx(5.0)
    # its split to 108.5: past its point at step 40 (108) the rest is "other"
    assert first.parts["productive"] == pytest.approx(2.2)
    assert first.parts["other"] == pytest.approx(0.3 + 0.5)
    assert second.parts["lost"] == 0 and second.parts["productive"] == pytest.approx(2.3)
    assert wall.parts["restore"] == pytest.approx(0.7)
    assert run.restarts() == 1 and run.goodput() == pytest.approx(4.5 / 21.5)
    titles = {f.title: f for f in doctor.diagnose(run)}
    assert "15 steps" in titles["restarts"].measured


def test_fits_of_one_process_are_idle_between_and_without_fits_the_gap_is_down(tmp_path):
    fits = [{"process": "a", "event": "start", "started": 0.0, "loop": 2.0, "step": 0,
             "time": 2.0},
            {"process": "a", "event": "end", "step": 10, "time": 5.0, **_split(productive=3.0)},
            {"process": "a", "event": "start", "started": 0.0, "loop": 9.0, "step": 10,
             "time": 9.0},
            {"process": "a", "event": "end", "step": 20, "time": 10.0,
             **_split(productive=1.0)}]
    _write(tmp_path, "metrics.jsonl", [])
    _write(tmp_path, "fits.jsonl", fits)
    wall = records.load(tmp_path).wall_time()
    assert wall.parts["idle"] == pytest.approx(4.0) and wall.parts["startup"] == 2.0
    assert wall.parts["down"] == 0 and wall.restarts == 0
    assert sum(wall.parts.values()) == pytest.approx(10.0)
    assert wall_time.breakdown([], []) is None


def test_the_process_start_is_the_kernels(tmp_path):
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; from podkit import lifetime; "
                          "s, w = lifetime.process_start(); print(s, w, lifetime.IMPORTED)"],
                         capture_output=True, text=True, check=True).stdout.split()
    started, source, imported = float(out[0]), out[1], float(out[2])
    assert source == "/proc/self/stat"
    # The kernel's start is a clock tick (10 ms) at most before the test started it, and
    # before podkit's import (the interpreter started first).
    assert t0 - 0.011 <= started <= imported
    assert lifetime.process_start()[0] <= lifetime.IMPORTED


def _train(run_dir, epochs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    env.update(helpers.fast_xla_env())
    cmd = [sys.executable, "-m", "podkit.cli", "train", str(ROOT / "configs/seed_mlp.toml"),
           "--set", f"run.dir={run_dir}", "--set", "train.verbose=0",
           "--set", f"train.epochs={epochs}", "--set", "checkpoint.every_steps=450",
           # committed before the next step: the kill lands well before the next checkpoint
           "--set", "checkpoint.async_save=false", "--set", "run.compile_cache=none"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def _points(path):
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # being written
                pass
    return out


def _steps(records_):
    return [r for r in records_ if "loss" in r]  # log points, not validations


def test_a_run_sigkilled_between_checkpoints_accounts_its_wall_time(tmp_path):
    """seed_mlp, a checkpoint every 450 steps (10 epochs); SIGKILLed once the checkpoint at
    450 is committed and two more log points are written, then run again to finish."""
    run = tmp_path / "seed_mlp"
    t0 = time.time()
    proc = _train(tmp_path, 40)
    deadline = time.monotonic() + 240
    commit = run / "checkpoints" / "step_0000000450" / "COMMIT.json"
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if commit.exists() and any(p["step"] >= 468 for p in _steps(_points(
                    run / "metrics.jsonl"))):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == -signal.SIGKILL, out[-3000:]
    killed = _points(run / "metrics.jsonl")  # what the killed process logged
    resumed = _train(tmp_path, 12)
    out = resumed.communicate(timeout=240)[0]
    t1 = time.time()
    assert resumed.returncode == 0, out[-3000:]
    assert "resuming from checkpoint step 450" in out, out[-3000:]

    records_ = records.load(run)
    wall = records_.wall_time()
    first, second = wall.fits
    assert [f.first_step for f in wall.fits] == [0, 450] and second.last_step == 540
    # Every second from the first process's start to the last record, and that span is the
    # test's own measure less what came before the first process started (under 0.5 s) and
    # the last process's exit after its last record (under 5 s on a loaded machine).
    assert sum(wall.parts.values()) == pytest.approx(wall.wall, abs=1e-6)
    assert t0 - 0.011 <= wall.start <= t0 + 0.5
    assert t1 - 5.0 <= wall.end <= t1
    # Lost: from the moment the killed process logged step 450 to its last record (a log
    # point or a validation), the steps it logged past 450.
    last_step = max(p["step"] for p in _steps(killed))
    last_time = max(p["time"] for p in killed)
    at_450 = next(p for p in _steps(killed) if p["step"] == 450)
    assert first.lost_steps == last_step - 450 > 0
    assert first.parts["lost"] == pytest.approx(last_time - at_450["time"], abs=1e-6)
    assert first.parts["lost"] > 0
    assert first.down_after == pytest.approx(second.started - last_time, abs=1e-6)
    assert first.down_after > 0
    # Each process's startup and restore, and the loop's parts
    for fit in wall.fits:
        assert fit.parts["startup"] > 0.2  # the interpreter, jax, the data, the model
    starts = [f for f in records_.fits if f["event"] == "start"]
    assert [f["step"] for f in starts] == [0, 450]
    assert all(f["started_from"] == "/proc/self/stat" for f in starts)
    assert second.parts["restore"] >= starts[1]["restore_s"] > 0  # read a checkpoint
    assert starts[0]["restore_s"] < starts[1]["restore_s"]  # found none
    assert second.ended and not first.ended
    assert all(wall.parts[k] > 0 for k in ("productive", "compile", "validation"))
    # The killed steps are in redone.jsonl, and metrics.jsonl has each step once
    steps = [p["step"] for p in records_.points]
    assert len(steps) == len(set(steps)) and max(steps) == 540
    assert {p["step"] for p in records_.redone} == {p["step"] for p in killed
                                                    if p["step"] > 450}
    assert last_step < 900  # killed before its next checkpoint
    html = report.render(records_)
    assert "Goodput across restarts" in html and "lost" in html
    # TensorBoard: the resumed process's account of the run so far has the killed one's
    # lost steps and the down time before it started
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    final = {k: acc.Scalars(f"goodput_run/{k}_s")[-1].value for k in ("lost", "down")}
    assert final["lost"] == pytest.approx(first.parts["lost"], rel=1e-5)
    assert final["down"] == pytest.approx(first.down_after, rel=1e-5)
