"""DLRM (Naumov et al. 2019): a click-through-rate model in Flax NNX, with logical axes.

    dense (B, dense_features) -> bottom MLP -> (B, embed_dim)  ─┐
    sparse (B, F) ids -> F embedding tables -> (B, F, embed_dim) ┴> pairwise dot products of
    the 1 + F vectors (upper triangle, no diagonal) ++ bottom output -> top MLP -> Dense(1)
    -> click logit (B, 1), float32

The F tables are ONE parameter of shape (rows, embed_dim): feature f's table is the rows
`offsets[f] .. offsets[f] + table_sizes[f]`, so every feature has its own row count (as
Criteo's 26 features do: from 3 to 40 million values) and a lookup is one gather of
`ids + offsets` (one gather and one scatter-add per step instead of F of each, one collective
to bring the rows to the batch's devices, one large parameter to lay out). After the last
table come padding rows: at least one (where a multi-hot bag's padding ids, -1, read from),
and as many as make the row count a multiple of lcm(`ROW_MULTIPLE`, device count), so
sharding the rows never needs a divisible size from the user and a checkpoint restores on
any power-of-two device count up to it (other counts give another multiple: another shape).
With `sharded` the rows are split over the whole mesh (logical axis `table`: the
parameter-server layout of CTR models, 1/N of the table and its optimizer state per
device); without, the table is replicated but for `embed`. Sharded tables are also updated
row-sparsely (unless `sparse_updates = false`): a train step writes only the rows its batch
looked up (podkit.train.sparse), as TPUEmbedding does.

Multi-hot features: `x["sparse"]` of shape (B, F, H) holds up to H ids per feature, padded
with -1; a feature's vector is the sum (`pooling = "sum"`) or mean (`"mean"`) of its ids' rows
(TorchRec's EmbeddingBagCollection, Keras-RS's combiner). An id outside its feature's table
gives NaN, as `nnx.Embed` does: a wrong id is loud, never another feature's row.

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


ROW_MULTIPLE = 1024  # the tables' rows are padded to a multiple of this (and of the devices)


def table_layout(sizes: Sequence[int]) -> tuple[np.ndarray, int]:
    """(each feature's first row, rows in all with the padding) of tables of `sizes` rows."""
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    multiple = math.lcm(ROW_MULTIPLE, jax.device_count())
    total = -(-(int(sum(sizes)) + 1) // multiple) * multiple  # >= 1 padding row
    return offsets, total


class DLRM(nnx.Module):
    """`__call__({"dense": (B, dense_features) float, "sparse": (B, F) or (B, F, H) int
    ids}) -> click logits (B, 1)`."""

    def __init__(self, config: DLRMConfig, dense_features: int, table_sizes: Sequence[int],
                 rngs: nnx.Rngs) -> None:
        check_config(config)
        d, f = config.embed_dim, len(table_sizes)
        self.sparse_features, self.table_sizes = f, tuple(int(s) for s in table_sizes)
        self.pooling = config.pooling
        self.sparse_updates = config.sharded and config.sparse_updates
        # The bottom's output is dotted with the embeddings: it ends on `embed` as they do.
        self.bottom = MLP([dense_features, *config.bottom],
                          [None, *_alternating(len(config.bottom), "embed")], rngs)
        offsets, total = table_layout(self.table_sizes)
        self.offsets = tuple(offsets.tolist())
        self.pad_row = int(sum(self.table_sizes))  # the first padding row
        # DLRM's init: uniform in +-1/sqrt(rows), each table by its own rows; padding zeros.
        bound = np.zeros(total, np.float32)
        bound[:self.pad_row] = np.repeat(1.0 / np.sqrt(self.table_sizes), self.table_sizes)
        self.tables = nnx.Param(
            jax.random.uniform(rngs.params(), (total, d), jnp.float32, -1.0, 1.0)
            * jnp.asarray(bound)[:, None],
            out_sharding=("table" if config.sharded else None, "embed"))
        pairs = interaction_pairs(1 + f)
        top = [d + pairs, *config.top, 1]
        self.top = MLP(top, [None, *_alternating(len(config.top), "embed"), None], rngs,
                       last_activation=False)
        # The upper triangle of the (1 + F) x (1 + F) dot products, diagonal excluded (numpy:
        # the module is created inside jit, and these are static).
        rows, cols = np.triu_indices(1 + f, k=1)
        self.pair_rows, self.pair_cols = tuple(rows.tolist()), tuple(cols.tolist())

    def rows(self, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(row of each id in the one table, whether it is an id and not -1 padding), for ids
        (B, F, H). An id outside its feature's table (negative ones other than -1 included)
        points past the table: a NaN row, so a bad id shows as a NaN loss, never silently."""
        sizes = jnp.asarray(self.table_sizes, jnp.int32)[None, :, None]
        offsets = jnp.asarray(self.offsets, jnp.int32)[None, :, None]
        present = ids != -1  # only -1 pads a bag: another negative id is out of range
        inside = (ids >= 0) & (ids < sizes)
        row = jnp.where(inside, ids + offsets, jnp.iinfo(jnp.int32).max)
        return jnp.where(present, row, self.pad_row), present

    def __call__(self, x: dict[str, jax.Array]) -> jax.Array:
        if not isinstance(x, dict) or set(x) != {"dense", "sparse"}:
            got = sorted(x) if isinstance(x, dict) else type(x).__name__
            raise ConfigError(f"DLRM takes x = {{'dense': (B, features) floats, 'sparse': "
                              f"(B, features) or (B, features, ids) int ids}}; it got {got}.")
        dense = x["dense"].astype(jnp.float32)
        ids = x["sparse"].astype(jnp.int32)
        if ids.ndim not in (2, 3) or ids.shape[1] != self.sparse_features:
            raise ConfigError(f"the DLRM was built for {self.sparse_features} sparse features; "
                              f"x['sparse'] has shape {ids.shape} (want (B, "
                              f"{self.sparse_features}) or (B, {self.sparse_features}, ids)).")
        bottom = self.bottom(dense)  # (B, D)
        rows, present = self.rows(ids if ids.ndim == 3 else ids[:, :, None])
        # One gather for every feature's ids. Sharded tables are read with `lookup`: a train
        # step then updates only the rows looked up.
        looked = (lookup(self.tables, rows) if self.sparse_updates
                  else self.tables[...].at[rows].get(mode="fill", fill_value=jnp.nan))
        # Padding counts 0 (selected, not multiplied: a NaN row times 0 would stay NaN).
        mask = present[..., None]  # (B, F, H, 1)
        embedded = jnp.where(mask, looked, 0).sum(axis=2)  # (B, F, D)
        if self.pooling == "mean":
            embedded = embedded / jnp.maximum(mask.sum(axis=2).astype(looked.dtype), 1.0)
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
    if config.pooling not in ("sum", "mean"):
        raise ConfigError(f"model.pooling = {config.pooling!r}; use \"sum\" or \"mean\" (how "
                          "a multi-hot feature's rows combine).")
    if config.bottom[-1] != config.embed_dim:
        raise ConfigError(f"model.bottom = {config.bottom} ends in {config.bottom[-1]} but "
                          f"model.embed_dim = {config.embed_dim}: the bottom MLP's output is "
                          "dotted with the embeddings, so end it in embed_dim (e.g. bottom = "
                          f"{[*config.bottom[:-1], config.embed_dim]}).")


def table_sizes(info: dict) -> list[int]:
    """Each categorical feature's table rows, from the data's info: `table_sizes`, or (the
    generated logs of old runs) `table_rows` for every one of `sparse_features`."""
    if "table_sizes" in info:
        return [int(s) for s in info["table_sizes"]]
    missing = [k for k in ("sparse_features", "table_rows") if k not in info]
    if missing:
        raise ConfigError(f"model.name = 'dlrm' needs click-log data ([data] name = "
                          f"'criteo'); this data's info lacks table_sizes (or "
                          f"{', '.join(missing)}).")
    return [int(info["table_rows"])] * int(info["sparse_features"])


def build_dlrm(config: DLRMConfig, info: dict, seed: int = 0) -> Any:
    """An uncompiled pk.Model of a DLRM sized by `config`, its features and tables from the
    data (`info["dense_features"]`, `info["table_sizes"]`)."""
    from podkit.model import Model

    if "dense_features" not in info:
        raise ConfigError("model.name = 'dlrm' needs click-log data ([data] name = 'criteo'); "
                          "this data's info lacks dense_features.")
    check_config(config)
    dense, sizes = int(info["dense_features"]), table_sizes(info)
    if dense < 1 or not sizes or min(sizes) < 1:
        raise ConfigError(f"DLRM needs >= 1 dense feature and sparse feature, and >= 1 row per "
                          f"table; the data has {dense} dense features and tables of {sizes} "
                          "rows.")
    return Model(lambda rngs: DLRM(config, dense, sizes, rngs), seed=seed, name="dlrm")
