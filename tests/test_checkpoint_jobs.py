"""Checkpoints across processes: other device and process counts, kills, preemption, the CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import helpers
from helpers import free_port
from podkit.checkpoint import CheckpointManager

JOB = Path(__file__).with_name("ckpt_job.py")


def start(out, ckpt, *opts, processes=1, devices=1):
    port = free_port()
    procs = []
    for pid in range(processes):
        env = {**os.environ, "PODKIT_CPU_DEVICES": str(devices)}
        if processes > 1:
            env.update(PODKIT_COORDINATOR=f"127.0.0.1:{port}",
                       PODKIT_NUM_PROCESSES=str(processes), PODKIT_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen([sys.executable, str(JOB), str(out), str(ckpt), *opts],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def finish(procs, expect=0, timeout=240):
    """The logs of a job's processes, once each exited `expect` (their pipes read at once)."""
    done = helpers.finish(*procs, timeout=timeout)
    for d in done:
        assert d.returncode == expect, d.stdout[-3000:]
    return [d.stdout for d in done]


def run(tmp_path, name, ckpt, *opts, expect=0, **kw):
    return ended(begun(tmp_path, name, ckpt, *opts, **kw), expect=expect)


def begun(tmp_path, name, ckpt, *opts, **kw):
    """A job started, for ended(): jobs that do not depend on each other run at once (they
    overlap on the cores: these processes wait and sleep much of the time)."""
    out = tmp_path / f"{name}.json"
    return out, start(out, ckpt, *opts, **kw)


def ended(job, expect=0):
    """(what process 0 wrote or None, the logs) of a begun() job, once it exited `expect`."""
    out, procs = job
    logs = finish(procs, expect=expect)  # first: process 0 writes as it ends
    return written(out), logs


def written(out):
    """What process 0 wrote, or None."""
    return json.loads(out.read_text()) if out.exists() else None


def ended_all(*jobs, expect=(0,)):
    """ended() of each job (expect: each one's exit status), every job's pipes read at once;
    every process killed if one fails."""
    try:
        done = iter(helpers.finish(*(p for _, procs in jobs for p in procs), timeout=240))
        out = []
        for (path, procs), e in zip(jobs, expect, strict=True):
            mine = [next(done) for _ in procs]
            for d in mine:
                assert d.returncode == e, d.stdout[-3000:]
            out.append((written(path), [d.stdout for d in mine]))
        return out
    finally:
        kill(*jobs)


def kill(*jobs):
    for p in (p for _, procs in jobs for p in procs if p.poll() is None):
        p.kill()


def after(losses, step):
    return [loss for s, loss in losses if s > step]


def test_save_on_8_devices_resume_on_4_and_on_1(tmp_path):
    (whole, _), _ = ended_all(begun(tmp_path, "whole", tmp_path / "whole", devices=8),
                              begun(tmp_path, "cut", tmp_path / "ck", "stop_at=20", devices=8),
                              expect=(0, 5))
    jobs = {}
    for devices in (4, 1):
        ck = tmp_path / f"ck{devices}"
        subprocess.run(["cp", "-r", str(tmp_path / "ck"), str(ck)], check=True)
        jobs[devices] = begun(tmp_path, f"on{devices}", ck, devices=devices)
    for devices, (resumed, logs) in zip(jobs, ended_all(*jobs.values(), expect=(0, 0)),
                                        strict=True):
        assert "resuming from checkpoint step 16" in logs[0]
        assert resumed["devices"] == devices and resumed["step"] == whole["step"]
        # the same batches in the same order after step 16: no sample repeated or skipped
        np.testing.assert_allclose(after(resumed["losses"], 16), after(whole["losses"], 16),
                                   rtol=1e-4)
        np.testing.assert_allclose(resumed["history"]["loss"], whole["history"]["loss"],
                                   rtol=1e-4)


def test_save_with_2_processes_resume_with_1(tmp_path):
    whole, _ = run(tmp_path, "whole", tmp_path / "whole", processes=2, devices=2)
    run(tmp_path, "cut", tmp_path / "ck", "stop_at=20", expect=5, processes=2, devices=2)
    files = {p.name for p in (tmp_path / "ck" / "step_0000000016").iterdir()}
    assert {"process_0.json", "process_1.json", "COMMIT.json", "meta.json"} <= files
    resumed, logs = run(tmp_path, "one", tmp_path / "ck", processes=1, devices=1)
    assert "resuming from checkpoint step 16" in logs[0]
    np.testing.assert_allclose(after(resumed["losses"], 16), after(whole["losses"], 16),
                               rtol=1e-4)


def _digest(ckpt):
    """What `podkit checkpoint digest` prints (tests/test_checkpoint.py checks the command
    prints this), computed here: no process to start, import JAX in and read the files."""
    return CheckpointManager(ckpt).digest()[1]


def test_sigkill_during_a_checkpoint_write_leaves_that_step_out(tmp_path):
    whole_job = begun(tmp_path, "whole", tmp_path / "whole")  # meanwhile
    ck = tmp_path / "ck"
    (proc,) = start(tmp_path / "cut.json", ck, "sleep=0.05", "every=4")
    victim = None
    deadline = time.monotonic() + 120
    try:
        while victim is None and time.monotonic() < deadline:
            for d in sorted(ck.glob("step_*")) if ck.exists() else []:
                step = int(d.name.removeprefix("step_"))
                if step >= 12 and (d / "state").exists() and not (d / "COMMIT.json").exists():
                    proc.send_signal(signal.SIGKILL)  # Orbax is writing this step right now
                    victim = step
                    break
            time.sleep(0.001)
    except BaseException:
        kill(whole_job)
        raise
    finally:
        proc.wait(timeout=60)
    (whole, _), = ended_all(whole_job)
    assert victim is not None, "never saw a step being written"
    ls = subprocess.run([sys.executable, "-m", "podkit.cli", "checkpoint", "ls", str(ck)],
                        capture_output=True, text=True, check=True).stdout
    assert f"{victim:>10}  incomplete" in ls, ls
    resumed, logs = run(tmp_path, "resumed", ck)
    assert f"resuming from checkpoint step {victim - 4}" in logs[0]
    assert resumed["params"] == whole["params"]  # bitwise: the same devices
    assert after(resumed["losses"], victim) == after(whole["losses"], victim)
    assert _digest(ck) == _digest(tmp_path / "whole")


def test_sigterm_writes_a_final_checkpoint_and_exits_0(tmp_path):
    whole_job = begun(tmp_path, "whole", tmp_path / "whole", "every=1000")  # meanwhile
    ck = tmp_path / "ck"
    logged = tmp_path / "steps.log"
    (proc,) = start(tmp_path / "cut.json", ck, "sleep=0.1", "every=1000", "stamp=1",
                    f"steps_log={logged}")
    try:
        lines = []
        for line in proc.stdout:  # training runs once the first step is stamped
            lines.append(line)
            if line.startswith("first-step"):
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out = "".join(lines) + proc.communicate(timeout=120)[0]
    except BaseException:
        kill(whole_job)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    (whole, _), = ended_all(whole_job)
    assert proc.returncode == 0, out[-3000:]
    assert "preempted at step" in out
    step = int(out.split("preempted at step ")[1].split(";")[0])
    assert 0 < step < whole["step"]
    # The executions in flight at the signal finished first: their windows are logged, up to
    # the checkpoint's step.
    assert [int(s) for s in logged.read_text().split()][-1] == step
    resumed, logs = run(tmp_path, "resumed", ck, "every=1000")
    assert f"resuming from checkpoint step {step}" in logs[0]
    assert resumed["params"] == whole["params"]
    assert _digest(ck) == _digest(tmp_path / "whole")


def test_sigkill_of_a_worker_under_launch_restarts_the_group_exactly(tmp_path):
    """Two processes under `podkit launch`; one is SIGKILLed at a random step after the first
    checkpoint. The group restarts from the newest checkpoint and ends where an uninterrupted
    run ends: the same digest."""
    whole_job = begun(tmp_path, "whole", tmp_path / "whole", "every=4", processes=2,
                      devices=1)  # meanwhile
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "podkit.cli", "launch", "--processes", "2",
           "--cpu-devices-per-process", "1", "--max-restarts", "2", "--backoff", "0.2",
           "--all-output",  # process 1's stdout: its first-step line
           "--events", str(tmp_path / "events.jsonl"), "--", sys.executable, str(JOB),
           str(tmp_path / "out.json"), str(ck), "every=4", "sleep=0.02", "stamp=1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rng = np.random.default_rng()
    lines = []
    killed = None
    try:
        for line in proc.stdout:
            lines.append(line)
            if killed is None and line.startswith("[1] first-step"):
                # after the first committed checkpoint, at a random moment
                deadline = time.monotonic() + 60
                while not any((d / "COMMIT.json").exists() for d in ck.glob("step_*")):
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 1.5))
                killed = int(line.split(" pid ")[1].split()[0])
                os.kill(killed, signal.SIGKILL)
        proc.wait(timeout=240)
    except BaseException:
        kill(whole_job)
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
    (whole, _), = ended_all(whole_job)
    out = "".join(lines)
    assert killed is not None and proc.returncode == 0, out[-3000:]
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "failure" in kinds and "restart" in kinds, kinds
    assert "resuming from checkpoint step" in out
    assert json.loads((tmp_path / "out.json").read_text())["params"] == whole["params"]
    assert _digest(ck) == _digest(tmp_path / "whole")
