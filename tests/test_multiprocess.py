"""A real multi-process job: 2 processes x 2 CPU devices joined through connect() (gloo)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import helpers
import podkit as pk
from helpers import free_port

WORKER = Path(__file__).with_name("mp_worker.py")


def start_job(out, processes: int, devices: int, spe: int, *args: str) -> list:
    port = free_port()
    procs = []
    for pid in range(processes):
        env = {**os.environ, "PODKIT_CPU_DEVICES": str(devices)}
        if processes > 1:
            env.update(PODKIT_COORDINATOR=f"127.0.0.1:{port}",
                       PODKIT_NUM_PROCESSES=str(processes), PODKIT_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), str(out), str(spe), *args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    return procs


def finish(procs, timeout: float = 300) -> list[str]:
    """The logs of a job's processes once they exited (their pipes read at once)."""
    return [d.stdout for d in helpers.finish(*procs, timeout=timeout)]


def run_job(tmp_path, processes: int, devices: int, spe: int, *args: str) -> dict:
    return run_jobs(tmp_path, dict(processes=processes, devices=devices, spe=spe, args=args))[0]


def run_jobs(tmp_path, *jobs: dict) -> list[dict]:
    """What process 0 of each job wrote (jobs: run_job's arguments by name), the jobs run at
    once; each process must exit 0."""
    outs, started = [], []
    try:
        for job in jobs:
            mode = "_".join(job.get("args", ())) or "arrays"
            outs.append(tmp_path / f"job_{job['processes']}x{job['devices']}_{mode}.json")
            started.append(start_job(outs[-1], job["processes"], job["devices"], job["spe"],
                                     *job.get("args", ())))
        every = iter(finish([p for procs in started for p in procs]))  # pipes read at once
        logs = [[next(every) for _ in procs] for procs in started]
    finally:
        for p in (p for procs in started for p in procs if p.poll() is None):
            p.kill()
    for procs, job_logs in zip(started, logs, strict=True):
        for p, log in zip(procs, job_logs, strict=True):
            assert p.returncode == 0, log[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def test_two_processes_agree_with_one_process(tmp_path, digits):
    # Both jobs at once: they overlap on the cores.
    multi, single = run_jobs(tmp_path, dict(processes=2, devices=2, spe=3),
                             dict(processes=1, devices=1, spe=3))
    assert multi["processes"] == 2 and multi["devices"] == 4
    assert single["devices"] == 1
    assert len(multi["losses"]) == len(single["losses"]) > 10
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(multi["kernel0"], single["kernel0"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(multi["pred"], single["pred"], rtol=1e-4, atol=1e-6)
    assert pk  # the package imports beside the workers


def test_microbatches_over_two_processes_are_the_whole_batch(tmp_path):
    """A masked loss over microbatches of uneven token counts on 2 processes x 2 devices:
    k = 4 gives k = 1's loss and weights, and both are the one-process job's."""
    multi, single = run_jobs(tmp_path, dict(processes=2, devices=2, spe=1,
                                            args=("microbatches",)),
                             dict(processes=1, devices=4, spe=1, args=("microbatches",)))
    assert (multi["processes"], single["processes"]) == (2, 1)
    for job in (multi, single):
        whole, parts = job["steps"]["1"], job["steps"]["4"]
        np.testing.assert_allclose(parts["loss"], whole["loss"], rtol=1e-5)
        for a, b in zip(parts["weights"], whole["weights"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(multi["steps"]["4"]["weights"], single["steps"]["4"]["weights"],
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_two_processes_write_a_run_directory_in_a_bucket(tmp_path, s3, monkeypatch):
    """fit(run_dir=URL) on 2 processes: every process logs, process 0 writes and pushes;
    the others only keep their machine's copy's path (heartbeats, stacks)."""
    import uuid

    from podkit import paths
    from storage_servers import BUCKET

    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "cache"))
    url = f"s3://{BUCKET}/mp-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TEST_RUN_DIR", url)
    multi = run_job(tmp_path, 2, 2, 3, "run_dir")
    with paths.open(paths.join(url, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f.read().splitlines()]
    assert steps == sorted(steps) and len(steps) == len(multi["losses"]) > 10
    assert {"run.json", "final.json"} <= set(paths.listdir(url))


def test_two_slices_are_the_dcn_axis_and_train_as_one_process(tmp_path):
    # A multislice job's layout off TPU: each process a slice (jax's hybrid-mesh helper with
    # the process as granule), the dcn axis outermost, data parallel across the slices.
    multi, single = run_jobs(tmp_path, dict(processes=2, devices=2, spe=3, args=("slices",)),
                             dict(processes=1, devices=1, spe=3))
    assert multi["mesh"] == {"dcn": 2, "data": 2}
    assert multi["processes_by_mesh"] == [[0, 0], [1, 1]]  # a slice is one process
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(multi["kernel0"], single["kernel0"], rtol=1e-4, atol=1e-6)


def test_two_processes_share_a_dataset(tmp_path):
    """fit(Dataset) on 2 processes: each process draws its own shuffle seed, fit() iterates
    process 0's on both (a new plan; the user's dataset keeps its seed) and each takes a
    disjoint half of every batch, so the global batches, and so the losses, are those of one
    process iterating the same pipeline with process 0's seed."""
    multi = start_job(tmp_path / "job_2x2_dataset.json", 2, 2, 2, "dataset")
    try:  # the one-process job starts once process 0 has drawn its seed, before its fit()
        drawn = tmp_path / "job_2x2_dataset.json.drawn0"
        deadline = time.monotonic() + 240
        while not drawn.exists() or not drawn.read_text():
            assert time.monotonic() < deadline and all(p.poll() is None for p in multi), \
                finish(multi, timeout=10)
            time.sleep(0.05)
        seed0 = drawn.read_text()
        single = run_job(tmp_path, 1, 1, 2, "dataset", seed0)
    finally:
        logs = finish(multi)
    for p, log in zip(multi, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    multi = json.loads((tmp_path / "job_2x2_dataset.json").read_text())
    # the user's dataset kept its seed through fit() (fit() iterated a new plan)
    assert (tmp_path / "job_2x2_dataset.json.seed0").read_text() == seed0
    assert multi["steps"] == single["steps"] == 2 * 12  # 23 steps an epoch, 2 per execution
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(multi["kernel0"], single["kernel0"], rtol=1e-4, atol=1e-6)


def test_bad_data_on_one_process_fails_every_process(tmp_path):
    """Process 1 alone holds a label out of range: both processes raise (the other one says
    another process found bad data) instead of one raising and the other waiting forever in
    the first all-reduce."""
    procs = start_job(tmp_path / "bad.json", 2, 1, 1, "bad_labels")
    logs = finish(procs, timeout=120)
    assert [p.returncode for p in procs] == [3, 3], logs
    assert "another process found that its data do not fit the model" in logs[0], logs[0]
    assert "label 99 is out of range for 10 classes" in logs[1], logs[1]


def test_outputs_that_are_not_probabilities_fail_every_process_by_name(tmp_path):
    procs = start_job(tmp_path / "relu.json", 2, 1, 1, "not_probabilities")
    logs = finish(procs, timeout=120)
    assert [p.returncode for p in procs] == [3, 3], logs
    for log in logs:
        assert "outputs on the first batch are not probabilities" in log, log[-3000:]
