"""Where this process sits in a scheduler's job, read from the scheduler's environment.

`connect()` asks `detect()` when no PODKIT_* variables or arguments say how to join. SLURM is
read here rather than left to JAX's own detection (`jax._src.clusters.SlurmCluster`) because
JAX takes the coordinator's host from the node list by cutting the string at the first `[`,
`,` or `-`: `rack[1-2]-gpu[01-08]` gives `rack1`, not `rack1-gpu01`, and a node name that DNS
does not know (SLURM's NodeName beside a NodeAddr) gives an address nobody can reach. The
hostlist is expanded in full here, as SLURM itself (`scontrol show hostnames`) and Levanter do,
and a name that does not resolve is looked up as SLURM's NodeAddr. The port is JAX's (one per
job id in 61440..65535), so every task of a job, and the requeued job, agree on it without a
word.

    env = jobenv.detect()   # JobEnv(coordinator="10.0.0.5:61452", num_processes=4,
                            #        process_id=1, source="SLURM job 12 on n[1-2]") or None

Kubernetes and TPU VMs need nothing here: podkit's manifests (`podkit submit k8s`) set the
PODKIT_* variables for CPU pods, and on TPU slices JAX reads TPU_WORKER_HOSTNAMES itself.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import socket
import subprocess
import time
import warnings

from podkit.errors import ConfigError, ConnectError, user_stacklevel

SLURM_PORT_BASE = 65535 - 2**12 + 1  # JAX's: the job id modulo 4096 above it
ENV_PREEMPTED_EXIT = "PODKIT_PREEMPTED_EXIT_CODE"
"""The exit status of a process that wrote its final checkpoint on a preemption (default 0)."""
ENV_EVENTS = "PODKIT_JOB_EVENTS"
"""A JSON-lines file a scheduler's job script reads after its step ends: the training records
there what the exit status cannot say (preempted at step S: it exits 0 either way)."""


@dataclasses.dataclass(frozen=True)
class JobEnv:
    """How this process joins its job: what `jax.distributed.initialize` takes."""

    coordinator: str  # host:port of process 0
    num_processes: int
    process_id: int
    source: str  # where it was read, for messages


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed host list, in full and in order.

        expand_hostlist("n[1-3],gpu[08-09]-ib,login")
        # ['n1', 'n2', 'n3', 'gpu08-ib', 'gpu09-ib', 'login']

    Ranges keep their zero padding; several bracket groups in one name give every
    combination (`r[1-2]-n[1-2]`: r1-n1, r1-n2, r2-n1, r2-n2, as SLURM orders them).
    """
    names: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        if not item:
            continue
        parts = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for part in parts:
            if part.startswith("["):
                choices.append(_expand_ranges(part[1:-1], hostlist))
            elif "[" in part or "]" in part:
                raise ConfigError(f"host list {hostlist!r} has an unbalanced bracket in "
                                  f"{item!r}; SLURM writes ranges as name[1-4,7].")
            else:
                choices.append([part])
        names.extend("".join(combo) for combo in itertools.product(*choices))
    if not names:
        raise ConfigError(f"host list {hostlist!r} names no host.")
    return names


def _split_top_level(hostlist: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    items.append(hostlist[start:])
    return items


def _expand_ranges(ranges: str, hostlist: str) -> list[str]:
    out = []
    for piece in ranges.split(","):
        lo, dash, hi = piece.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ConfigError(f"host list {hostlist!r}: [{ranges}] is not a range list such "
                              "as [1-4,7] or [01-16].")
        if not dash:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ConfigError(f"host list {hostlist!r}: range {piece} runs backwards.")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


FIX_COORDINATOR = ("Fix: export PODKIT_COORDINATOR=HOST:PORT (process 0's address, any "
                   "free port) in the job script before srun; the tasks then take only their "
                   "count and rank from SLURM.")


def _resolve(node: str) -> str:
    """An address for a SLURM node name: DNS first, then SLURM's own NodeAddr."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except OSError:
        pass
    try:
        done = subprocess.run(["scontrol", "show", "node", node], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConnectError(f"SLURM node {node!r} (process 0's) is not known to DNS, and "
                           f"`scontrol show node {node}` could not run ({e}). "
                           f"{FIX_COORDINATOR}") from None
    found = re.search(r"\bNodeAddr=(\S+)", done.stdout)
    if done.returncode != 0 or not found:
        said = done.stderr.strip() or "no NodeAddr in its answer"
        raise ConnectError(f"SLURM node {node!r} (process 0's) is not known to DNS, and "
                           f"`scontrol show node {node}` gave no address ({said}). "
                           f"{FIX_COORDINATOR}")
    return found.group(1)


def slurm(coordinator: str | None = None) -> JobEnv | None:
    """This task's place in a SLURM job step of more than one task, or None. `coordinator`
    (PODKIT_COORDINATOR), when given, is process 0's address instead of its node's."""
    env = os.environ
    # The step's task count, set by srun only. SLURM_NTASKS is the allocation's, and a batch
    # script's own shell has it (with SLURM_PROCID=0) too: read there, process "0 of 4"
    # would wait forever for three processes nobody started.
    tasks = env.get("SLURM_STEP_NUM_TASKS")
    allocated = env.get("SLURM_NTASKS", "")
    if tasks is None and allocated.isdigit() and int(allocated) > 1 and "SLURM_JOB_ID" in env:
        warnings.warn(f"SLURM job {env['SLURM_JOB_ID']} has {allocated} tasks, but this "
                      "process is not in an srun step: it runs alone. Start it with srun "
                      "(`srun podkit train ...`, or `podkit submit slurm`) to use every task.",
                      stacklevel=user_stacklevel())
        return None
    if not tasks or not tasks.isdigit() or int(tasks) < 2 or "SLURM_PROCID" not in env:
        return None  # not under srun, or one task: nothing to join
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    job = env.get("SLURM_JOB_ID", "")
    if not nodes or not job.isdigit():
        raise ConnectError(f"a SLURM step of {tasks} tasks without SLURM_STEP_NODELIST or "
                           "SLURM_JOB_ID; run the tasks with srun inside an allocation.")
    if coordinator is None:
        first = expand_hostlist(nodes)[0]  # srun's block distribution: task 0 on node one
        coordinator = f"{_resolve(first)}:{SLURM_PORT_BASE + int(job) % 2**12}"
    return JobEnv(coordinator=coordinator, num_processes=int(tasks),
                  process_id=int(env["SLURM_PROCID"]),
                  source=f"SLURM job {job} on {nodes}")


def tpu_vm() -> bool:
    """A TPU slice of several hosts, which JAX joins by itself (TPU_WORKER_HOSTNAMES)."""
    return bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))


def detect(coordinator: str | None = None) -> JobEnv | None:
    """The job this process belongs to, from a scheduler's variables (SLURM), or None."""
    return slurm(coordinator)


def record(event: str, **fields: object) -> None:
    """Append one event to $PODKIT_JOB_EVENTS, when the job script set it (else nothing).

    One `write` of one line on a file opened for appending: lines of several processes do not
    interleave."""
    path = os.environ.get(ENV_EVENTS)
    if not path:
        return
    line = json.dumps({"event": event, "time": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def preempted_exit_code() -> int:
    """$PODKIT_PREEMPTED_EXIT_CODE, or 0: what a preempted process exits with."""
    raw = os.environ.get(ENV_PREEMPTED_EXIT, "0") or "0"
    if not raw.isdigit() or int(raw) > 255:
        raise ConfigError(f"{ENV_PREEMPTED_EXIT}={raw!r} is not an exit status; set 0..255.")
    return int(raw)
