"""Elastic resume: the same global batch on fewer processes than the run was set for.

`podkit launch --min-processes K` (and a SLURM job of `--nodes=K-N`) may restart a run on fewer
processes than it was written for; the launcher says how many in PODKIT_MAX_PROCESSES. The
run's config sets the global batch (`data.batch_size`) and `train.microbatches` for the full
count: each device then computes `batch / (microbatches x data-parallel size)` examples at a
time, which is what its memory was sized for. On fewer processes the data-parallel size is
smaller, so that part would grow. `plan` keeps it: the global batch, the data order (counted
in global batches) and the learning-rate schedule (counted in optimizer steps) are unchanged,
and `train.microbatches` grows instead (gradient accumulation is exact: the parts' gradients
add up to the whole batch's): the smallest count that divides the batch over the devices into
parts no larger than the full count's (one always exists when the batch divides over the
devices: parts of one example). Where the batch does not divide over the devices at all, the
run cannot go on with the same batch: a ConfigError names the counts. Back at the full count
the user's own `train.microbatches` applies again (the config is read anew at every start).
"""

from __future__ import annotations

import dataclasses
import os

from podkit.errors import ConfigError

ENV_MAX_PROCESSES = "PODKIT_MAX_PROCESSES"  # set by podkit launch and the SLURM job script


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a run lays its global batch out on this start's processes."""

    batch: int  # the global batch (data.batch_size)
    processes: int  # this start's
    full: int  # the count the config was set for (PODKIT_MAX_PROCESSES)
    data_parallel: int  # this start's data-parallel size (the batch's shards)
    full_data_parallel: int
    microbatches: int  # the config's
    chosen: int  # what this start uses

    @property
    def part(self) -> float:
        """Examples per device per microbatch on this start."""
        return self.batch / (self.chosen * self.data_parallel)

    @property
    def full_part(self) -> float:
        """Examples per device per microbatch at the full count (what the user set)."""
        return self.batch / (self.microbatches * self.full_data_parallel)

    @property
    def shrunk(self) -> bool:
        return self.processes < self.full

    def note(self) -> str | None:
        """The log line of a shrunk start, None at the full count."""
        if not self.shrunk:
            return None
        where = (f"{self.processes} of {self.full} processes (data-parallel size "
                 f"{self.data_parallel}, {self.full_data_parallel} at the full count)")
        if self.chosen == self.microbatches:
            return (f"elastic: {where}: the global batch {self.batch} stays, train.microbatches "
                    f"stays {self.microbatches}: each device takes {self.part:g} examples at a "
                    f"time ({self.full_part:g} at the full count)")
        return (f"elastic: {where}: the global batch {self.batch} stays, train.microbatches "
                f"{self.microbatches} -> {self.chosen}, so that each device takes "
                f"{self.part:g} examples at a time ({self.full_part:g} at the full count); "
                "the data position and the learning-rate schedule are the run's (counted in "
                "global batches and optimizer steps)")

    def record(self) -> dict:
        """What the run's records keep of it (fits.jsonl)."""
        return {"processes": self.processes, "full": self.full, "batch": self.batch,
                "data_parallel": self.data_parallel, "microbatches": self.microbatches,
                "chosen": self.chosen, "note": self.note()}


def full_processes(processes: int) -> int:
    """The count the run was set for: PODKIT_MAX_PROCESSES, else this start's."""
    text = os.environ.get(ENV_MAX_PROCESSES, "")
    try:
        full = int(text)
    except ValueError:
        return processes
    return max(full, processes)


def plan(batch: int, microbatches: int, data_parallel: int, processes: int,
         full: int) -> Plan:
    """The microbatches that keep each device's part of the global batch `batch` at or below
    the full count's (see the module docstring). Every process of a job has the same devices,
    so the data-parallel size scales with the process count."""
    full_dp = data_parallel * full // processes
    base = Plan(batch, processes, full, data_parallel, full_dp, microbatches, microbatches)
    if full <= processes:
        return base
    dividing = [m for m in range(microbatches, batch + 1) if batch % (m * data_parallel) == 0]
    if not dividing:
        raise ConfigError(
            f"elastic: on {processes} of {full} processes the data-parallel size is "
            f"{data_parallel}, and the global batch data.batch_size = {batch} does not divide "
            f"over it, so the run cannot go on with the same batch. Fix: a batch size that "
            f"divides over every process count --min-processes allows (a multiple of "
            f"{data_parallel}), or a --min-processes that keeps one.")
    keeps = [m for m in dividing if batch / (m * data_parallel) <= base.full_part]
    return dataclasses.replace(base, chosen=(keeps or dividing)[0])
