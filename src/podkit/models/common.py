"""What the models in podkit.models share: compute precision and rematerialization policies.

    dtypes("mixed_bfloat16") -> (bfloat16, float32)   compute in bf16, float32 master weights
    remat_policy("dots_saveable")                      what `jax.checkpoint` keeps for backward
    rematerialize(fn, "full")                          fn under nnx.remat ("none": fn itself)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError

_PRECISIONS = {"float32": (jnp.float32, jnp.float32),
               "mixed_bfloat16": (jnp.bfloat16, jnp.float32)}

# "full": keep nothing (recompute the whole block in the backward pass: least memory);
# "dots_saveable": keep matmul (and convolution) outputs, recompute the cheap elementwise ops
# in between.
_POLICIES: dict[str, Callable[..., Any] | None] = {
    "full": None,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}


def dtypes(precision: str) -> tuple[Any, Any]:
    """(compute dtype, parameter dtype) of a precision name."""
    if precision not in _PRECISIONS:
        raise ConfigError(f"precision = {precision!r}; valid: {', '.join(_PRECISIONS)}.")
    return _PRECISIONS[precision]


def remat_policy(name: str) -> Callable[..., Any] | None:
    """The `jax.checkpoint` policy of a remat name (None: save nothing)."""
    if name not in _POLICIES:
        raise ConfigError(f"remat = {name!r}; valid: none, {', '.join(_POLICIES)}.")
    return _POLICIES[name]


def rematerialize(fn: Callable[..., Any], remat: str) -> Callable[..., Any]:
    """`fn` (taking modules and arrays, e.g. `lambda block, x: block(x)`) recomputed in the
    backward pass under the named policy; `fn` itself for "none". nnx.remat lifts the module
    arguments, so state a call writes (BatchNorm statistics) still comes out."""
    if remat == "none":
        return fn
    return nnx.remat(fn, policy=remat_policy(remat))
