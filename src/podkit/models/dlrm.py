"""DLRM (Naumov et al. 2019): a click-through-rate model in Flax NNX, with logical axes.

    dense (B, dense_features) -> bottom MLP -> (B, embed_dim)  ─┐
    sparse (B, F) ids -> F embedding tables -> (B, F, embed_dim) ┴> pairwise dot products of
    the 1 + F vectors (upper triangle, no diagonal) ++ bottom output -> top MLP -> Dense(1)
    -> click logit (B, 1), float32

The F tables are ONE parameter of shape (F, table_rows, embed_dim), looked up with one gather
(the ids of feature f index the f-th table): one gather and one scatter-add (its gradient)
per step instead of F of each, one collective to bring the looked-up rows to the batch's
devices instead of F, and one large parameter to lay out instead of F small ones. With
`sharded` its rows are split over the whole mesh (logical axis `table`: the parameter-server
layout of CTR models, 1/N of the table and its optimizer state per device); without, it is
replicated but for `embed`. Sharded tables are also updated row-sparsely (unless
`sparse_updates = false`): a train step writes only the rows its batch looked up
(podkit.train.sparse), as TPUEmbedding does.

The MLPs' kernels alternate ("embed", "mlp") and ("mlp", "embed") so each is shardable by
FSDP and tensor parallelism; dims the data sizes (the dense features, the interaction
features, the single logit) are None, as no mesh axis can be assumed to divide them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit.config import DLRMConfig
from podkit.errors import ConfigError
from podkit.layers.lookup import lookup


class MLP(nnx.Module):
    """Linear layers of `dims[0] -> dims[1] -> ...`, ReLU after each but (with
    `last_activation=False`) the last. `axes[i]` is the logical axis of dims[i]."""

    def __init__(self, dims: Sequence[int], axes: Sequence[str | None], rngs: nnx.Rngs,
                 last_activation: bool = True) -> None:
        self.layers = nnx.List([
            nnx.Linear(dims[i], dims[i + 1], rngs=rngs,
                       kernel_metadata={"out_sharding": (axes[i], axes[i + 1])},
                       bias_metadata={"out_sharding": (axes[i + 1],)})
            for i in range(len(dims) - 1)])
        self.last_activation = last_activation

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.last_activation or i < len(self.layers) - 1:
                x = jax.nn.relu(x)
        return x


def _alternating(n: int, last: str) -> list[str]:
    """n logical axes alternating "mlp" / "embed", ending with `last`."""
    other = "mlp" if last == "embed" else "embed"
    return [last if (n - 1 - i) % 2 == 0 else other for i in range(n)]


def interaction_pairs(vectors: int) -> int:
    """The dot products of distinct pairs among `vectors` vectors: n(n-1)/2."""
    return vectors * (vectors - 1) // 2


class DLRM(nnx.Module):
    """`__call__({"dense": (B, dense_features) float, "sparse": (B, F) int ids}) -> click
    logits (B, 1)`."""

    def __init__(self, config: DLRMConfig, dense_features: int, sparse_features: int,
                 table_rows: int, rngs: nnx.Rngs) -> None:
        check_config(config)
        d, f = config.embed_dim, sparse_features
        self.sparse_features, self.table_rows = sparse_features, table_rows
        self.sparse_updates = config.sharded and config.sparse_updates
        # The bottom's output is dotted with the embeddings: it ends on `embed` as they do.
        self.bottom = MLP([dense_features, *config.bottom],
                          [None, *_alternating(len(config.bottom), "embed")], rngs)
        # DLRM's init: uniform in +-1/sqrt(rows) (each table's own rows).
        bound = 1.0 / math.sqrt(table_rows)
        self.tables = nnx.Param(
            jax.random.uniform(rngs.params(), (f, table_rows, d), jnp.float32, -bound, bound),
            out_sharding=(None, "table" if config.sharded else None, "embed"))
        pairs = interaction_pairs(1 + f)
        top = [d + pairs, *config.top, 1]
        self.top = MLP(top, [None, *_alternating(len(config.top), "embed"), None], rngs,
                       last_activation=False)
        # The upper triangle of the (1 + F) x (1 + F) dot products, diagonal excluded (numpy:
        # the module is created inside jit, and these are static).
        rows, cols = np.triu_indices(1 + f, k=1)
        self.pair_rows, self.pair_cols = tuple(rows.tolist()), tuple(cols.tolist())

    def __call__(self, x: dict[str, jax.Array]) -> jax.Array:
        if not isinstance(x, dict) or set(x) != {"dense", "sparse"}:
            got = sorted(x) if isinstance(x, dict) else type(x).__name__
            raise ConfigError(f"DLRM takes x = {{'dense': (B, features) floats, 'sparse': "
                              f"(B, features) int ids}}; it got {got}.")
        dense = x["dense"].astype(jnp.float32)
        ids = x["sparse"].astype(jnp.int32)
        if ids.shape[-1] != self.sparse_features:
            raise ConfigError(f"the DLRM was built for {self.sparse_features} sparse features; "
                              f"x['sparse'] has {ids.shape[-1]}.")
        bottom = self.bottom(dense)  # (B, D)
        # One gather: the ids of feature f index table f. (B, F, D). Sharded tables are read
        # with `lookup`: a train step then updates only the rows looked up.
        features = jnp.arange(self.sparse_features, dtype=jnp.int32)[None, :]
        embedded = (lookup(self.tables, features, ids) if self.sparse_updates
                    else self.tables[...][features, ids])
        vectors = jnp.concatenate([bottom[:, None, :], embedded], axis=1)  # (B, 1 + F, D)
        dots = jnp.einsum("bnd,bmd->bnm", vectors, vectors)
        pairs = dots[:, jnp.asarray(self.pair_rows), jnp.asarray(self.pair_cols)]
        return self.top(jnp.concatenate([bottom, pairs], axis=-1)).astype(jnp.float32)


def check_config(config: DLRMConfig) -> None:
    for name in ("bottom", "top"):
        sizes = getattr(config, name)
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                for s in sizes):
            raise ConfigError(f"model.{name} = {sizes!r}; give a non-empty list of positive "
                              "layer sizes, e.g. [64, 16].")
    if isinstance(config.embed_dim, bool) or not isinstance(config.embed_dim, int) or \
            config.embed_dim < 1:
        raise ConfigError(f"model.embed_dim = {config.embed_dim!r}; use a positive int.")
    if config.bottom[-1] != config.embed_dim:
        raise ConfigError(f"model.bottom = {config.bottom} ends in {config.bottom[-1]} but "
                          f"model.embed_dim = {config.embed_dim}: the bottom MLP's output is "
                          "dotted with the embeddings, so end it in embed_dim (e.g. bottom = "
                          f"{[*config.bottom[:-1], config.embed_dim]}).")


def build_dlrm(config: DLRMConfig, info: dict, seed: int = 0) -> Any:
    """An uncompiled pk.Model of a DLRM sized by `config`, its features and tables from the
    data (`info["dense_features"]`, `info["sparse_features"]`, `info["table_rows"]`)."""
    from podkit.model import Model

    keys = ("dense_features", "sparse_features", "table_rows")
    missing = [k for k in keys if k not in info]
    if missing:
        raise ConfigError(f"model.name = 'dlrm' needs click-log data ([data] name = "
                          f"'criteo'); this data's info lacks {', '.join(missing)}.")
    check_config(config)
    dense, sparse, rows = (int(info[k]) for k in keys)
    if sparse < 1 or rows < 1 or dense < 1:
        raise ConfigError(f"DLRM needs >= 1 dense feature, sparse feature and table row; the "
                          f"data has {dense}, {sparse}, {rows}.")
    return Model(lambda rngs: DLRM(config, dense, sparse, rows, rngs), seed=seed, name="dlrm")
