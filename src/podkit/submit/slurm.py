"""`podkit submit slurm`: a training run as a SLURM batch job that survives preemption.

    job = SlurmJob(config="configs/seed_mlp.toml", nodes=2, tasks_per_node=1, cpu_devices=2)
    script = job.write()          # RUN_DIR/slurm/job.sbatch (+ the resolved config.toml)
    job_id = job.submit(script)   # sbatch --parsable; its refusals become SubmitError

What the written script does, in order (it says so in its comments too):

1. `python -m podkit.submit.slurm_job begin RUN_DIR`: a line in RUN_DIR/slurm/job.log (which
   start this is, on which nodes, the checkpoint step it resumes from);
2. `srun --kill-on-bad-exit=1` runs one `podkit train` per task; each task joins the job from
   SLURM's variables (`podkit.jobenv`), so there is nothing to wire. A task that dies ends the
   step at once (the others would wait for it in their next collective);
3. `python -m podkit.submit.slurm_job end RUN_DIR --status $?`: finished, or requeue the job
   (`scontrol requeue`) when it was preempted or failed and `--max-restarts` allows, or fail.

Elastic (`--min-processes K`): the node count is SLURM's own range, `#SBATCH --nodes=MIN-MAX`
(MIN enough nodes for K tasks), so each start, a requeue included, runs on the nodes SLURM can
give: a node that failed and is down or drained is left out and the job resumes on the rest,
and it is back in the range once SLURM has it again. `PODKIT_MAX_PROCESSES` tells the tasks
the count the config's batch was set for (podkit.elastic keeps the global batch). What SLURM
does not see, a node that is up but fails the job again and again, is not excluded: SLURM
allocates it again.

Why the job requeues itself: on preemption SLURM sends SIGTERM to the job's steps (the tasks;
not the batch shell) and, after the partition's GraceTime, SIGKILL. podkit's tasks agree on a
step, write a final checkpoint there and exit 0 well inside the grace — and a batch job that
ends during its grace is COMPLETED, not requeued. The tasks record the preemption in
RUN_DIR/slurm/events.jsonl (`jobenv.record`), the `end` step reads it. The same path covers
the time limit: `#SBATCH --signal=TERM@GRACE` warns the tasks GRACE seconds before `--time`
ends, and the run continues in a new allocation. SLURM_RESTART_COUNT counts the requeues.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from podkit.errors import ConfigError, SubmitError
from podkit.submit.command import check_counts, script_name

SCRIPT = "job.sbatch"
SLURM_DIR = "slurm"  # under the run directory: the script, its logs, job.log, events.jsonl
TIME_FORMS = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")  # MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
NO_LIMIT = ("0", "UNLIMITED", "INFINITE")  # SLURM's ways to say "no time limit"
# sbatch options podkit writes itself: --sbatch may not set them (the flag to use instead).
OWNED = {"nodes": "--nodes", "ntasks-per-node": "--tasks-per-node", "ntasks": "--nodes and "
         "--tasks-per-node", "cpus-per-task": "--cpus-per-task", "partition": "--partition",
         "time": "--time", "signal": "--time and --grace", "job-name": "", "output": "",
         "error": "", "open-mode": "", "requeue": "", "no-requeue": "", "parsable": ""}


def slurm_seconds(value: str) -> int:
    """SLURM's --time in seconds: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + m * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A job's run directory and name, and for a config its TOML and checkpoint directory."""

    run_dir: Path
    name: str
    toml: str | None = None
    checkpoints: str | None = None


@dataclasses.dataclass
class SlurmJob:
    """What `podkit submit slurm` was asked for: a config to train, or a command to run."""

    config: str | None = None
    sets: Sequence[str] = ()
    command: Sequence[str] = ()  # `-- CMD...`: the user's own script instead of a config
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int | None = None
    cpu_devices: int | None = None  # virtual CPU devices per task (PODKIT_CPU_DEVICES)
    partition: str | None = None
    time: str | None = None
    max_restarts: int = 3
    grace: int = 60
    min_processes: int | None = None  # elastic: #SBATCH --nodes=MIN-MAX (None: nodes only)
    run_dir: str | None = None  # `-- CMD` only: where job.log and the script go
    sbatch_options: Sequence[str] = ()  # more #SBATCH lines, KEY=VALUE (account=ml, qos=high)
    python: str = sys.executable

    @property
    def min_nodes(self) -> int:
        """The fewest nodes a start may get: enough for --min-processes tasks."""
        if self.min_processes is None:
            return self.nodes
        return -(-self.min_processes // self.tasks_per_node)

    @property
    def time_limited(self) -> bool:
        """Whether --time sets a limit (it may say there is none: 0, UNLIMITED)."""
        return self.time is not None and self.time.upper() not in NO_LIMIT

    def validate(self) -> None:
        """Raise ConfigError naming the bad flag and the fix, before anything is written."""
        if self.config is None and not self.command:
            raise ConfigError(
                "podkit submit slurm needs a config (`podkit submit slurm CONFIG.toml ...`) "
                "or a command after -- (`podkit submit slurm --nodes 2 -- python train.py`).")
        if self.config is not None and self.command:
            raise ConfigError(
                f"podkit submit slurm got a config ({self.config}) and a command after -- "
                f"({shlex.join(self.command)}); a job runs one of the two.")
        if self.command and self.sets:
            raise ConfigError("--set changes a config; with -- COMMAND there is none. Pass "
                              "the values to your command instead.")
        if self.config is not None and self.run_dir is not None:
            raise ConfigError("--run-dir is for -- COMMAND jobs; a config's run directory is "
                              "[run] dir/name (--set run.name=...).")
        check_counts(nodes=self.nodes, tasks_per_node=self.tasks_per_node,
                     cpus_per_task=self.cpus_per_task, cpu_devices=self.cpu_devices)
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} must be >= 0 (0: never "
                              "requeue).")
        processes = self.nodes * self.tasks_per_node
        if self.min_processes is not None and not 1 <= self.min_processes <= processes:
            raise ConfigError(f"--min-processes {self.min_processes} must be between 1 and "
                              f"--nodes x --tasks-per-node = {processes}; pass "
                              f"{min(max(self.min_processes, 1), processes)} or leave it out.")
        if self.grace < 0:
            raise ConfigError(f"--grace {self.grace} is negative; pass the seconds before "
                              "--time ends at which the tasks save and stop (default 60).")
        if self.time_limited:
            if not TIME_FORMS.match(self.time):
                raise ConfigError(f"--time {self.time!r} is not a SLURM time; write minutes "
                                  "(90), HH:MM:SS (01:30:00) or D-HH:MM:SS (1-00:00:00).")
            if self.grace >= slurm_seconds(self.time):
                raise ConfigError(f"--grace {self.grace} s is not shorter than --time "
                                  f"{self.time} ({slurm_seconds(self.time)} s: SLURM reads "
                                  "MM, MM:SS, HH:MM:SS, D-HH:MM:SS): the tasks would be told to "
                                  "stop at once. Lower --grace or raise --time.")
        for option in self.sbatch_options:
            if not re.match(r"^[a-z][a-z-]*(=\S+)?$", option):
                raise ConfigError(f"--sbatch {option!r} is not KEY=VALUE as sbatch's long "
                                  "options (no spaces), e.g. --sbatch account=ml or --sbatch "
                                  "gres=gpu:8.")
            key = option.partition("=")[0]
            if key in OWNED:
                raise ConfigError(f"--sbatch {option} sets what podkit writes itself"
                                  f"{': use ' + OWNED[key] if OWNED[key] else ''} (the job's "
                                  "requeue, output and signal lines are podkit's).")
        if self.partition is not None and not re.match(r"^[\w.-]+(,[\w.-]+)*$", self.partition):
            raise ConfigError(f"--partition {self.partition!r} is not a partition name.")

    # -- what is written -----------------------------------------------------------------------
    def resolved(self) -> Resolved:
        """The run directory, the config as TOML, the job's name; the config checked."""
        if self.config is None:
            where = Path(self.run_dir or f"runs/{script_name(self.command)}").resolve()
            return Resolved(where, where.name)
        from podkit import config as config_lib

        config = config_lib.load(self.config, list(self.sets))
        if not config.checkpoint.enabled:
            raise ConfigError(f"{self.config} has checkpoint.enabled = false; a SLURM job "
                              "resumes from its checkpoints after a preemption or a failure. "
                              "Set checkpoint.enabled = true (--set checkpoint.enabled=true).")
        where = (Path(config.run.dir) / config.run.name).resolve()
        checkpoints = Path(config.checkpoint.dir or where / "checkpoints")
        if "://" not in config.checkpoint.dir:
            checkpoints = checkpoints.resolve()
        # The job's config: the run dir's own config.toml is written by the run; this one is
        # what every restart of the job trains with (the file the user edits may change),
        # with absolute paths (the job starts in the submit directory, which is recorded).
        config = dataclasses.replace(config, run=dataclasses.replace(
            config.run, dir=str(where.parent)))
        return Resolved(where, config.run.name, config_lib.to_toml(config),
                        str(checkpoints) if "://" not in config.checkpoint.dir
                        else config.checkpoint.dir)

    def script(self) -> str:
        """The sbatch script (what --dry-run prints)."""
        self.validate()
        return self._render(self.resolved())

    def _render(self, job: Resolved) -> str:
        run_dir, name = job.run_dir, job.name
        here = run_dir / SLURM_DIR
        q = shlex.quote
        py = q(self.python)
        ckpt = f" --checkpoints {q(job.checkpoints)}" if job.checkpoints else ""
        if self.config is not None:
            step = (f"{py} -m podkit.cli train {q(str(here / 'config.toml'))}")
            what = f"trains {self.config} (resolved into {here / 'config.toml'})"
        else:
            step = " ".join(q(c) for c in self.command)
            what = f"runs {step}"
        lines = [
            "#!/bin/bash",
            f"# podkit submit slurm: {what}",
            f"# Run directory {run_dir}; this job's log: {here / 'job.log'}.",
            f"# Written {datetime.datetime.now().isoformat(timespec='seconds')}; submit it "
            f"again with: sbatch {here / SCRIPT}",
            f"#SBATCH --job-name={name}",
        ]
        low = self.min_nodes
        if low < self.nodes:
            lines += [f"# Elastic (--min-processes {self.min_processes}): SLURM allocates "
                      f"{low} to {self.nodes} nodes at every start",
                      "# (a requeue gets the nodes that are up); the tasks keep the global "
                      "batch (podkit.elastic).",
                      f"#SBATCH --nodes={low}-{self.nodes}"]
        else:
            lines.append(f"#SBATCH --nodes={self.nodes}")
        lines.append(f"#SBATCH --ntasks-per-node={self.tasks_per_node}")
        if self.cpus_per_task:
            lines.append(f"#SBATCH --cpus-per-task={self.cpus_per_task}")
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        if self.time:
            lines.append(f"#SBATCH --time={self.time}")
        lines += [
            "# One output file for every start of the job (a requeue appends to it).",
            f"#SBATCH --output={here}/job-%j.out",
            "#SBATCH --open-mode=append",
            "# Requeue is allowed (preemption, a failed step, the time limit).",
            "#SBATCH --requeue",
        ]
        if self.time_limited:
            lines += [f"# The tasks get SIGTERM {self.grace} s before --time ends: they save "
                      "and stop, and the job requeues.",
                      f"#SBATCH --signal=TERM@{self.grace}"]
        lines += [f"#SBATCH --{o}" for o in self.sbatch_options]
        lines += [
            "",
            "set -u",
            "# The tasks record a preemption here (they exit 0 either way); `end` reads it.",
            f"export PODKIT_JOB_EVENTS={q(str(here / 'events.jsonl'))}",
            "# Tasks print whole lines as they go (the output is a file, not a terminal).",
            "export PYTHONUNBUFFERED=1",
            # podkit's own variables of an outer launch must not reach the tasks: each task
            # joins this job from SLURM's variables (PODKIT_COORDINATOR, when set, names
            # process 0's address where SLURM's node names do not resolve).
            "unset PODKIT_NUM_PROCESSES PODKIT_PROCESS_ID",
        ]
        if self.cpus_per_task:
            lines += ["# srun does not inherit sbatch's --cpus-per-task (SLURM >= 22.05).",
                      f"export SRUN_CPUS_PER_TASK={self.cpus_per_task}"]
        if self.cpu_devices:
            lines += ["# Virtual CPU devices per task (connect() reads it).",
                      f"export PODKIT_CPU_DEVICES={self.cpu_devices}"]
        if self.min_nodes < self.nodes:
            lines += ["# The process count the config's batch was set for: on fewer nodes "
                      "the tasks keep the",
                      "# global batch with more microbatches (podkit.elastic).",
                      f"export PODKIT_MAX_PROCESSES={self.nodes * self.tasks_per_node}"]
        lines += [
            f"cd {q(os.getcwd())}",
            "",
            "# 1. Which start this is and what it resumes from, into job.log.",
            f"{py} -m podkit.submit.slurm_job begin {q(str(run_dir))}{ckpt}",
            "",
            "# 2. One process per task. A task that dies ends the step at once: the others",
            "#    would otherwise wait for it in their next collective.",
            f"srun --kill-on-bad-exit=1 --label {step}",
            "status=$?",
            "",
            "# 3. Done, or requeue (preempted or failed, within --max-restarts), or fail.",
            f"exec {py} -m podkit.submit.slurm_job end {q(str(run_dir))} --status $status "
            f"--max-restarts {self.max_restarts}{ckpt}",
            "",
        ]
        return "\n".join(lines)

    def write(self) -> Path:
        """Write RUN_DIR/slurm/job.sbatch (and config.toml); returns the script's path. A job
        of this run directory that is still queued or running is never overwritten."""
        self.validate()
        job = self.resolved()
        live = self.live_job(job.run_dir)
        if live is not None:
            raise SubmitError(f"SLURM job {live} of {job.run_dir} is still queued or running, "
                              "and its restarts read the script and config there. Fix: wait "
                              f"for it, `scancel {live}`, or pick another run.name.")
        here = job.run_dir / SLURM_DIR
        here.mkdir(parents=True, exist_ok=True)
        if job.toml is not None:
            (here / "config.toml").write_text(job.toml)
        path = here / SCRIPT
        path.write_text(self._render(job))
        path.chmod(0o755)
        return path

    # -- submission ----------------------------------------------------------------------------
    def submit(self, script: Path) -> str:
        """sbatch the script; returns the job id. sbatch's refusals become SubmitError."""
        if shutil.which("sbatch") is None:
            raise SubmitError("sbatch is not on PATH: run `podkit submit slurm` on a SLURM "
                              "login node (or add --dry-run to only write and print the "
                              "script).")
        # --test-only first: a cluster that does not enforce partition limits at submission
        # (EnforcePartLimits=NO, SLURM's default) queues a job that can never run, and it
        # pends forever; asked first, the scheduler says so.
        for extra in (["--test-only"], ["--parsable"]):
            try:
                done = subprocess.run(["sbatch", *extra, str(script)], capture_output=True,
                                      text=True, timeout=120)
            except subprocess.TimeoutExpired:
                raise SubmitError("sbatch did not answer within 120 s: is slurmctld up? "
                                  "(`scontrol ping`)") from None
            if done.returncode != 0:
                raise SubmitError(self._refusal(done.stderr.strip() or done.stdout.strip()))
        job_id = done.stdout.strip().split(";")[0]
        (script.parent / "job_id").write_text(job_id + "\n")
        return job_id

    def _refusal(self, said: str) -> str:
        """sbatch's words, with the flag they are about and the values that would work."""
        reason = " ".join(line.removeprefix("sbatch: error: ").strip()
                          for line in said.splitlines() if line.strip()) or "no reason given"
        reason = reason.removeprefix("allocation failure: ").rstrip(".")
        low = reason.lower()
        if any(k in low for k in ("unable to contact slurm controller",
                                  "could not establish a configuration source",
                                  "configuration source", "slurm_conf")):
            return (f"sbatch could not reach a SLURM controller ({reason}). Fix: run `podkit "
                    "submit slurm` on a login node of the cluster (`scontrol ping` must answer "
                    "there), or add --dry-run to only print the script.")
        text = f"sbatch refused the job: {reason}."
        if "account" in low or "qos" in low or "association" in low:
            return (f"{text} Fix: pass an account and QOS your user may use, e.g. --sbatch "
                    "account=NAME --sbatch qos=NAME (`sacctmgr show assoc user=$USER`).")
        if "partition" in low:
            have = ", ".join(_sinfo("%R")) or "see `sinfo`"
            if self.partition is None:
                return (f"{text} Fix: the cluster has no default partition for you; pass "
                        f"--partition (one of: {have}).")
            return (f"{text} Fix: --partition {self.partition!r} is not one of this cluster's "
                    f"partitions: {have}.")
        if "time limit" in low:
            if self.time is None:
                return (f"{text} Fix: the partition needs a time limit; pass --time within "
                        "its limit (`sinfo -o '%P %l'`).")
            return (f"{text} Fix: --time {self.time} is above the partition's limit "
                    "(`sinfo -o '%P %l'` lists the limits).")
        if "node count" in low or "node configuration is not available" in low or \
                "more processors requested" in low or "nodes" in low:
            nodes = _sinfo("%N", per_node=True)
            count = f"this cluster has {len(nodes)} node(s) (`sinfo -N -l` lists them)" \
                if nodes else "`sinfo -N -l` lists the nodes"
            per_task = f" x {self.cpus_per_task} CPUs" if self.cpus_per_task else ""
            extra = f" with {', '.join(self.sbatch_options)}" if self.sbatch_options else ""
            return (f"{text} Fix: the partition has no {self.nodes} node(s) that each take "
                    f"--tasks-per-node {self.tasks_per_node}{per_task}{extra}; {count}. Ask "
                    "for fewer nodes, tasks or resources per node.")
        return text

    # -- a live job in the run directory -------------------------------------------------------
    @staticmethod
    def live_job(run_dir: Path) -> str | None:
        """The id of this run directory's job when SLURM still has it queued or running."""
        recorded = run_dir / SLURM_DIR / "job_id"
        if not recorded.exists() or shutil.which("squeue") is None:
            return None
        job = recorded.read_text().strip()
        try:
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                                   text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
        return job if state else None


def _sinfo(field: str, per_node: bool = False) -> list[str]:
    """One sinfo column (partitions: %R; nodes: %N with -N), or [] when sinfo cannot say."""
    try:
        out = subprocess.run(["sinfo", "-h", *(["-N"] if per_node else []), "-o", field],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.strip() for line in out.splitlines() if line.strip()})
