"""The two checkpoint tiers with real processes (2 processes, gloo collectives on CPU).

The parameters are sharded over the processes (FSDP), so each process's local part holds other
shards, and a part restored from the wrong process would not be bit-identical."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers
from helpers import free_port
from test_checkpoint_jobs import ended_all, kill, written

JOB = Path(__file__).with_name("ckpt_job.py")


def begun(tmp_path, name, ckpt, local, *opts, processes=2):
    """ckpt_job.py with a local tier every 4 steps in `local`, persistent every 12."""
    port = free_port()
    out = tmp_path / f"{name}.json"
    procs = []
    for pid in range(processes):
        env = {**os.environ, **helpers.fast_xla_env(), "PODKIT_CPU_DEVICES": "1"}
        if processes > 1:
            env.update(PODKIT_COORDINATOR=f"127.0.0.1:{port}",
                       PODKIT_NUM_PROCESSES=str(processes), PODKIT_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen(
            [sys.executable, str(JOB), str(out), str(ckpt), "every=12", "local=4",
             f"local_dir={local}", "fsdp=1", *opts],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return out, procs


def _copy(tmp_path, name):
    for d in ("ck", "local"):
        shutil.copytree(tmp_path / d, tmp_path / f"{d}_{name}")
    return tmp_path / f"ck_{name}", tmp_path / f"local_{name}"


def test_a_killed_process_without_its_local_tier_resumes_from_its_peers_copy(tmp_path):
    """Process 1 is SIGKILLed after local step 20 (persistent: step 12) and its local tier
    deleted: the job resumes at step 20 with process 1's shards from process 0's copy, and
    ends bit-identical to an uninterrupted run. From the same wreck: a damaged step 20 gives
    step 16; one process instead of two takes the persistent step 12, saying why."""
    whole_job = begun(tmp_path, "whole", tmp_path / "whole", tmp_path / "local_whole")
    _, (p0, p1) = begun(tmp_path, "cut", tmp_path / "ck", tmp_path / "local", "kill_at=20")
    try:
        p1.wait(timeout=240)
        assert p1.returncode == -signal.SIGKILL, p1.stdout.read()[-3000:]
        # process 0 wrote its own part of step 20 and its copy of process 1's, then waits in
        # the next step's collective for a peer that is gone
        step20 = tmp_path / "local" / "process_0" / "step_0000000020"
        deadline = time.monotonic() + 60
        while not all((step20 / f"part_{p}" / "COMMIT.json").exists() for p in (0, 1)):
            assert time.monotonic() < deadline and p0.poll() is None
            time.sleep(0.01)
        p0.kill()
        p0.wait(timeout=60)
    except BaseException:
        kill(whole_job, (None, [p0, p1]))
        raise
    assert sorted(int(d.name[5:]) for d in (tmp_path / "ck").glob("step_*")) == [12]
    assert sorted(d.name for d in (tmp_path / "local" / "process_1").iterdir()) == \
        ["step_0000000016", "step_0000000020"]

    ck_b, local_b = _copy(tmp_path, "b")  # step 20 damaged on both processes
    own = local_b / "process_0" / "step_0000000020" / "part_0" / "shards.bin"
    blob = bytearray(own.read_bytes())
    blob[len(blob) // 2] ^= 0x10
    own.write_bytes(bytes(blob))
    (local_b / "process_1" / "step_0000000020" / "part_0" / "COMMIT.json").unlink()
    ck_c, local_c = _copy(tmp_path, "c")  # one process
    shutil.rmtree(tmp_path / "local" / "process_1")  # its disk is gone

    (whole, _), (lost, lost_logs), (damaged, damaged_logs), (one, one_logs) = ended_all(
        whole_job, begun(tmp_path, "lost", tmp_path / "ck", tmp_path / "local"),
        begun(tmp_path, "damaged", ck_b, local_b),
        begun(tmp_path, "one", ck_c, local_c, processes=1), expect=(0, 0, 0, 0))

    said = lost_logs[0]
    assert ("podkit: restoring step 20 from the local tier (the persistent tier's newest is "
            "step 12; process 1's shards from process 0's copy)") in said, said[-3000:]
    assert "resuming from checkpoint step 20" in said
    assert lost["params"] == whole["params"]  # bit for bit
    assert lost["step"] == whole["step"]
    assert (tmp_path / "local" / "process_1").is_dir()  # saving again after the resume

    said = damaged_logs[0]
    assert "podkit: restoring step 16 from the local tier" in said, said[-3000:]
    assert "local step 20 is not usable: process 0's shards:" in said
    assert "does not match its size or checksum" in said and "incomplete" in said
    assert damaged["params"] == whole["params"]

    said = one_logs[0]
    assert "restoring from the persistent tier" in said, said[-3000:]
    assert "local step 20 is not usable: process 0's shards: written by 2 processes, this " \
        "job has 1" in said
    assert "resuming from checkpoint step 12" in said
    assert (one["processes"], one["step"]) == (1, whole["step"])


def test_a_newer_persistent_step_wins_over_the_local_tier(tmp_path):
    """Local saves every 8 steps (8, 16; 27 is a persistent one), persistent every 12 (12, 27:
    an epoch is 23 steps, executions of 4), stopped at 31: the restart takes the persistent
    step 27 and says the local one is older."""
    (cut, _), = ended_all(begun(tmp_path, "cut", tmp_path / "ck", tmp_path / "local",
                                "local=8", "stop_at=28"), expect=(5,))
    assert cut is None
    (_, logs), = ended_all(begun(tmp_path, "again", tmp_path / "ck", tmp_path / "local",
                                 "local=8", "stop_at=32"), expect=(5,))
    said = logs[0]
    assert "restoring from the persistent tier" in said, said[-3000:]
    assert "the persistent tier's step 27 is newer than the local tier's step 16" in said
    assert "resuming from checkpoint step 27" in said
    assert written(tmp_path / "again.json") is None
