"""`DataPosition`: how far a fit() has read its input, the one type the feeds report it in,
the loop carries and checkpoints store."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from podkit.errors import ConfigError


@dataclasses.dataclass(frozen=True, slots=True)
class DataPosition:
    """`execution` executions (`steps_in_epoch` steps of data) into `epoch`, and this
    process's input iterator state there.

    `iterator` is a pk.data iterator's `get_state()`, taken right after the execution's
    batches; None where the input needs none (the order of arrays and in-memory datasets is a
    function of the seed and the epoch, so they resume on any device or process count).
    `steps_in_epoch` counts the data taken, which after a rollback is more than the steps
    trained (skipped executions take data too).

    A checkpoint keeps it in two places, as it always has: `stored()` in the meta record
    (process 0's, `{"epoch", "execution", "steps_in_epoch"}`) and `iterator` in each process's
    manifest (`data_state`); `from_checkpoint` joins them again.
    """

    epoch: int = 0
    execution: int = 0
    steps_in_epoch: int = 0
    iterator: Any = None

    def stored(self) -> dict[str, int]:
        """The part every process shares, as a checkpoint's meta record holds it."""
        return {"epoch": self.epoch, "execution": self.execution,
                "steps_in_epoch": self.steps_in_epoch}

    @classmethod
    def from_checkpoint(cls, stored: Mapping[str, int],
                        iterators: Sequence[Any]) -> DataPosition:
        """This process's position from a checkpoint: its meta record's `stored()` and every
        saving process's iterator state (index = process)."""
        if any(s is not None for s in iterators) and len(iterators) != jax.process_count():
            raise ConfigError(
                f"the checkpoint holds the input positions of {len(iterators)} processes "
                f"and this job has {jax.process_count()}: a pk.data pipeline resumes on the "
                "same process count (arrays and in-memory datasets resume on any). Resume with "
                f"{len(iterators)} processes.")
        p = jax.process_index()
        return cls(stored["epoch"], stored["execution"], stored["steps_in_epoch"],
                   iterators[p] if p < len(iterators) else None)
