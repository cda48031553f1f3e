"""Row lookups in embedding tables, which the train step updates row-sparsely.

    rows = lookup(table, ids)              # table[ids]: (*ids.shape, dim)
    rows = lookup(table, feature, ids)     # several leading dims indexed (DLRM's (F, rows, dim))

A table is a parameter whose logical axes include `table` (`Embedding(sharded=True)`, DLRM's
tables). JAX's gradient of a gather is a scatter-add into a zero table, and a dense optimizer
then rewrites every row (and, with Adam, both moments) each step: a step costs as much as the
table, not the batch. Reading a table through `lookup` lets the train step differentiate with
respect to the rows looked up instead of the table, and update only those rows
(podkit.train.sparse) — TPUEmbedding's design, at a cost that follows the batch.

Outside a train step `lookup` is a plain gather. Inside one, a `Tape` is active: it records the
ids of every lookup (the step needs them to write the rows back) and adds to the rows a zero
"delta" the step differentiates with respect to; the table itself is read under
stop_gradient, so no table-sized gradient is ever formed. A table read any other way (a
direct `table[...]` in a module) is an ordinary dense parameter for that read.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError

TABLE_AXIS = "table"

_TAPE: contextvars.ContextVar[Tape | None] = contextvars.ContextVar("podkit_tape", default=None)


def lookup(table: nnx.Variable, *ids: jax.Array) -> jax.Array:
    """`table[...][ids]`: the rows of `table` at `ids`, one int array per leading dim indexed
    (broadcast together); an id out of range gives NaN rows, as `nnx.Embed` does."""
    if not ids:
        raise ConfigError("lookup(table, ids) needs at least one array of ids.")
    value = table[...]
    ids = tuple(jnp.broadcast_arrays(*(jnp.asarray(i) for i in ids)))
    for i in ids:
        if not jnp.issubdtype(i.dtype, jnp.integer):
            raise ConfigError(f"lookup ids must be integers; got dtype {i.dtype}. Cast them "
                              "with .astype('int32').")
    if len(ids) >= value.ndim:
        raise ConfigError(f"lookup indexes {len(ids)} leading dims of a table of shape "
                          f"{value.shape}; a row must keep at least one dim.")
    tape = _TAPE.get()
    if tape is None:
        return _gather(value, ids)
    return tape.read(table, value, ids)


def _gather(value: jax.Array, ids: tuple[jax.Array, ...]) -> jax.Array:
    # A negative id is out of range too (JAX would wrap it to a row counted from the end,
    # which the row-sparse update, dropping out-of-range ids, would then never train).
    ids = tuple(jnp.where(i < 0, d, i) for i, d in zip(ids, value.shape, strict=False))
    return value.at[ids].get(mode="fill", fill_value=jnp.nan)


class Tape:
    """The lookups of one forward pass, by table name. `names` maps each table's variable (by
    `id`) to its name; the caller names them. With `deltas=None` it only records shapes (the
    step's first, abstract pass); with deltas, lookup j of table p returns rows +
    deltas[p][j]."""

    def __init__(self, names: Mapping[int, str],
                 deltas: dict[str, list[jax.Array]] | None = None) -> None:
        self.names = names
        self.deltas = deltas
        self.ids: dict[str, list[tuple[jax.Array, ...]]] = {}
        self.rows: dict[str, list[jax.ShapeDtypeStruct]] = {}

    def read(self, table: nnx.Variable, value: jax.Array,
             ids: tuple[jax.Array, ...]) -> jax.Array:
        name = self.names.get(id(table))
        if name is None:  # not a `table` parameter: an ordinary differentiable gather
            return _gather(value, ids)
        rows = _gather(jax.lax.stop_gradient(value), ids)
        n = len(self.ids.setdefault(name, []))
        self.ids[name].append(ids)
        self.rows.setdefault(name, []).append(jax.ShapeDtypeStruct(rows.shape, rows.dtype))
        if self.deltas is None:
            return rows
        return rows + self.deltas[name][n]


@contextlib.contextmanager
def recording(tape: Tape) -> Iterator[Tape]:
    """Lookups inside this block go through `tape`."""
    token = _TAPE.set(tape)
    try:
        yield tape
    finally:
        _TAPE.reset(token)

