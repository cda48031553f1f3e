"""Host arrays -> global jax.Arrays, whatever the process count."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding

from podkit.errors import InputError


def to_global(local: Any, sharding: NamedSharding) -> Any:
    """Assemble a global jax.Array from this process's part (its rows of the batch dim)."""
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return jax.tree.map(lambda a: jax.make_array_from_process_local_data(sharding, a), local)


def from_host_copy(value: Any, sharding: NamedSharding) -> Any:
    """Place an array that every process holds whole (same values everywhere)."""
    if jax.process_count() == 1:
        return jax.device_put(value, sharding)
    return jax.tree.map(
        lambda a: jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx]), value)


def check_divisible(batch: int, devices: int) -> None:
    """A process's batch must split evenly over its data-parallel devices."""
    if batch % devices:
        raise InputError(
            f"a batch of {batch} examples is not divisible by the {devices} data-parallel "
            f"devices of this process; batch to a multiple of {devices}.")
