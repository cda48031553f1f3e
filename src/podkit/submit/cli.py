"""`podkit submit`: the command line of the cluster engines (slurm.py, k8s.py).

    podkit submit slurm CONFIG [--set K=V ...] --nodes N --tasks-per-node K [--partition P]
                        [--time T] [--max-restarts R] [--grace S] [--cpus-per-task C]
                        [--cpu-devices D] [--sbatch KEY=VALUE ...] [--dry-run]
    podkit submit slurm --nodes N ... [--run-dir DIR] -- python train.py ...
    podkit submit k8s CONFIG --image IMAGE (--tpu TYPE-TOPOLOGY [--slices N] | --cpu-pods N
                      [--cpu-devices D]) [--max-restarts R] [--checkpoint-dir gs://...]
                      [--name NAME] [--namespace NS] [--out FILE] [--dry-run | --apply]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError
from podkit.submit.k8s import K8sJob
from podkit.submit.slurm import SlurmJob


def add_parser(subparsers: Any) -> None:
    """Add the `submit` subcommand (slurm, k8s) to an argparse subparsers object."""
    p = subparsers.add_parser("submit", help="run a config (or a script) on a cluster "
                              "engine: SLURM batch jobs, Kubernetes JobSets for TPU slices")
    engines = p.add_subparsers(dest="engine", required=True)

    s = engines.add_parser(
        "slurm", help="write an sbatch script into the run directory and submit it",
        description="Write RUN_DIR/slurm/job.sbatch and submit it with sbatch. Every task "
        "trains through srun and joins the job from SLURM's variables; a preempted or "
        "failed job requeues itself (up to --max-restarts) and resumes from its checkpoint.")
    s.add_argument("config", nargs="?", default=None,
                   help="a TOML config (or give a command after --)")
    s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    s.add_argument("--nodes", type=int, default=1, metavar="N", help="nodes (default 1)")
    s.add_argument("--tasks-per-node", type=int, default=1, metavar="K",
                   help="processes per node (default 1; one per node on TPU VMs and for "
                   "CPU jobs)")
    s.add_argument("--cpus-per-task", type=int, default=None, metavar="C",
                   help="CPU cores each task gets (sbatch --cpus-per-task)")
    s.add_argument("--cpu-devices", type=int, default=None, metavar="D",
                   help="virtual CPU devices per task (PODKIT_CPU_DEVICES), for CPU clusters")
    s.add_argument("--partition", default=None, metavar="P")
    s.add_argument("--time", default=None, metavar="T",
                   help="time limit (minutes, HH:MM:SS or D-HH:MM:SS); GRACE seconds "
                   "before it the tasks save and the job requeues")
    s.add_argument("--max-restarts", type=int, default=3, metavar="R",
                   help="requeues after a preemption, a failure or the time limit, counted "
                   "by SLURM_RESTART_COUNT (default 3)")
    s.add_argument("--grace", type=int, default=60, metavar="S",
                   help="seconds before --time ends at which the tasks get SIGTERM (default "
                   "60); on preemption the partition's GraceTime applies")
    s.add_argument("--min-processes", type=int, default=None, metavar="K",
                   help="elastic: start on as few nodes as K tasks need when SLURM cannot give "
                   "all (#SBATCH --nodes=MIN-MAX), with the same global batch (default: all)")
    s.add_argument("--run-dir", default=None, metavar="DIR",
                   help="with -- COMMAND: where the script and job.log go (default "
                   "runs/<script name>)")
    s.add_argument("--sbatch", action="append", default=[], metavar="KEY=VALUE",
                   help="another #SBATCH option (repeatable), e.g. --sbatch account=ml")
    s.add_argument("--dry-run", action="store_true",
                   help="print the script; write and submit nothing")

    k = engines.add_parser(
        "k8s", help="write Kubernetes manifests: a JobSet for TPU slices, an indexed Job "
        "for CPU pods",
        description="Write the manifests (ConfigMap with the resolved config, then a JobSet "
        "as xpk makes for TPU slices or a Service + indexed Job for CPU pods) and print the "
        "kubectl command that applies them; --apply runs it.")
    k.add_argument("config", nargs="?", default=None,
                   help="a TOML config (or give a command after --)")
    k.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    k.add_argument("--image", default=None, metavar="IMAGE",
                   help="a container image with podkit installed (required)")
    k.add_argument("--tpu", default=None, metavar="TYPE-TOPOLOGY",
                   help="a TPU slice: v4, v5e, v5p or v6e and its chip grid, e.g. v5p-2x2x4")
    k.add_argument("--slices", type=int, default=None, metavar="N",
                   help="TPU slices (multislice over the data-center network); default the "
                        "config's [strategy] slices, which the run's mesh is built with")
    k.add_argument("--cpu-pods", type=int, default=None, metavar="N",
                   help="N pods on CPU nodes instead of a TPU slice")
    k.add_argument("--cpu-devices", type=int, default=None, metavar="D",
                   help="virtual CPU devices per CPU pod")
    k.add_argument("--max-restarts", type=int, default=3, metavar="R",
                   help="restarts after failures (preemptions do not count; default 3)")
    k.add_argument("--min-processes", type=int, default=None, metavar="K",
                   help="refused below the job's process count: a JobSet or indexed Job "
                   "restarts at its own size (use podkit launch or SLURM for elastic jobs)")
    k.add_argument("--checkpoint-dir", default=None, metavar="URL",
                   help="checkpoints where a recreated pod finds them: gs://BUCKET/RUN")
    k.add_argument("--name", default=None, help="the JobSet/Job name (default: run.name)")
    k.add_argument("--namespace", default=None)
    k.add_argument("--service-account", default=None, metavar="NAME",
                   help="the pods' Kubernetes service account (Workload Identity: the one "
                   "allowed to write --checkpoint-dir's bucket)")
    k.add_argument("--grace", type=int, default=60, metavar="S",
                   help="terminationGracePeriodSeconds (default 60)")
    k.add_argument("--out", default=None, metavar="FILE",
                   help="where to write (default RUN_NAME.k8s.yaml in this directory)")
    given = k.add_mutually_exclusive_group()
    given.add_argument("--dry-run", action="store_true", help="print the manifests only")
    given.add_argument("--apply", action="store_true",
                       help="kubectl apply them (kubectl must be on PATH)")


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`podkit submit ... -- CMD...`: (podkit's flags, CMD) — cut before argparse, which
    would take CMD's first word for the optional CONFIG."""
    if "submit" in argv and "--" in argv[argv.index("submit"):]:
        cut = argv.index("--", argv.index("submit"))
        return argv[:cut], argv[cut + 1:]
    return argv, []


def run(args: argparse.Namespace, command: list[str]) -> int:
    """Run `podkit submit` for parsed flags; PodkitErrors propagate to the CLI."""
    if args.engine == "slurm":
        job = SlurmJob(config=args.config, sets=args.set, command=command, nodes=args.nodes,
                       tasks_per_node=args.tasks_per_node, cpus_per_task=args.cpus_per_task,
                       cpu_devices=args.cpu_devices, partition=args.partition, time=args.time,
                       max_restarts=args.max_restarts, grace=args.grace, run_dir=args.run_dir,
                       sbatch_options=args.sbatch, min_processes=args.min_processes)
        if args.dry_run:  # written nowhere: a queued job of this run reads those files
            print(job.script(), end="")
            return 0
        script = job.write()
        job_id = job.submit(script)
        here = script.parent
        print(f"submitted SLURM job {job_id}: {script}\n"
              f"  output: {here}/job-{job_id}.out\n"
              f"  what happened (starts, preemptions, requeues): {here}/job.log\n"
              f"  watch it: squeue -j {job_id}; stop it: scancel {job_id}")
        return 0
    slices, sets = _slices(args)
    job = K8sJob(image=args.image or "", config=args.config, sets=sets, command=command,
                 tpu=args.tpu, slices=slices, cpu_pods=args.cpu_pods,
                 cpu_devices=args.cpu_devices, max_restarts=args.max_restarts,
                 checkpoint_dir=args.checkpoint_dir, name=args.name,
                 namespace=args.namespace, grace=args.grace,
                 service_account=args.service_account, min_processes=args.min_processes)
    text = job.yaml()
    if args.dry_run:
        if args.out:
            raise ConfigError("--dry-run prints the manifests and writes nothing; drop --out, "
                              "or drop --dry-run to write them to --out.")
        print(text, end="")
        return 0
    out = Path(args.out or f"{job.manifests()[-1]['metadata']['name']}.k8s.yaml")
    if out.is_dir() or not out.parent.is_dir():
        why = "is a directory" if out.is_dir() else "its folder does not exist"
        raise ConfigError(f"--out {args.out}: {why}; pass a file name in an existing folder, "
                          "e.g. --out job.k8s.yaml.")
    out.write_text(text)
    if args.apply:
        print(job.apply(out), end="")
        return 0
    print(f"wrote {out}; apply it with: kubectl apply -f {out}")
    return 0


def _slices(args: argparse.Namespace) -> tuple[int, list[str]]:
    """The job's TPU slices and the config's overrides: one setting for both. The config's
    `[strategy] slices` (the run's `dcn` mesh axis) is the default of --slices; --slices N
    with a config of one slice sets it there too; two different counts are an error."""
    sets = list(args.set)
    if not args.config:
        return (1 if args.slices is None else args.slices), sets
    from podkit import config as config_lib

    configured = config_lib.load(args.config, sets).strategy.slices
    if args.slices is None or args.slices == configured:
        return configured, sets
    if configured != 1:
        raise ConfigError(f"--slices {args.slices} but {args.config} has strategy.slices = "
                          f"{configured}: the job's slices are the mesh's dcn axis; give one "
                          "count (drop --slices, or --set strategy.slices=N).")
    return args.slices, [*sets, f"strategy.slices={args.slices}"]

