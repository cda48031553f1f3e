"""Nested elements (tuples, lists, dicts of arrays) and their specs, as tf.data sees them.

Kept free of JAX so that input worker processes import only numpy and Grain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


def map_structure(fn: Callable[..., Any], *trees: Any) -> Any:
    """Apply `fn` to the leaves of one or more trees of the same structure."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: map_structure(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*(map_structure(fn, *parts) for parts in zip(*trees, strict=True)))
    if isinstance(first, tuple | list):
        return type(first)(map_structure(fn, *parts) for parts in zip(*trees, strict=True))
    return fn(*trees)


def leaves(tree: Any) -> list[Any]:
    out: list[Any] = []
    map_structure(out.append, tree)
    return out


def same_structure(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            same_structure(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return (isinstance(b, tuple | list) and len(a) == len(b)
                and all(same_structure(x, y) for x, y in zip(a, b, strict=True)))
    return not isinstance(b, dict | tuple | list)


def as_numpy(tree: Any) -> Any:
    """Leaves as numpy values: arrays stay arrays, Python scalars become numpy scalars.

    On the per-element hot path: exact type checks first, no generic tree walk.
    """
    t = type(tree)
    if t is np.ndarray or t is bytes or isinstance(tree, np.generic):
        return tree
    if t is tuple:
        return tuple([as_numpy(x) for x in tree])
    if t is dict:
        return {k: as_numpy(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return t(*(as_numpy(x) for x in tree))
    if t is list:
        return [as_numpy(x) for x in tree]
    if t is str:
        return tree.encode()
    return np.asarray(tree)[()]


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one leaf of an element; None in `shape` means the size varies."""

    shape: tuple[int | None, ...]
    dtype: np.dtype

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={np.dtype(self.dtype).name})"


def spec_of(tree: Any) -> Any:
    def one(x: Any) -> TensorSpec:
        if isinstance(x, bytes):
            return TensorSpec((), np.dtype(object))
        a = np.asarray(x)
        return TensorSpec(tuple(a.shape), a.dtype)
    return map_structure(one, tree)


def describe(tree: Any) -> str:
    """Shapes of a tree's leaves, for error messages."""
    return repr(map_structure(lambda x: tuple(np.shape(x)), tree))
