"""Elements as records that hold only data: cache()'s file format.

An element (nested tuples, lists and dicts of numpy arrays, numpy or Python scalars, bytes
and str, as podkit.data.structure sees them) becomes one msgpack record of tagged values:
an array is its dtype, shape and raw bytes; nothing in a record names a class or a function,
so reading a file from elsewhere can hand back wrong data but never run code (a pickle can).
Kept free of JAX, like structure.py: input worker processes decode records.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from podkit.errors import DataError, InputError

# One letter per kind of value; a record is the element's tree of [tag, ...] lists.
_TUPLE, _LIST, _DICT, _ARRAY, _SCALAR, _BYTES, _STR, _TEXTS = "tldasbuo"
# dtype kinds stored as raw bytes: bool, ints, floats, complex, fixed-width bytes/str
_RAW_KINDS = set("biufcSU")


def _unsupported(value: Any, what: str) -> InputError:
    return InputError(
        f"cache(filename) stores numpy arrays, numpy/Python scalars, bytes and str in tuples, "
        f"lists and dicts, but got {what} ({type(value).__module__}.{type(value).__qualname__})"
        f"; map the element to arrays first (e.g. .map(lambda x: np.asarray(x)), a namedtuple "
        f"with tuple(x) or x._asdict()), or cache() in memory, which keeps any object.")


def _encode(value: Any) -> Any:
    t = type(value)
    if t is np.ndarray:
        if value.dtype.kind in _RAW_KINDS:
            return [_ARRAY, value.dtype.str, list(value.shape),
                    np.ascontiguousarray(value).tobytes()]
        if value.dtype == object:  # batches of bytes (from_tensor_slices of strings, batch)
            flat = value.ravel().tolist()
            if all(type(v) is bytes for v in flat) or all(type(v) is str for v in flat):
                return [_TEXTS, list(value.shape), flat]
        raise _unsupported(value, f"an array of dtype {value.dtype}")
    if t is bytes:
        return [_BYTES, value]
    if t is str:
        return [_STR, value]
    if isinstance(value, np.generic):
        if value.dtype.kind in _RAW_KINDS:
            return [_SCALAR, value.dtype.str, value.tobytes()]
        raise _unsupported(value, f"a scalar of dtype {value.dtype}")
    if t is bool or t is int or t is float:  # as structure.as_numpy makes them: numpy scalars
        scalar = np.asarray(value)
        if scalar.dtype.kind not in _RAW_KINDS:  # an int beyond 64 bits is an object array
            raise _unsupported(value, f"an int beyond 64 bits ({value})")
        return _encode(scalar[()])
    if t is tuple:
        return [_TUPLE, [_encode(v) for v in value]]
    if t is list:
        return [_LIST, [_encode(v) for v in value]]
    if t is dict:
        for k in value:
            if type(k) not in (str, int, bytes):
                raise _unsupported(k, "a dict key that is not str, int or bytes")
        return [_DICT, [[k, _encode(v)] for k, v in value.items()]]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        raise _unsupported(value, "a namedtuple, whose class a data file cannot name safely")
    raise _unsupported(value, f"a {t.__name__}")


def _decode(node: Any) -> Any:
    tag = node[0]
    if tag == _ARRAY:
        dtype, shape, raw = node[1], node[2], node[3]
        # a copy: a view of the record's bytes would be read-only
        return np.frombuffer(raw, np.dtype(dtype)).reshape(shape).copy()
    if tag == _SCALAR:
        return np.frombuffer(node[2], np.dtype(node[1]))[0]
    if tag in (_BYTES, _STR):
        return node[1]
    if tag == _TEXTS:
        out = np.empty(len(node[2]), dtype=object)
        out[:] = node[2]
        return out.reshape(node[1])
    if tag == _TUPLE:
        return tuple(_decode(v) for v in node[1])
    if tag == _LIST:
        return [_decode(v) for v in node[1]]
    if tag == _DICT:
        return {k: _decode(v) for k, v in node[1]}
    raise DataError(f"a cache record holds an unknown tag {tag!r}: the file is damaged or was "
                    "not written by podkit; delete it and the pipeline writes it again.")


def encode(element: Any) -> bytes:
    """One element as a record; an unsupported value is an InputError naming its type."""
    return msgpack.packb(_encode(element), use_bin_type=True)


def decode(record: bytes) -> Any:
    """The element of a record written by encode(); a record it did not write is a
    DataError."""
    try:
        node = msgpack.unpackb(record, raw=False, strict_map_key=False)
        return _decode(node)
    except DataError:
        raise
    except Exception as e:  # msgpack's errors, or a node of the wrong shape
        raise DataError(f"a cache record cannot be read ({type(e).__name__}: {e}): the file "
                        "is damaged or was not written by podkit; delete it and the pipeline "
                        "writes it again.") from e


class Decode:
    """decode() as a picklable callable, for the Grain map that reads a cache file."""

    def __call__(self, record: bytes) -> Any:
        return decode(record)


def encode_header(fields: dict[str, Any]) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def decode_header(record: bytes) -> dict[str, Any] | None:
    """A header record's fields; None when the record is not one (another format)."""
    try:
        fields = msgpack.unpackb(record, raw=False)
    except Exception:  # pickles, other data: not a header
        return None
    return fields if isinstance(fields, dict) else None
