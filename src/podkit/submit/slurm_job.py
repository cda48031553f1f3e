"""The job's side of `podkit submit slurm`: what its sbatch script runs before and after the step.

    python -m podkit.submit.slurm_job begin RUN_DIR [--checkpoints DIR]
    python -m podkit.submit.slurm_job end RUN_DIR --status N --max-restarts R [--checkpoints DIR]

`begin` notes the start (which restart, the nodes, the checkpoint step it resumes from). `end`
decides from the step's exit status and the tasks' events (RUN_DIR/slurm/events.jsonl, where a
preempted task wrote "preempted" with its step):

- status 0 and no preemption: the run is complete; exit 0;
- preempted, or the step failed (a task exited non-zero or was killed): `scontrol requeue` the
  job while SLURM_RESTART_COUNT < --max-restarts (the requeued job resumes from the newest
  checkpoint); else exit 1 and the job is FAILED, the reason in job.log.

Every decision is a line in RUN_DIR/slurm/job.log (and in the job's output file), e.g.

    2026-12-06 02:10:41 job 12 start 0: preempted at step 40 (final checkpoint written);
                        requeued as start 1 of at most 4
    2026-12-06 02:10:59 job 12 start 1: 2 tasks on n[1-2]; resuming from checkpoint step 40
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from podkit import jobenv
from podkit.submit.slurm import SLURM_DIR


def _restart() -> int:
    raw = os.environ.get("SLURM_RESTART_COUNT", "0")
    return int(raw) if raw.isdigit() else 0


def _say(run_dir: Path, text: str) -> None:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    line = f"{stamp} job {os.environ.get('SLURM_JOB_ID', '?')} start {_restart()}: {text}"
    print(f"podkit: {line}", flush=True)
    with open(run_dir / SLURM_DIR / "job.log", "a") as f:
        f.write(line + "\n")


def _newest_checkpoint(directory: str | None) -> int | None:
    """The newest valid step of a checkpoint directory, local or in object storage."""
    if not directory or ("://" not in directory and not Path(directory).is_dir()):
        return None
    from podkit.checkpoint import CheckpointManager

    return CheckpointManager(directory).latest()


def _events_since_start(run_dir: Path) -> list[dict]:
    """The events of this start of the job: those after its last "start" record."""
    path = run_dir / SLURM_DIR / "events.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return events[starts[-1] + 1:] if starts else events


def begin(run_dir: Path, checkpoints: str | None) -> int:
    nodes = os.environ.get("SLURM_JOB_NODELIST", "?")
    tasks = os.environ.get("SLURM_NTASKS", "?")
    step = _newest_checkpoint(checkpoints)
    jobenv.record("start", restart=_restart(), job=os.environ.get("SLURM_JOB_ID"),
                  checkpoint=step)
    if checkpoints is None:
        where = "its own checkpoints decide where it starts"
    elif step is None:
        where = "no checkpoint yet: training from the start"
    else:
        where = f"resuming from checkpoint step {step}"
    _say(run_dir, f"{tasks} tasks on {nodes}; {where}")
    return 0


def end(run_dir: Path, status: int, max_restarts: int, checkpoints: str | None) -> int:
    events = _events_since_start(run_dir)
    preempted = [e for e in events if e.get("event") == "preempted"]
    if status == 0 and not preempted:
        step = _newest_checkpoint(checkpoints)
        jobenv.record("complete", restart=_restart(), checkpoint=step)
        _say(run_dir, "complete" + (f" (checkpoint step {step})" if step is not None else ""))
        return 0
    if preempted:
        what = f"preempted at step {preempted[-1]['step']} (final checkpoint written)"
        event = "preempted"
    else:
        step = _newest_checkpoint(checkpoints)
        what = (f"the step failed (srun exit status {status}: a task exited non-zero or was "
                f"killed); newest checkpoint: "
                + (f"step {step}" if step is not None else "none"))
        event = "failed"
    restart = _restart()
    if restart >= max_restarts:
        jobenv.record("gave_up", restart=restart, reason=event, status=status)
        _say(run_dir, f"{what}; not requeued: --max-restarts {max_restarts} used up "
                      f"({restart} restart(s) so far). The job fails; submit it again to go on "
                      "from the newest checkpoint.")
        return 1
    job = os.environ.get("SLURM_JOB_ID", "")
    # Logged first: a running job that requeues itself is ended by SLURM right after.
    jobenv.record("requeue", restart=restart, reason=event, status=status)
    _say(run_dir, f"{what}; requeued as start {restart + 1} of at most {max_restarts + 1}")
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if done.returncode != 0:
        _say(run_dir, f"`scontrol requeue {job}` failed: {done.stderr.strip()}; the job "
                      "fails (is JobRequeue disabled on this cluster? sbatch --requeue "
                      "needs it).")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podkit.submit.slurm_job")
    parser.add_argument("action", choices=("begin", "end"))
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoints", default=None)
    parser.add_argument("--status", type=int, default=0)
    parser.add_argument("--max-restarts", type=int, default=3)
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    (run_dir / SLURM_DIR).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(jobenv.ENV_EVENTS, str(run_dir / SLURM_DIR / "events.jsonl"))
    if args.action == "begin":
        return begin(run_dir, args.checkpoints)
    return end(run_dir, args.status, args.max_restarts, args.checkpoints)


if __name__ == "__main__":
    sys.exit(main())
