"""A real SLURM cluster on this machine for the tests: slurmctld and two slurmd daemons.

`SlurmCluster(tmp).start()` writes a slurm.conf into `tmp` and starts slurmctld and two
slurmd (`slurmd -N n1`, `-N n2`: two node names on one host, each with its own port, spool
and pid file), so a job spans two "nodes". No munge, no cgroups, no systemd: auth/none,
proctrack/linuxproc, task/none; every file lives under `tmp`, every port is a free one.
Partitions: `batch` (the default; preemptible, PreemptMode=REQUEUE, GraceTime 30 s) and
`urgent` (higher PriorityTier: a job there preempts batch jobs on the nodes it needs).

`stop()` cancels every job, stops the daemons and SIGKILLs whatever of the jobs is still
alive (found by this cluster's SLURM_CONF in the environment); it returns what it had to kill.

Where SLURM is missing, `require()` installs Debian's packages when running as root (`make
slurm` does the same), else skips naming the command.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

PACKAGES = ["slurmctld=22.05.8-4+deb12u3", "slurmd=22.05.8-4+deb12u3",
            "slurm-client=22.05.8-4+deb12u3"]
BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "sinfo")
INSTALL = ("apt-get update && apt-get install -y --no-install-recommends "
           + " ".join(PACKAGES))


def require() -> None:
    """SLURM's binaries on PATH: installed here when missing and root, else pytest.skip."""
    if all(shutil.which(b) for b in BINARIES):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        done = subprocess.run(["bash", "-c", INSTALL], capture_output=True, text=True,
                              env=env, timeout=900)
        if done.returncode == 0 and all(shutil.which(b) for b in BINARIES):
            return
        pytest.skip(f"SLURM could not be installed ({done.stderr.strip()[-300:]}); run "
                    f"`make slurm` or `{INSTALL}` as root")
    pytest.skip(f"SLURM is not installed; run `make slurm` or, as root, `{INSTALL}`")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


CONF = """\
ClusterName=podkit-test
SlurmctldHost=localhost
SlurmUser={user}
SlurmdUser={user}
SlurmctldPort={ctld}
AuthType=auth/none
CredType=cred/none
# A requeued job may start again cred_expire + 1 s after its requeue: 5 is SLURM's least.
AuthInfo=cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ReturnToService=2
JobRequeue=1
EnforcePartLimits=ALL
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
MinJobAge=600
# SIGTERM to SIGKILL: a task whose peer was killed waits on it in a collective until then.
KillWait=2
InactiveLimit=0
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n1} CPUs=2 RealMemory=4000
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n2} CPUs=2 RealMemory=4000
PartitionName=batch Nodes=n1,n2 Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=30 State=UP
PartitionName=urgent Nodes=n1,n2 PriorityTier=10 PreemptMode=OFF State=UP
"""


class SlurmCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.daemons: list[subprocess.Popen] = []

    def start(self, timeout: float = 60) -> SlurmCluster:
        for d in ("state", "spool/n1", "spool/n2", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        ctld, n1, n2 = _free_ports(3)
        self.conf.write_text(CONF.format(user=getpass.getuser(), ctld=ctld, n1=n1, n2=n2,
                                         root=self.root))
        # -D: in the foreground, children of this process (stopped by stop()); -i: ignore
        # any saved state (a fresh cluster).
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for node in ("n1", "n2"):
            self._daemon(["slurmd", "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # One line per node and partition: both nodes idle in both partitions.
            lines = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
            if set(lines.split("\n")) - {""} == {"n1 idle", "n2 idle"}:
                return self
            if any(p.poll() is not None for p in self.daemons):
                break
            time.sleep(0.5)
        logs = "\n".join(f"{p.name}: {p.read_text()[-1500:]}"
                         for p in sorted((self.root / "log").glob("*")))
        self.stop()
        raise RuntimeError(f"SLURM did not come up within {timeout} s:\n{logs}")

    def _daemon(self, cmd: list[str], name: str) -> None:
        out = open(self.root / "log" / f"{name}.stdout", "w")
        self.daemons.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                             env=self.env, start_new_session=True))

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, env=self.env,
                              check=check, timeout=120)

    def state(self, job: str) -> str:
        out = self.run("scontrol", "show", "job", job, check=False).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def wait(self, job: str, states: tuple[str, ...], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job)
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job} still {self.state(job)} after {timeout} s, not in "
                             f"{states}:\n{self.run('scontrol', 'show', 'job', job).stdout}")

    def job_processes(self) -> list:
        """Processes of this cluster's jobs: their environment names its slurm.conf."""
        import psutil

        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.pid != os.getpid() and \
                        proc.environ().get("SLURM_CONF") == str(self.conf) and \
                        "SLURM_JOB_ID" in proc.environ():
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def stop(self) -> list[str]:
        """Cancel the jobs, stop the daemons, kill what is left; returns what was killed."""
        self.run("scancel", "--user", getpass.getuser(), check=False)
        deadline = time.monotonic() + 15
        while self.job_processes() and time.monotonic() < deadline:
            time.sleep(0.3)
        for p in self.daemons:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.daemons:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        import psutil

        killed = []
        for proc in self.job_processes():
            try:
                killed.append(" ".join(proc.cmdline()[:4]))
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return killed
