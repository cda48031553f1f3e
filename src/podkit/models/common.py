"""What the models in podkit.models share: compute precision, rematerialization policies and
the layers of a decoder, stacked for a scan or separate.

    dtypes("mixed_bfloat16") -> (bfloat16, float32)   compute in bf16, float32 master weights
    remat_policy("dots_saveable")                      what `jax.checkpoint` keeps for backward
    rematerialize(fn, "full")                          fn under nnx.remat ("none": fn itself)
    stacked_layers(make, L, rngs)                      L blocks as one, params on a `layers` axis
    run_stacked(blocks, x, remat, *args)               x through them, one scan step per layer
    normal_param(rngs, shape, axes, std, dtype)        a parameter named by its logical axes
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.strategy import constrain, scoped_strategy

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


# The logical axis of stacked blocks' leading dim: no strategy's rule names it, so it is never
# split (each device holds every layer's share of the other dims).
LAYERS_AXIS = "layers"


def stacked_layers(make: Callable[[nnx.Rngs], nnx.Module], layers: int, rngs: nnx.Rngs
                   ) -> nnx.Module:
    """`layers` blocks `make(rngs)` as one block whose variables carry a leading `layers` axis
    (each layer initialized from its own split of `rngs`, as separate blocks would be)."""

    @nnx.split_rngs(splits=layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYERS_AXIS})
    def create(rngs: nnx.Rngs) -> nnx.Module:
        return make(rngs)

    return create(rngs)


def unstacked_layers(make: Callable[[nnx.Rngs], nnx.Module], layers: int, rngs: nnx.Rngs
                     ) -> list[nnx.Module]:
    """`layers` separate blocks holding what `stacked_layers` initializes, layer by layer.
    Why: the initializers of L separate blocks are L copies of the random-number program in
    the (jitted) state initializer -- for GPT-124M 26k HLO instructions that XLA compiled in
    about as long as the train step; made stacked and sliced, 10k."""
    values = nnx.to_pure_dict(nnx.state(stacked_layers(make, layers, rngs)))
    blocks = []
    for i in range(layers):
        block = nnx.eval_shape(lambda: make(nnx.Rngs(0)))
        state = nnx.state(block)
        nnx.replace_by_pure_dict(state, jax.tree.map(lambda a, i=i: a[i], values))
        nnx.update(block, state)
        blocks.append(block)
    return blocks


def vocab_rows(vocab: int, multiple: int) -> int:
    """The rows of a token table (columns of an output layer) for a vocabulary of `vocab`:
    padded to a multiple of `multiple` (`model.vocab_multiple`: 128 fills the MXU's tiles),
    which the scoped strategy's model axis must divide (the vocabulary is split over it).
    The padding is a property of the config, not of the mesh, so a run resumes on any mesh."""
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ConfigError(f"model.vocab_multiple = {multiple!r}; a positive int (128: the "
                          "MXU's tile; 1: no padding).")
    strategy = scoped_strategy()
    model = strategy.axis_sizes.get("model", 1) if strategy is not None else 1
    rows = -(-vocab // multiple) * multiple
    if model > 1 and rows % model:
        fix = math.lcm(multiple, model)
        raise ConfigError(f"the vocabulary of {vocab:,} padded to a multiple of "
                          f"model.vocab_multiple = {multiple} ({rows:,} rows) does not split "
                          f"over the model axis's {model} devices; set model.vocab_multiple = "
                          f"{fix} (a multiple of both).")
    return rows


RESIDUAL = ("batch", None, "activation_embed")
"""The logical axes of the residual stream between blocks (B, T, embed). Tensor parallelism's
rules split `activation_embed` over `model` (MaxText's activation rule of that name): each
model device keeps 1/k of every layer's input for the backward pass (what "full" remat keeps,
4 x 2048 x 18432 values a layer at PaLM's shape), and XLA turns Megatron's all-reduce after
each row-parallel matmul into a reduce-scatter and an all-gather before the next
column-parallel one (the same bytes). Other strategies have no rule for it: whole."""


def run_stacked(blocks: nnx.Module, x: jax.Array, remat: str, *args: Any,
                per_layer: tuple = ()) -> jax.Array:
    """x through stacked blocks (`block(x, *args, *per_layer[i])` -> x), one scan step per
    layer, each step under `remat`; `args` are the same for every layer (RoPE's angles, say),
    `per_layer` arrays have a leading layer axis and give each layer its row."""
    block_fn = rematerialize(lambda block, h, *a: block(h, *a), remat, named=True,
                             prevent_cse=False)

    @nnx.scan(in_axes=(nnx.Carry, 0, *(None,) * len(args), *(0,) * len(per_layer)),
              out_axes=nnx.Carry, transform_metadata={nnx.PARTITION_NAME: LAYERS_AXIS})
    def layer(h: jax.Array, block: nnx.Module, *a: Any) -> jax.Array:
        return block_fn(block, constrain(h, RESIDUAL), *a)

    return layer(x, blocks, *args, *per_layer)


def run_unstacked(blocks: Any, x: jax.Array, remat: str, *args: Any,
                  per_layer: tuple = ()) -> jax.Array:
    """x through separate blocks in a Python loop, each under `remat` (`per_layer`: as
    run_stacked's)."""
    run = rematerialize(lambda block, h, *a: block(h, *a), remat, named=True)
    for i, block in enumerate(blocks):
        x = run(block, constrain(x, RESIDUAL), *args, *(a[i] for a in per_layer))
    return x


def normal_param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...],
                 std: float, dtype: Any) -> nnx.Param:
    """A parameter drawn from N(0, std^2), its dims named by logical axes."""
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), out_sharding=axes)


def zeros_param(shape: tuple[int, ...], axes: tuple[str | None, ...], dtype: Any) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, dtype), out_sharding=axes)
