"""Feature specs for parsing tf.train.Example: FixedLenFeature, VarLenFeature,
FixedLenSequenceFeature, as tf.io's, with dtypes by name ("int64", "float32", "string") or
as numpy dtypes (np.int64, np.float32, bytes/object for strings).

An Example holds three kinds of lists — int64, float (32-bit) and bytes — so these are the
only dtypes a spec takes, as in TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from podkit.errors import ConfigError

# dtype name -> (the Feature's list field, numpy dtype of the values, what a missing pad is)
KINDS = {
    "int64": ("int64_list", np.dtype(np.int64), 0),
    "float32": ("float_list", np.dtype(np.float32), 0.0),
    "string": ("bytes_list", np.dtype(object), b""),
}
_ALIASES = {"int64": "int64", "float32": "float32", "float": "float32", "string": "string",
            "bytes": "string", "object": "string", "str": "string"}


def dtype_name(dtype: Any, key: str = "") -> str:
    """"int64", "float32" or "string" for any way of naming them (names, numpy dtypes,
    bytes/str/object, tf.DType-like objects with a `.name`)."""
    name: Any = dtype
    if dtype in (bytes, str, object, np.bytes_, np.str_, np.object_):
        name = "string"
    elif isinstance(dtype, type | np.dtype):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = repr(dtype)
    elif not isinstance(dtype, str) and hasattr(dtype, "name"):  # tf.int64 and its like
        name = dtype.name
    if isinstance(name, str) and name in _ALIASES:
        return _ALIASES[name]
    where = f" for feature {key!r}" if key else ""
    raise ConfigError(f"dtype={dtype!r}{where}: an Example holds only int64, float32 and bytes "
                      "values; pass 'int64', 'float32' or 'string' (and cast after parsing).")


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        shape = (int(shape),)
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise ConfigError(f"shape={shape!r}; pass a list of ints, e.g. [] for a scalar or "
                          "[3] for three values.") from None
    if any(d < 0 for d in dims):
        raise ConfigError(f"shape={shape!r}: every dim must be known and >= 0 (use "
                          "VarLenFeature for a varying number of values).")
    return dims


def _default(value: Any, dtype: str, shape: tuple[int, ...], what: str) -> Any:
    """The default as an array of the spec's shape (TF reshapes it; a wrong size errs)."""
    if value is None:
        return None
    np_dtype = KINDS[dtype][1]
    if dtype == "string":
        flat = np.asarray(value, dtype=object).reshape(-1)
        arr = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat],
                       dtype=object)
    else:
        arr = np.asarray(value, dtype=np_dtype)
    if arr.size != math.prod(shape):
        raise ConfigError(f"{what}: default_value {value!r} has {arr.size} values but the "
                          f"shape {list(shape)} takes {math.prod(shape)}; give one value per "
                          "element of the shape.")
    arr = arr.reshape(shape)
    return arr[()] if not shape else arr


@dataclasses.dataclass(frozen=True)
class FixedLenFeature:
    """tf.io.FixedLenFeature: exactly prod(shape) values, parsed into that shape.

    A missing feature takes `default_value` (reshaped to `shape`; an error without one)."""

    shape: Any
    dtype: Any
    default_value: Any = None

    def __post_init__(self) -> None:
        shape, dtype = _shape(self.shape), dtype_name(self.dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "default_value", _default(
            self.default_value, dtype, shape, "FixedLenFeature"))


@dataclasses.dataclass(frozen=True)
class VarLenFeature:
    """tf.io.VarLenFeature: any number of values. podkit gives one example's values as a 1-D
    array (TensorFlow a SparseTensor); `padded_batch` pads them."""

    dtype: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))


@dataclasses.dataclass(frozen=True)
class FixedLenSequenceFeature:
    """tf.io.FixedLenSequenceFeature: a sequence of items of `shape`, parsed into
    (n, *shape). In an Example the values are all in one list (so `allow_missing=True` is
    required, as TF's); in a SequenceExample's feature_lists each step is one Feature.
    `default_value` pads the shorter sequences of a batch (parse_example)."""

    shape: Any
    dtype: Any
    allow_missing: bool = False
    default_value: Any = None

    def __post_init__(self) -> None:
        shape, dtype = _shape(self.shape), dtype_name(self.dtype)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        if self.default_value is not None:
            pad = _default(self.default_value, dtype, (), "FixedLenSequenceFeature")
            object.__setattr__(self, "default_value", pad)
