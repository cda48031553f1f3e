"""`podkit launch`: the command line of the supervisor (see supervisor.py for the behaviour).

    podkit launch --processes N [--cpu-devices-per-process M] [--max-restarts R]
                  [--heartbeat-timeout S] [--exit-timeout E] [--min-processes K]
                  [--grow-after S] [--grace G] [--backoff B] [--backoff-reset S]
                  [--startup-timeout T] [--stop-timeout T] [--events FILE] [--all-output]
                  -- COMMAND...

`podkit.cli` adds the subcommand with `add_parser` and calls `run`; `python -m
podkit.launch.cli ...` runs the same without the rest of podkit's CLI (which imports JAX: the
launcher itself never needs it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from podkit.errors import ConfigError
from podkit.launch.options import LaunchConfig
from podkit.launch.supervisor import Supervisor


def add_parser(subparsers: Any) -> None:
    """Add the `launch` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "launch",
        help="run N processes of a command as one supervised job (restarts, preemption)",
        description="Start N processes of COMMAND on this machine, joined through PODKIT_* "
        "variables; restart the whole group when one fails or stops sending heartbeats; "
        "forward SIGTERM/SIGINT to every process as a preemption.",
    )
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="processes to start (required)")
    p.add_argument("--cpu-devices-per-process", type=int, default=None, metavar="M",
                   help="virtual CPU devices per process (sets PODKIT_CPU_DEVICES=M)")
    p.add_argument("--max-restarts", type=int, default=3, metavar="R",
                   help="restarts of the whole group before giving up (default 3); with "
                   "--min-processes below --processes, each process slot's: a slot that fails "
                   "more than R times is dropped")
    p.add_argument("--heartbeat-timeout", type=float, default=120.0, metavar="S",
                   help="a process that has beaten once and then not for S seconds is hung "
                   "(default 120)")
    p.add_argument("--exit-timeout", type=float, default=300.0, metavar="E",
                   help="a process still running E seconds after its last loop (fit, "
                   "evaluate, predict) ended is hung: the work after training must end "
                   "(default 300)")
    p.add_argument("--min-processes", type=int, default=None, metavar="K",
                   help="elastic: drop a process slot that fails more than --max-restarts "
                   "times and go on with the others, down to K processes, with the same "
                   "global batch (default: N, never)")
    p.add_argument("--grow-after", type=float, default=600.0, metavar="S",
                   help="after S seconds of training on fewer processes, stop the job with a "
                   "checkpoint and try all N again (default 600; 0: never)")
    p.add_argument("--grace", type=float, default=60.0, metavar="G",
                   help="seconds processes get to exit after a forwarded SIGTERM (default 60)")
    p.add_argument("--backoff", type=float, default=1.0, metavar="B",
                   help="seconds before the first restart, doubling each time, at most 30 "
                   "(default 1)")
    p.add_argument("--backoff-reset", type=float, default=600.0, metavar="S",
                   help="an attempt that ran S seconds before it failed restarts after "
                   "--backoff again, not after the doubled wait (default 600, as Kubernetes "
                   "resets its crash-loop back-off after 10 minutes of running)")
    p.add_argument("--startup-timeout", type=float, default=None, metavar="T",
                   help="fail a process that sent no first heartbeat within T seconds "
                   "(default: no bound)")
    p.add_argument("--stop-timeout", type=float, default=5.0, metavar="T",
                   help="after a failure, seconds between SIGTERM and SIGKILL to the others "
                   "(default 5)")
    p.add_argument("--events", default=None, metavar="FILE",
                   help="write start/failure/restart/reshard/preempt/exit events as JSON lines")
    p.add_argument("--all-output", action="store_true",
                   help="show every process's stdout and library noise such as gloo's "
                   "\"[Gloo] Rank N is connected to M peer ranks\" lines (default: only "
                   "process 0's stdout is shown, with the noise dropped; every process's "
                   "stderr is always shown); each line is prefixed with [i]")
    # Not dest="command": podkit's own parser keeps the subcommand's name there.
    p.add_argument("launch_command", nargs=argparse.REMAINDER, metavar="-- COMMAND...",
                   help="the command every process runs")


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """The LaunchConfig for parsed flags (validated)."""
    command = list(args.launch_command)
    if command[:1] == ["--"]:  # argparse keeps the separator in front of REMAINDER
        command = command[1:]
    if args.processes is None:
        raise ConfigError("--processes is required; pass the number of processes to start, "
                          "e.g. `podkit launch --processes 2 -- python train.py`.")
    config = LaunchConfig(
        command=command,
        processes=args.processes,
        cpu_devices_per_process=args.cpu_devices_per_process,
        max_restarts=args.max_restarts,
        heartbeat_timeout=args.heartbeat_timeout,
        exit_timeout=args.exit_timeout,
        min_processes=args.min_processes,
        grow_after=args.grow_after,
        grace=args.grace,
        backoff=args.backoff,
        backoff_reset=args.backoff_reset,
        startup_timeout=args.startup_timeout,
        stop_timeout=args.stop_timeout,
        events_file=args.events,
        all_output=args.all_output,
    )
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    """Run `podkit launch` for parsed flags; returns the exit code (2: bad flags)."""
    try:
        config = config_from_args(args)
    except ConfigError as e:
        print(f"podkit: error: {e}", file=sys.stderr)
        return 2
    return Supervisor(config).run()


def main(argv: list[str] | None = None) -> int:
    """`python -m podkit.launch.cli --processes N -- COMMAND...`"""
    parser = argparse.ArgumentParser(prog="podkit")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return run(parser.parse_args(["launch", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
