"""`model.summary()`'s text: one row per layer (podkit layers) or per parameter (any other
network), the parameter count and the strategy."""

from __future__ import annotations

from typing import Any

import jax

from podkit.train.state import path_name


def summary(name: str, params: Any, layer_rows: list[tuple[str, ...]] | None, count: int,
            trainable: int, strategy: Any) -> str:
    """The table for a model called `name`: `layer_rows` (Keras's columns: layer (type),
    output shape, param #, and connected to for a functional model) when the network is
    made of podkit layers, else one row per parameter of `params`; then the totals."""
    if layer_rows is None:
        rows = [(path_name(path), str(tuple(leaf.shape)), f"{leaf.size:,}")
                for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
        head: tuple[str, ...] = ("Parameter", "Shape", "Count")
    else:
        rows = layer_rows
        head = ("Layer (type)", "Output Shape", "Param #", "Connected to")[:len(rows[0])] \
            if rows else ("Layer (type)", "Output Shape", "Param #")
    return (f'Model: "{name}"\n' + _table([head, *rows])
            + f"\nTotal params: {count:,}\nTrainable params: {trainable:,}\n"
            f"Non-trainable params: {count - trainable:,}\nStrategy: {strategy!r}")


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = "-" * (sum(widths) + 3 * (len(widths) - 1))
    fmt = lambda r: "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
    return "\n".join([line, fmt(rows[0]), line, *map(fmt, rows[1:]), line])
