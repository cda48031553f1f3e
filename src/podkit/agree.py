"""Multi-process agreement: the few ways processes of one job come to the same answer.

Each helper is a collective: every process of the job must call it, in the same order, or the
ones that did wait for the others forever. With one process each is a no-op. They run on the
host (numpy values over JAX's multihost utilities), between compiled programs, never inside one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from podkit.errors import ConfigError, InputError

__all__ = ["all_true", "barrier", "coordination_client", "gather", "process0_decides",
           "raise_everywhere_if_any"]


def coordination_client() -> Any:
    """The coordination service's client of this process, for its key-value store (JAX keeps
    it in its distributed state; Orbax reads it the same way), or None in a single-process
    job. Unlike the helpers below, reading or writing its keys is no collective."""
    from jax._src import distributed

    return distributed.global_state.client


def raise_everywhere_if_any(check: Callable[[], None], what: str,
                            errors: tuple[type[BaseException], ...] = (InputError, ConfigError)
                            ) -> None:
    """Run `check` on every process; if it raised one of `errors` on any, raise on all.

    The process that found the problem raises its own error; the others raise an InputError
    saying that another process found `what` (so no process is left alone in a collective).
    """
    error = None
    try:
        check()
    except errors as e:
        error = e
    if jax.process_count() > 1 and not all_true(error is None) and error is None:
        raise InputError(f"another process found that {what} (see its error).")
    if error is not None:
        raise error


def all_true(ok: bool) -> bool:
    """True on every process when `ok` is true on every process."""
    if jax.process_count() == 1:
        return bool(ok)
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.asarray(bool(ok)))))


def process0_decides(value: Any) -> Any:
    """Process 0's value on every process: a Python bool, int or float comes back as one, a
    numpy array (or a sequence of numbers) as a numpy array of the same dtype."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    if isinstance(value, bool | np.bool_):
        return bool(multihost_utils.broadcast_one_to_all(np.asarray(value)))
    if isinstance(value, int | np.integer):
        return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int64)))
    if isinstance(value, float | np.floating):
        return float(multihost_utils.broadcast_one_to_all(np.asarray(value, np.float64)))
    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(value)))


def gather(array: jax.Array) -> np.ndarray:
    """An array's whole value on this host (gathered across processes when it is not fully
    addressable here)."""
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def barrier(name: str) -> None:
    """Wait until every process has reached the barrier called `name`."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
