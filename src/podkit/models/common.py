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

# The names a transformer block gives its matmul outputs (`jax.ad_checkpoint.checkpoint_name`),
# MaxText's: the q/k/v projection, attention's output projection, the MLP's two matmuls.
QKV_PROJ, OUT_PROJ, MLP_IN, MLP_OUT = "qkv_proj", "out_proj", "mlpwi", "mlpwo"

# "full": keep nothing (recompute the whole block in the backward pass: least memory);
# "dots_saveable": keep matmul (and convolution) outputs, recompute the cheap elementwise ops
# in between.
_POLICIES: dict[str, Callable[..., Any] | None] = {
    "full": None,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}
# MaxText's presets, for models whose blocks name their checkpoint points (the GPT):
# "minimal" keeps every named projection (recomputes attention itself and the elementwise
# ops), "save_qkv_proj" only the q/k/v projection.
_NAMED_POLICIES: dict[str, Callable[..., Any]] = {
    "minimal": jax.checkpoint_policies.save_only_these_names(QKV_PROJ, OUT_PROJ, MLP_IN,
                                                             MLP_OUT),
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(QKV_PROJ),
}


def dtypes(precision: str) -> tuple[Any, Any]:
    """(compute dtype, parameter dtype) of a precision name."""
    if precision not in _PRECISIONS:
        raise ConfigError(f"precision = {precision!r}; valid: {', '.join(_PRECISIONS)}.")
    return _PRECISIONS[precision]


def remat_policy(name: str, named: bool = False) -> Callable[..., Any] | None:
    """The `jax.checkpoint` policy of a remat name (None: save nothing). `named`: the model
    names its checkpoint points, so MaxText's presets ("minimal", "save_qkv_proj") apply."""
    policies = {**_POLICIES, **_NAMED_POLICIES} if named else _POLICIES
    if name not in policies:
        extra = "" if named or name not in _NAMED_POLICIES else (
            f" ({name!r} needs a model whose blocks name their checkpoint points, as the GPT)")
        raise ConfigError(f"remat = {name!r}; valid: none, {', '.join(policies)}.{extra}")
    return policies[name]


def rematerialize(fn: Callable[..., Any], remat: str, named: bool = False,
                  prevent_cse: bool = True) -> Callable[..., Any]:
    """`fn` (taking modules and arrays, e.g. `lambda block, x: block(x)`) recomputed in the
    backward pass under the named policy; `fn` itself for "none". nnx.remat lifts the module
    arguments, so state a call writes (BatchNorm statistics) still comes out. Under a scan,
    pass prevent_cse=False (the scan already keeps XLA from merging the recomputation away)."""
    if remat == "none":
        return fn
    return nnx.remat(fn, policy=remat_policy(remat, named), prevent_cse=prevent_cse)
