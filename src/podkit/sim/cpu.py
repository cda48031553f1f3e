"""This machine as a pod (the `cpu` chip): devices that share its cores, and collectives
that XLA:CPU runs one operand at a time, over gloo between processes.

A `cpu:PxD` job is P processes of D virtual devices on this machine. Three facts make its
step differ from a TPU's or a GPU's, each measured by bench/sim_calibrate.py (cpu, fit-cpu)
and written to calibration.toml:

- Shared cores. All P x D devices run on the machine's cores. XLA:CPU spreads one device's
  step over the cores it may use (its thread pool), but not all of it: `parallel` of the
  step spreads, the rest runs on one core (Amdahl). The chip's peak and copy rate are one
  core's; a device runs at `speedup` of them. Measured on 2 cores: the small GPT step takes
  258.6 ms on one core and 135.3 ms on both (parallel 0.954); 2 devices take 110.5 ms and 4
  take 131.3 (with their collectives).
- One collective per operand. XLA combines a step's gradient all-reduces into one op of
  many arrays (a tuple); XLA:CPU runs it as one collective per array, each paying the
  latency. Measured: 10.6 MB between 2 processes, 10.6 ms as one array and 41.4 ms as 31
  (the small GPT's gradients; 2 processes x 2 devices: 65.9 ms). A TPU or NCCL moves the
  tuple as one.
- Measured collectives. Between processes, gloo's latency depends on how many processes and
  threads share the cores (an all-reduce's: 0.98 ms for 2 processes on 2 cores, 4.2 ms for
  4), and its bandwidth on whether the message stays in the last-level cache. So each job
  shape measured has, for each kind, its own latency, in-cache bandwidth and beyond-cache
  bandwidth: `[collectives.CHIP]` tables of the hardware files (calibration.toml, then
  $PODKIT_SIM_HARDWARE's; format and checks: `hardware.measured_collectives`). They price a
  collective over all of a measured shape's devices; one over part of them, an unmeasured
  kind or shape, uses the chip's tiers.
"""

from __future__ import annotations

import dataclasses
import functools
import os

from podkit.sim import collectives as coll
from podkit.sim import hardware as hw
from podkit.sim.hardware import Pod


@dataclasses.dataclass(frozen=True)
class Measured:
    """One collective kind on one job shape: seconds = latency + bytes / bandwidth, with
    `beyond_cache_bandwidth` for messages larger than the machine's last-level cache."""

    latency: float
    bandwidth: float
    beyond_cache_bandwidth: float
    cache_bytes: float

    def seconds(self, nbytes: float) -> float:
        bw = self.bandwidth if nbytes <= self.cache_bytes else self.beyond_cache_bandwidth
        return self.latency + nbytes / bw


def cores() -> int:
    """The cores this process may run on (what XLA:CPU sizes its thread pool by)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def speedup(devices: int, ncores: int, parallel: float) -> float:
    """One device's rate over one core's when `devices` share `ncores` cores: with c = cores
    per device, 1 / ((1 - parallel) + parallel / c) while c >= 1 (Amdahl), c below (the
    devices take turns on the cores)."""
    c = ncores / max(devices, 1)
    if c < 1:
        return c
    return 1 / ((1 - parallel) + parallel / c)


def measured(pod: Pod, kind: str) -> Measured | None:
    """The measured terms of `kind` on `pod`'s job shape (processes x devices): the
    `[collectives.CHIP]` table of its chip, if calibration measured that shape (a later
    hardware file's over an earlier's)."""
    if pod.chip.family != "cpu":
        return None
    shape = "x".join(str(s) for s in pod.shape)
    found = None
    for path in hw.catalog_files():
        shapes, cache = _tables(*hw.file_version(path)).get(pod.chip.name, ({}, 0.0))
        terms = shapes.get(shape, {}).get(kind)
        if terms is not None:
            found = Measured(**terms, cache_bytes=cache)
    return found


def collective_seconds(kind: str, nbytes: float, operands: int, group: coll.Group, pod: Pod,
                       link: float = 1.0) -> float:
    """One collective of `operands` arrays, `nbytes` in all, over `group` on a cpu `pod`:
    each array its own collective (its own latency). Over every device of a measured shape,
    the measured terms; over part of them, or an unmeasured kind or shape, the chip's tiers
    (their bandwidth at `link` of the spec)."""
    m = measured(pod, kind) if group.size == pod.chips else None
    if m is not None:
        return operands * m.seconds(nbytes / operands)
    cost = coll.collective_time(kind, nbytes, group)
    return operands * cost.latency_s + cost.bandwidth_s / link


@functools.lru_cache(maxsize=8)
def _tables(path: str, mtime_ns: int, size: int
            ) -> dict[str, tuple[dict[str, dict[str, dict[str, float]]], float]]:
    """One hardware file's [collectives.CHIP] tables, checked (hw.measured_collectives)."""
    return hw.measured_collectives(hw.read_file(path), path)
