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


def sigterm(proc, out, *, ready="ready", processes=1, settle=0.0, timeout=30,
            status=termination.EXIT_CODE, within=None):
    """Wait for one line starting with `ready` per process and `settle` seconds more, send
    `proc` SIGTERM and wait (up to `timeout`) for it to exit; assert its exit status and,
    with within=(low, high), low <= the seconds from the signal to the exit < high. Returns
    all of its output. The process is killed whatever happens."""
    try:
        for _ in range(processes):
            out.until(ready)
        if settle:
            time.sleep(settle)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        text = out.finish(timeout=timeout)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == status, text[-3000:]
    if within is not None:
        low, high = within
        assert low <= took < high, (took, text[-3000:])
    return text


def test_sigterm_after_fit_ends_a_single_process_with_143(tmp_path):
    text = sigterm(*start([sys.executable, str(JOB), "after_fit", str(tmp_path)]),
                   within=(0, 5))
    assert "podkit: SIGTERM received outside training: exiting with status 143" in text
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
    text = sigterm(*start([*LAUNCH, "--processes", "2", "--cpu-devices-per-process", "1",
                           "--grace", "60", "--events", str(events),
                           "--all-output", "--",  # both processes' ready lines
                           sys.executable, str(JOB), "after_fit", str(tmp_path)]),
                   processes=2, timeout=60, status=0,
                   within=(0, 5))  # not the 60 s grace, nor the 10 s exit deadline
    assert text.count("SIGTERM received outside training: exiting with status 143") == 2, text
    assert "preempted; all 2 processes exited 143" in text
    ev = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in ev] == ["start", "preempt", "exit"]


def test_a_process_blocked_in_native_code_still_ends_on_sigterm(tmp_path):
    """The main thread runs an XLA program that never ends, so Python's handler cannot run;
    the watcher thread ends the process after the grace, with every thread's stack."""
    text = sigterm(*start([sys.executable, str(JOB), "blocked", str(tmp_path)],
                          PODKIT_EXIT_GRACE_S="2"),
                   settle=1.0,  # inside the endless program by then
                   within=(2.0, 8))
    assert "did not exit within 2 s of SIGTERM" in text
    assert "term_job.py" in text  # the stuck main thread's stack


def test_a_bad_exit_grace_is_an_error(monkeypatch):
    monkeypatch.setenv(termination.ENV_EXIT_GRACE, "soon")
    with pytest.raises(ConfigError, match="PODKIT_EXIT_GRACE_S='soon' is not a number"):
        termination.install()


def _ckpt_job(tmp_path, name, ckpt, *opts):
    out = tmp_path / f"{name}.json"
    return out, *start([*LAUNCH, "--processes", "2", "--cpu-devices-per-process", "1",
                        "--max-restarts", "0", "--all-output",  # both processes' lines
                        "--", sys.executable, str(CKPT_JOB), str(out),
                        str(ckpt), *opts])


def _digest(ckpt):
    """What `podkit checkpoint digest` prints (tests/test_checkpoint.py checks the command
    prints this), computed here: no process to start, import JAX in and read the files."""
    from podkit.checkpoint import CheckpointManager

    return CheckpointManager(ckpt).digest()[1]


def test_sigterm_inside_fit_on_two_processes_saves_one_step_and_resumes_exactly(tmp_path):
    """The preemption agreement across processes: both save at the same step, exit 0, and the
    resumed job ends where an uninterrupted one ends (the same digest)."""
    # The uninterrupted job runs meanwhile: they overlap on the cores.
    whole_out, whole, whole_lines = _ckpt_job(tmp_path, "whole", tmp_path / "whole",
                                              "every=1000")
    try:
        _, cut, out = _ckpt_job(tmp_path, "cut", tmp_path / "ck", "every=1000", "sleep=0.05",
                                "stamp=1")
        text = sigterm(cut, out, ready="first-step", processes=2,
                       settle=np.random.default_rng().uniform(0.2, 1.5), timeout=120, status=0)
        whole_text = whole_lines.finish(timeout=240)
    finally:
        whole.kill()
    assert whole.returncode == 0, whole_text[-3000:]
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
