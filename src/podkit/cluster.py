"""connect(): join the devices of this job, once, and describe them as a Cluster.

Single process by default. Several processes are joined through JAX's own multi-controller
runtime (`jax.distributed.initialize`), from arguments, from PODKIT_* environment variables, from
a SLURM step's variables (`jobenv.py`), or from JAX's auto-detection on TPU VMs. podkit never
builds its own transport.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from typing import Any

import jax

from podkit import console, heartbeat, jobenv, termination
from podkit.errors import ConfigError, ConnectError

ENV_COORDINATOR = "PODKIT_COORDINATOR"
ENV_NUM_PROCESSES = "PODKIT_NUM_PROCESSES"
ENV_PROCESS_ID = "PODKIT_PROCESS_ID"
ENV_CPU_DEVICES = "PODKIT_CPU_DEVICES"

_CLUSTER: Cluster | None = None
_REQUEST: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The devices and processes of this job, as seen from this process."""

    platform: str
    devices: tuple[Any, ...]
    local_devices: tuple[Any, ...]
    process_index: int
    process_count: int
    coordinator: str | None

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def __str__(self) -> str:
        kind = self.devices[0].device_kind if self.devices else "?"
        where = (
            f"joined through coordinator {self.coordinator}"
            if self.coordinator
            else "a single-process job"
        )
        return (
            f"Cluster: {self.device_count} {self.platform} device(s) ({kind}) across "
            f"{self.process_count} process(es), {where}; this is process {self.process_index} "
            f"with {len(self.local_devices)} local device(s) "
            f"[{', '.join(str(d.id) for d in self.local_devices)}]."
        )


def _backends_started() -> bool:
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer; set it to a whole number.") from None


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Fail fast and clearly when a non-zero process cannot reach the coordinator.

    JAX's own client retries for `initialization_timeout` and, in some versions, aborts the
    process instead of raising. Probing the socket first turns that into a named error.
    """
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError as e:  # refused or unreachable: the coordinator is not up (yet)
            last = e
            time.sleep(0.2)
    raise ConnectError(
        f"coordinator {address} did not answer within timeout_s={timeout_s:g}s ({last}). "
        "Fix: start process 0 (it hosts the coordinator) with the same address, check "
        f"{ENV_COORDINATOR}/coordinator= is host:port reachable from this process, or raise "
        "timeout_s."
    )


def _parse_coordinator(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"coordinator={address!r} is not host:port; pass e.g. coordinator='10.0.0.1:1234'."
        )
    return address


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed: not a terminal
        return False


def connect(
    cpu_devices: int | None = None,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    timeout_s: float = 60,
) -> Cluster:
    """Join this job's devices and return the Cluster. Idempotent.

    Example::

        cluster = pk.connect(cpu_devices=8)   # 8 virtual CPU devices, one process
        cluster = pk.connect(coordinator="10.0.0.1:1234", num_processes=4, process_id=rank)
    """
    global _CLUSTER, _REQUEST
    # Under `podkit launch`: beat from a thread until a training loop takes over (start-up,
    # the distributed handshake and compilation are busy phases that must not look hung), and
    # write every thread's stack when the launcher asks (a hung process).
    heartbeat.arm()
    env_devices = _env_int(ENV_CPU_DEVICES)
    if cpu_devices is not None and env_devices is not None and cpu_devices != env_devices:
        # A launcher's per-process count and the script's own: neither may win in silence.
        raise ConfigError(
            f"connect(cpu_devices={cpu_devices}) disagrees with {ENV_CPU_DEVICES}={env_devices} "
            "(set by `podkit launch --cpu-devices-per-process`, `podkit submit` or the "
            "environment). Fix: drop cpu_devices= from the script and let the launcher decide, "
            f"or launch with {cpu_devices} devices per process."
        )
    cpu_devices = cpu_devices if cpu_devices is not None else env_devices
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    if num_processes is None and process_id is None and not _backends_started():
        job = jobenv.detect(coordinator)  # SLURM's variables, read in full (jobenv.py: why)
        if job is not None:
            coordinator, num_processes, process_id = (
                job.coordinator, job.num_processes, job.process_id)
    request = dict(
        cpu_devices=cpu_devices,
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
    )
    if _CLUSTER is not None:
        if request != _REQUEST and any(v is not None for v in request.values()):
            raise ConnectError(
                f"connect() was already called with {_REQUEST}; it cannot be called again with "
                f"{request}. Fix: call connect() once, before building strategies or models."
            )
        return _CLUSTER

    if cpu_devices is not None:
        if cpu_devices < 1:
            source = f" (from {ENV_CPU_DEVICES})" if env_devices == cpu_devices else ""
            raise ConfigError(f"cpu_devices={cpu_devices}{source} must be >= 1.")
        if _backends_started():
            have = jax.local_device_count() if jax.default_backend() == "cpu" else 0
            if have != cpu_devices:
                raise ConnectError(
                    f"cpu_devices={cpu_devices} was asked for after JAX's backend started "
                    f"with {have} CPU device(s). Fix: call pk.connect(cpu_devices=...) (or set "
                    f"{ENV_CPU_DEVICES}) before any JAX computation, array or jax.devices() call."
                )
        else:
            jax.config.update("jax_num_cpu_devices", cpu_devices)

    if coordinator is not None or num_processes not in (None, 1):
        if coordinator is None or num_processes is None or process_id is None:
            raise ConfigError(
                "a multi-process job needs coordinator, num_processes and process_id together "
                f"(got coordinator={coordinator!r}, num_processes={num_processes}, "
                f"process_id={process_id}). Fix: pass all three, or set {ENV_COORDINATOR}, "
                f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID}."
            )
        _parse_coordinator(coordinator)
        if not 0 <= process_id < num_processes:
            raise ConfigError(
                f"process_id={process_id} is outside [0, num_processes={num_processes})."
            )
        if _backends_started():
            raise ConnectError(
                "a multi-process connect() was asked for after JAX's backend started. Fix: call "
                "pk.connect(...) first thing in the program, before any JAX computation."
            )
        # CPU collectives across processes go through gloo; other platforms bring their own.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if not _is_terminal(sys.stdout):
            console.whole_lines()  # gloo's lines and print()'s, each whole (console.py: why)
        # JAX's preemption service takes SIGTERM and never ends the process; podkit answers
        # SIGTERM itself, with the same agreement inside fit() (podkit.termination).
        jax.config.update("jax_enable_preemption_service", False)
        if process_id != 0:
            _wait_for_coordinator(coordinator, timeout_s)
        try:
            jax.distributed.initialize(
                coordinator_address=coordinator,
                num_processes=num_processes,
                process_id=process_id,
                initialization_timeout=max(1, int(timeout_s)),
            )
        except Exception as e:  # XlaRuntimeError names only the RPC; add cause and fix.
            raise ConnectError(
                f"joining {num_processes} processes through {coordinator} as process "
                f"{process_id} failed within {timeout_s:g}s: {e}. Fix: start every process "
                "with the same coordinator and num_processes, each with its own process_id."
            ) from e
    elif not _backends_started() and jobenv.tpu_vm():  # JAX joins a TPU slice by itself
        jax.config.update("jax_enable_preemption_service", False)
        jax.distributed.initialize(initialization_timeout=max(1, int(timeout_s)))
        coordinator = "auto-detected"
    termination.install()  # after JAX's start-up, which may install a handler of its own

    _CLUSTER = Cluster(
        platform=jax.default_backend(),
        devices=tuple(jax.devices()),
        local_devices=tuple(jax.local_devices()),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        coordinator=coordinator,
    )
    _REQUEST = request
    return _CLUSTER


def current_cluster() -> Cluster:
    """The connected Cluster, connecting with defaults if nobody has yet."""
    return _CLUSTER if _CLUSTER is not None else connect()


def is_lead_process() -> bool:
    """Process 0 of the job: the one that writes shared files (run directory, saves)."""
    import jax

    return jax.process_index() == 0
