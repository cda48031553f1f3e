"""`model.summary()`'s text: one row per layer (podkit layers) or per parameter (any other
network), the parameter count and the strategy; Keras's `line_length` / `positions` (fixed
column ends, long cells cut with "…") and `layer_range` (the rows from one layer to
another, by regular expression)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax

from podkit.errors import ConfigError
from podkit.train.state import path_name

Row = tuple[str, ...]


def summary(name: str, params: Any, layer_rows: list[Row] | None, count: int,
            trainable: int, strategy: Any, head: Row | None = None,
            line_length: int | None = None, positions: Sequence[float] | None = None) -> str:
    """The table for a model called `name`: `layer_rows` under `head` (Keras's columns:
    layer (type), output shape, param #, connected to for a functional model, trainable)
    when the network is made of podkit layers, else one row per parameter of `params`; then
    the totals. Columns are as wide as their cells unless `line_length` or `positions` fix
    where each ends (Keras's arguments)."""
    if layer_rows is None:
        rows = [(path_name(path), str(tuple(leaf.shape)), f"{leaf.size:,}")
                for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
        head = ("Parameter", "Shape", "Count")
    else:
        rows = layer_rows
        head = head or ("Layer (type)", "Output Shape", "Param #")
    widths = _widths([head, *rows], line_length, positions)
    return (f'Model: "{name}"\n' + _table([head, *rows], widths)
            + f"\nTotal params: {count:,}\nTrainable params: {trainable:,}\n"
            f"Non-trainable params: {count - trainable:,}\nStrategy: {strategy!r}")


def layer_range(names: Sequence[str], bounds: Sequence[str]) -> tuple[int, int]:
    """Keras's `layer_range=(first, last)`: the rows from the first layer whose name matches
    `first` (a regular expression) to the last one matching `last`, both included."""
    if isinstance(bounds, str) or len(bounds) != 2:
        raise ConfigError(f"layer_range={bounds!r} must be two layer names (or regular "
                          "expressions): (first, last).")
    start = [i for i, n in enumerate(names) if re.match(bounds[0], n)]
    end = [i for i, n in enumerate(names) if re.match(bounds[1], n)]
    for pattern, found in ((bounds[0], start), (bounds[1], end)):
        if not found:
            raise ConfigError(f"layer_range: no layer's name matches {pattern!r}; the layers "
                              f"are {list(names)}.")
    if start[0] > end[-1]:
        raise ConfigError(f"layer_range={tuple(bounds)!r}: {names[start[0]]!r} comes after "
                          f"{names[end[-1]]!r}.")
    return start[0], end[-1] + 1


def _widths(rows: list[Row], line_length: int | None,
            positions: Sequence[float] | None) -> list[int]:
    natural = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if line_length is None and positions is None:
        return natural
    n = len(natural)
    if line_length is not None and (not isinstance(line_length, int) or line_length < 4 * n):
        raise ConfigError(f"summary(line_length={line_length!r}) must be an int of at least "
                          f"{4 * n} (this table has {n} columns).")
    total = line_length or sum(natural) + 3 * (n - 1)
    if positions is None:  # scale the natural widths to the line
        ends, at = [], 0.0
        for w in natural:
            at += (w + 3) / (sum(natural) + 3 * n)
            ends.append(at)
    else:
        ends = list(positions)
        if len(ends) != n or any(b <= a for a, b in zip([0, *ends], ends, strict=False)):
            raise ConfigError(f"summary(positions={list(positions)!r}) must give {n} "
                              "increasing column ends (fractions of line_length, or "
                              "characters).")
    if all(e <= 1 for e in ends):
        ends = [round(e * total) for e in ends]
    starts = [0, *ends[:-1]]
    return [max(int(e - s) - 3, 1) if i < n - 1 else max(int(e - s), 1)
            for i, (s, e) in enumerate(zip(starts, ends, strict=True))]


def _cut(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[:max(width - 1, 0)] + "…"


def _table(rows: list[Row], widths: list[int]) -> str:
    line = "-" * (sum(widths) + 3 * (len(widths) - 1))
    fmt = lambda r: "   ".join(_cut(c, w).ljust(w) for c, w in zip(r, widths, strict=True))
    return "\n".join([line, fmt(rows[0]), line, *map(fmt, rows[1:]), line])
