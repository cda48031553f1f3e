"""Where a fit() continues after a checkpoint."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ResumeAt:
    """Where a resumed fit() continues: `steps_in_epoch` steps into `epoch`, and each saving
    process's data state (None where the input needs none)."""

    epoch: int
    steps_in_epoch: int
    data_states: tuple = ()
