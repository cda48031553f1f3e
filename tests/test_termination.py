"""SIGTERM in podkit processes, with real processes and signals: outside fit() it ends the
process (status 143) on one process and on several, even when the main thread is stuck in
native code; inside fit() with checkpoints every process saves at the same step and exits 0,
and the run resumes from there exactly."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import Lines
from podkit import termination
from podkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "launch_scripts" / "term_job.py"
CKPT_JOB = ROOT / "tests" / "ckpt_job.py"
LAUNCH = [sys.executable, "-m", "podkit.launch.cli"]


def start(cmd, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    proc = subprocess.Popen(cmd, env={**clean, "PODKIT_CPU_DEVICES": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, Lines(proc)


def test_sigterm_after_fit_ends_a_single_process_with_143(tmp_path):
    proc, out = start([sys.executable, str(JOB), "after_fit", str(tmp_path)])
    try:
        out.until("ready")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        text = out.finish(timeout=30)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == termination.EXIT_CODE, text[-3000:]
    assert "podkit: SIGTERM received outside training: exiting with status 143" in text
    assert took < 5, took
    assert (tmp_path / "run" / "final.json").exists()  # fit's work was done and kept


def test_sigterm_delivered_to_another_thread_still_wakes_the_sleeping_main_thread(tmp_path):
    """The kernel may hand a process's SIGTERM to any thread; Python runs the handler only in
    the main thread, and a main thread asleep in a system call would not notice it before the
    exit deadline (10 s, here 30). The watcher sends it on to the main thread."""
    proc, out = start([sys.executable, str(JOB), "thread", str(tmp_path)],
                      PODKIT_EXIT_GRACE_S="30")
    try:
        sent = float(out.until("sent").split()[1])
        text = out.finish(timeout=60)
        took = time.time() - sent
    finally:
        proc.kill()
    assert proc.returncode == termination.EXIT_CODE, text[-3000:]
    assert "did not exit within" not in text, text[-3000:]  # not the deadline
    assert took < 5, (took, text[-3000:])


def test_sigterm_after_fit_ends_every_process_of_a_launched_job(tmp_path):
    """Two processes joined through the coordination service (where JAX's own preemption
    notifier used to swallow SIGTERM): the launcher forwards SIGTERM, both exit 143 at once,
    and the launcher counts that as a clean stop."""
    events = tmp_path / "events.jsonl"
    proc, out = start([*LAUNCH, "--processes", "2", "--cpu-devices-per-process", "1",
                       "--grace", "60", "--events", str(events), "--",
                       sys.executable, str(JOB), "after_fit", str(tmp_path)])
    try:
        out.until("ready")
        out.until("ready")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        text = out.finish(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 0, text[-3000:]
    assert text.count("SIGTERM received outside training: exiting with status 143") == 2, text
    assert "preempted; all 2 processes exited 143" in text
    assert took < 5, (took, text[-3000:])  # not the 60 s grace, nor the 10 s exit deadline
    ev = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in ev] == ["start", "preempt", "exit"]


def test_a_process_blocked_in_native_code_still_ends_on_sigterm(tmp_path):
    """The main thread runs an XLA program that never ends, so Python's handler cannot run;
    the watcher thread ends the process after the grace, with every thread's stack."""
    proc, out = start([sys.executable, str(JOB), "blocked", str(tmp_path)],
                      PODKIT_EXIT_GRACE_S="2")
    try:
        out.until("ready")
        time.sleep(1.0)  # inside the endless program by now
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        text = out.finish(timeout=30)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == termination.EXIT_CODE, text[-3000:]
    assert 2.0 <= took < 8, took
    assert "did not exit within 2 s of SIGTERM" in text
    assert "term_job.py" in text  # the stuck main thread's stack


def test_a_bad_exit_grace_is_an_error(monkeypatch):
    monkeypatch.setenv(termination.ENV_EXIT_GRACE, "soon")
    with pytest.raises(ConfigError, match="PODKIT_EXIT_GRACE_S='soon' is not a number"):
        termination.install()


def _ckpt_job(tmp_path, name, ckpt, *opts):
    out = tmp_path / f"{name}.json"
    return out, *start([*LAUNCH, "--processes", "2", "--cpu-devices-per-process", "1",
                        "--max-restarts", "0", "--", sys.executable, str(CKPT_JOB), str(out),
                        str(ckpt), *opts])


def _digest(ckpt):
    out = subprocess.run([sys.executable, "-m", "podkit.cli", "checkpoint", "digest", str(ckpt)],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def test_sigterm_inside_fit_on_two_processes_saves_one_step_and_resumes_exactly(tmp_path):
    """The preemption agreement across processes: both save at the same step, exit 0, and the
    resumed job ends where an uninterrupted one ends (the same digest)."""
    whole_out, whole, out = _ckpt_job(tmp_path, "whole", tmp_path / "whole", "every=1000")
    text = out.finish(timeout=240)
    assert whole.returncode == 0, text[-3000:]
    _, cut, out = _ckpt_job(tmp_path, "cut", tmp_path / "ck", "every=1000", "sleep=0.05",
                            "stamp=1")
    try:
        out.until("first-step")
        out.until("first-step")
        time.sleep(np.random.default_rng().uniform(0.2, 1.5))
        cut.send_signal(signal.SIGTERM)
        text = out.finish(timeout=120)
    finally:
        cut.kill()
    assert cut.returncode == 0, text[-3000:]
    assert text.count("SIGTERM received during training") == 2, text[-3000:]
    assert "preempted at step" in text and "preempted; all 2 processes exited 0" in text
    step = int(text.split("preempted at step ")[1].split(";")[0])
    assert 0 < step < json.loads(whole_out.read_text())["step"]
    assert sorted(p.name for p in (tmp_path / "ck").glob("step_*")) == [f"step_{step:010d}"]
    _, resumed, out = _ckpt_job(tmp_path, "resumed", tmp_path / "ck", "every=1000")
    text = out.finish(timeout=240)
    assert resumed.returncode == 0, text[-3000:]
    assert f"resuming from checkpoint step {step}" in text
    assert _digest(tmp_path / "ck") == _digest(tmp_path / "whole")


def test_sigterm_to_one_process_before_the_first_step_stops_every_process_at_the_first(
        tmp_path):
    """Process 1 alone gets SIGTERM, before any step has run: the other learns it through
    the coordination service, and both save after the first execution and exit 0."""
    _, job, out = _ckpt_job(tmp_path, "cut", tmp_path / "ck", "every=1000", "term_at_begin=1")
    text = out.finish(timeout=120)
    assert job.returncode == 0, text[-3000:]
    assert text.count("SIGTERM received during training") == 1, text[-3000:]
    assert "[0] podkit: preempted at step 4;" in text  # one execution of 4 steps
    assert [p.name for p in (tmp_path / "ck").glob("step_*")] == ["step_0000000004"]
