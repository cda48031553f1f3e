"""`podkit submit slurm` against a real SLURM: slurmctld and two slurmd started by the fixture
(tests/slurm_cluster.py), so every job spans two nodes, each task a process with 2 CPU devices.

What is shown: a 2-node job trains as one process on 4 devices does; a job preempted by a
higher-priority partition writes its final checkpoint, requeues itself and resumes exactly
(its final digest is the uninterrupted job's); so does a job one of whose tasks is SIGKILLed;
with --max-restarts used up the job fails and says why; sbatch's refusals are podkit errors;
and when the fixture stops SLURM no process of any job is left.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from slurm_cluster import SlurmCluster, require

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "seed_mlp.toml")
# 8 epochs of 45 steps; a checkpoint at each epoch's end (the requeued job resumes from the
# newest); the digits MLP is a few seconds of training on two 2-device processes. A
# preemption asked for once the first checkpoint (step 45) is committed stopped the job at
# step 54 to 99 (up to ~2 s later; a step takes 20-50 ms): 260 or more steps to spare.
SETS = ["train.epochs=8", "train.steps_per_execution=9", "train.log_every=9",
        "checkpoint.every_steps=45", "checkpoint.keep=2"]
LAST = 360  # the run's last step: 8 epochs of 45
TIMINGS = {}  # what the closing note reports: seconds from requeue to the first step


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    require()
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    killed = cluster.stop()
    assert all(p.poll() is not None for p in cluster.daemons), "a SLURM daemon survived"
    assert killed == [], f"processes of jobs outlived scancel: {killed}"


def _cli(slurm, cwd, *args, check=True):
    env = {k: v for k, v in slurm.env.items() if not k.startswith("PODKIT_")}
    done = subprocess.run([sys.executable, "-m", "podkit.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=180)
    if check:
        assert done.returncode == 0, (done.stdout, done.stderr)
    return done


def _submit(slurm, tmp, name, *flags):
    sets = [f"run.dir={tmp}", f"run.name={name}", *SETS]
    args = ["submit", "slurm", CONFIG, "--nodes", "2", "--tasks-per-node", "1",
            "--cpu-devices", "2", *[a for s in sets for a in ("--set", s)], *flags]
    out = _cli(slurm, tmp, *args).stdout
    return re.search(r"submitted SLURM job (\d+)", out).group(1), tmp / name


def _digest(run_dir):
    """(step, xxh3-128 of parameters and optimizer state) of the newest checkpoint: what
    `podkit checkpoint digest` prints (tests/test_checkpoint.py runs that command), read here
    without starting a process."""
    return pk.checkpoint.CheckpointManager(run_dir / "checkpoints").digest()


def _events(run_dir):
    text = (run_dir / "slurm" / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _wait_for_checkpoint(run_dir, timeout=120):
    """Until the job has committed its first checkpoint (step 45 with SETS): training is under
    way and a failure from now on has a step to resume from."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list(run_dir.glob("checkpoints/step_*/COMMIT.json")):
            return
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint in {run_dir} after {timeout} s: "
                         f"{list(run_dir.rglob('*.out'))}")


def _requeue_to_first_step(run_dir):
    """Seconds from the job's requeue to the first logged step after it, and the step."""
    requeued = next(e["time"] for e in _events(run_dir) if e["event"] == "requeue")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(m for m in lines if m.get("time", 0) > requeued and "loss" in m)
    return first["time"] - requeued


def _log(run_dir):
    return (run_dir / "slurm" / "job.log").read_text()


@pytest.fixture(scope="module")
def reference(slurm, tmp_path_factory):
    """An uninterrupted 2-node job: its run directory."""
    tmp = tmp_path_factory.mktemp("reference")
    job, run_dir = _submit(slurm, tmp, "whole")
    state = slurm.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=180)
    out = "".join(p.read_text() for p in (run_dir / "slurm").glob("job-*.out"))
    assert state == "COMPLETED", out[-3000:]
    return run_dir


def test_a_two_node_job_trains_as_one_process_does(slurm, reference, tmp_path):
    log = _log(reference)
    assert "2 tasks on n[1-2]; no checkpoint yet: training from the start" in log
    assert f"complete (checkpoint step {LAST})" in log, log
    out = "".join(p.read_text() for p in (reference / "slurm").glob("job-*.out"))
    assert "Cluster: 4 cpu device(s) (cpu) across 2 process(es)" in out
    run = json.loads((reference / "run.json").read_text())
    assert (run["processes"], run["devices"]) == (2, 4)
    one = _cli(slurm, tmp_path, "train", CONFIG, "--cpu-devices", "4",
               *[a for s in [f"run.dir={tmp_path}", "run.name=one", *SETS]
                 for a in ("--set", s)])
    assert one.returncode == 0
    finals = [json.loads((d / "final.json").read_text()) for d in (tmp_path / "one", reference)]
    for key in finals[0].keys() - {"input_wait"}:  # a timing
        # The order of a cross-process sum differs from one process's: ~1e-6 seen.
        np.testing.assert_allclose(finals[1][key], finals[0][key], rtol=1e-4, err_msg=key)
    assert finals[0]["val_accuracy"] > 0.9


def test_a_preempted_job_requeues_and_resumes_exactly(slurm, reference, tmp_path):
    job, run_dir = _submit(slurm, tmp_path, "preempted")
    _wait_for_checkpoint(run_dir)
    # A job in the higher-priority partition that needs both nodes whole preempts it.
    urgent = slurm.run("sbatch", "--parsable", "-p", "urgent", "-N", "2", "--exclusive",
                       "-o", str(tmp_path / "urgent.out"), "--wrap", "sleep 2").stdout.strip()
    state = slurm.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=240)
    log = _log(run_dir)
    assert state == "COMPLETED", log
    assert slurm.state(urgent) == "COMPLETED"
    preempted = re.search(r"start 0: preempted at step (\d+) \(final checkpoint written\); "
                          r"requeued as start 1", log)
    assert preempted, log
    step = int(preempted.group(1))
    assert 45 <= step < LAST, log
    assert f"start 1: 2 tasks on n[1-2]; resuming from checkpoint step {step}" in log
    assert f"start 1: complete (checkpoint step {LAST})" in log
    assert [e["step"] for e in _events(run_dir) if e["event"] == "resumed"] == [step]
    digest = _digest(run_dir)
    assert digest == _digest(reference) and digest[0] == LAST
    print(f"digest after a preemption and resume at step {step}: {digest[1]}")
    TIMINGS["preempted"] = _requeue_to_first_step(run_dir)
    print(f"requeue -> first step after preemption: {TIMINGS['preempted']:.1f} s")


def _kill_task(slurm, job, procid):
    """SIGKILL the training process of one task of a job (by its SLURM variables)."""
    for proc in slurm.job_processes():
        env = proc.environ()
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_PROCID") == str(procid) and \
                "podkit.cli" in " ".join(proc.cmdline()):
            proc.kill()
            return proc.pid
    raise AssertionError(f"no task {procid} of job {job} found")


def test_a_killed_task_requeues_the_job_which_resumes_exactly(slurm, reference, tmp_path):
    job, run_dir = _submit(slurm, tmp_path, "killed")
    _wait_for_checkpoint(run_dir)
    _kill_task(slurm, job, 1)
    # A second submit to the run directory of a live job is refused: its restarts read the
    # script and config there. Asked while the job fails and is requeued (its restart, which
    # must still ask for 2 nodes, waits cred_expire + 1 s), not while it trains.
    again = _cli(slurm, tmp_path, "submit", "slurm", CONFIG, "--set", f"run.dir={tmp_path}",
                 "--set", "run.name=killed", "--nodes", "4", check=False)
    assert again.returncode == 2, (again.stdout, again.stderr)
    assert f"SLURM job {job} of {run_dir} is still queued or running" in again.stderr
    assert "#SBATCH --nodes=2" in (run_dir / "slurm" / "job.sbatch").read_text()
    state = slurm.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=240)
    log = _log(run_dir)
    assert state == "COMPLETED", log
    failed = re.search(r"start 0: the step failed \(srun exit status (\d+): .*\); newest "
                       r"checkpoint: step (\d+); requeued as start 1", log)
    assert failed, log
    assert int(failed.group(1)) != 0
    assert f"start 1: 2 tasks on n[1-2]; resuming from checkpoint step {failed.group(2)}" in log
    assert f"start 1: complete (checkpoint step {LAST})" in log
    digest = _digest(run_dir)
    assert digest == _digest(reference) and digest[0] == LAST
    print(f"digest after a kill and resume at step {failed.group(2)}: {digest[1]}")
    TIMINGS["killed"] = _requeue_to_first_step(run_dir)
    print(f"requeue -> first step after a kill: {TIMINGS['killed']:.1f} s")


def test_max_restarts_used_up_fails_the_job_with_the_reason(slurm, tmp_path):
    # A checkpoint every window: the first one, and so the kill, comes at step 9.
    job, run_dir = _submit(slurm, tmp_path, "gives_up", "--max-restarts", "0",
                           "--set", "checkpoint.every_steps=9")
    _wait_for_checkpoint(run_dir)
    _kill_task(slurm, job, 0)
    state = slurm.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=120)
    log = _log(run_dir)
    assert state == "FAILED", log
    assert "not requeued: --max-restarts 0 used up (0 restart(s) so far). The job fails" in log
    assert "start 1" not in log
    assert [e["event"] for e in _events(run_dir)][-1] == "gave_up"


@pytest.mark.parametrize("flags, said", [
    (["--partition", "nope"], "--partition 'nope' is not one of this cluster's partitions: "
                              "batch, urgent"),
    (["--nodes", "3"], "the partition has no 3 node(s) that each take --tasks-per-node 1; "
                       "this cluster has 2 node(s)"),
])
def test_sbatch_refusals_are_podkit_errors(slurm, tmp_path, flags, said):
    args = ["submit", "slurm", CONFIG, "--set", f"run.dir={tmp_path}", "--nodes", "2", *flags]
    done = _cli(slurm, tmp_path, *args, check=False)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("podkit: error: sbatch refused the job: "), done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr
    assert slurm.run("squeue", "-h").stdout.strip() == ""  # nothing was queued


def test_a_user_script_runs_as_a_job(slurm, tmp_path):
    """`-- python script.py`: each task joins through SLURM's variables with connect()."""
    script = tmp_path / "job.py"
    script.write_text(
        "import podkit as pk\n"
        "import jax, jax.numpy as jnp\n"
        "c = pk.connect()\n"
        "x = jax.make_array_from_process_local_data(\n"
        "    jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices(), 'd'),\n"
        "                               jax.sharding.PartitionSpec('d')),\n"
        "    jnp.full((c.device_count // c.process_count,), c.process_index + 1.0))\n"
        "print('sum', float(jnp.sum(x)), 'process', c.process_index, 'of', c.process_count)\n")
    done = _cli(slurm, tmp_path, "submit", "slurm", "--nodes", "2", "--cpu-devices", "2",
                "--run-dir", str(tmp_path / "script_run"), "--", sys.executable, str(script))
    job = re.search(r"submitted SLURM job (\d+)", done.stdout).group(1)
    state = slurm.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=120)
    out = (tmp_path / "script_run" / "slurm" / f"job-{job}.out").read_text()
    assert state == "COMPLETED", out
    assert "0: sum 6.0 process 0 of 2" in out and "1: sum 6.0 process 1 of 2" in out
    assert "complete" in _log(tmp_path / "script_run")
