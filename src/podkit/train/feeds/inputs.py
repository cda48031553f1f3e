"""What an execution hands the compiled step: one of two registered pytree dataclasses, chosen
by the feed and told apart by type in podkit.train.step (never by probing keys).

k is the leading dim (the steps of the execution), B the global batch:
  * `BatchInputs`   fed batches: x, y (k, B, ...), sample weights and mask (k, B)
  * `StagedInputs`  the whole dataset lives on the devices (`data`: {"x", "y"[, "sw"]}) and
                    each step gathers its rows there by `idx` (k, B) row ids; a negative id
                    -(r + 1) is padding that repeats real row r
`mask` is 1 for real examples and 0 for padding; `sw` is sample_weight x class_weight.

Both are pytrees of arrays only, so the jitted step is traced once per input spec, as it was
for the dicts they replace.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BatchInputs:
    """k batches cut on the host: every leaf is (k, B, ...)."""

    x: Any
    y: Any
    sw: Any
    mask: Any

    @property
    def steps(self) -> int:
        return self.mask.shape[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StagedInputs:
    """Row ids (k, B) into arrays already on the devices."""

    data: dict
    idx: Any

    @property
    def steps(self) -> int:
        return self.idx.shape[0]


StepInputs = BatchInputs | StagedInputs
