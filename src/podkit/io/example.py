"""tf.io's Example parsing and writing: parse_single_example, parse_example,
parse_single_sequence_example, serialize_example.

    spec = {"image": pk.io.FixedLenFeature([], "string"),
            "label": pk.io.FixedLenFeature([], "int64"),
            "boxes": pk.io.VarLenFeature("float32")}
    f = pk.io.parse_single_example(record, spec)   # {"image": b"...", "label": np.int64(3),
                                                   #  "boxes": array([...], float32)}

Values are TensorFlow's (as tf.data's numpy iterator gives them): a scalar is a numpy scalar
(bytes for strings), an array a numpy array (object arrays of bytes for strings). Where TF
differs by design: a VarLenFeature is a 1-D array (TF: a SparseTensor); in parse_example and
in sequence features, varying lengths are padded into a dense array (TF: a SparseTensor whose
`tf.sparse.to_dense` is that array). Errors are TensorFlow's, as a podkit `DataError` naming
the key (`ConfigError` for a bad spec).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from podkit.errors import ConfigError, DataError
from podkit.io import protos
from podkit.io.features import KINDS, FixedLenFeature, FixedLenSequenceFeature, VarLenFeature

_SPECS = (FixedLenFeature, VarLenFeature, FixedLenSequenceFeature)


def _check_spec(features: Any, what: str, sequence: bool = False) -> Mapping[str, Any]:
    if features is None:
        return {}
    if not isinstance(features, Mapping):
        raise ConfigError(f"{what} takes a dict of feature specs (pk.io.FixedLenFeature, "
                          f"VarLenFeature, FixedLenSequenceFeature), got a "
                          f"{type(features).__name__}.")
    for key, spec in features.items():
        if not isinstance(spec, _SPECS):
            raise ConfigError(f"{what}: feature {key!r} has spec {spec!r}; pass "
                              "pk.io.FixedLenFeature, VarLenFeature or FixedLenSequenceFeature.")
        if sequence and isinstance(spec, FixedLenFeature):
            raise ConfigError(f"{what}: sequence feature {key!r} is a FixedLenFeature; "
                              "sequence features are FixedLenSequenceFeature or VarLenFeature.")
        if (not sequence and isinstance(spec, FixedLenSequenceFeature)
                and not spec.allow_missing):
            raise ConfigError(f"{what}: feature {key!r}: FixedLenSequenceFeature in an Example "
                              "requires allow_missing=True, as TensorFlow's.")
    return features


def _parse(cls: type, serialized: Any, what: str) -> Any:
    if isinstance(serialized, np.ndarray) and serialized.ndim == 0:
        serialized = serialized[()]
    if isinstance(serialized, str):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise ConfigError(f"{what} takes the serialized bytes of {article} {cls.__name__}, got "
                          "a str.")
    try:
        return cls.FromString(bytes(serialized) if not isinstance(serialized, bytes)
                              else serialized)
    except (DecodeError, TypeError) as e:
        raise DataError(f"{what}: could not parse a serialized {cls.__name__} ({e}); is the "
                        "record a tf.train." + cls.__name__ + "?") from e


_KIND_NAMES = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}


def _values(feature: Any, key: str, dtype: str, what: str) -> Any:
    """The feature's repeated values (None when its kind is unset: read as missing, as TF's
    fast parser does)."""
    kind = feature.WhichOneof("kind")
    if kind is None:
        return None
    field = KINDS[dtype][0]
    if kind != field:
        raise DataError(f"{what}: feature {key!r} holds {_KIND_NAMES[kind]} values but the "
                        f"spec asks for {dtype} (TF: \"Data types don't match\"); change the "
                        f"spec's dtype to {_KIND_NAMES[kind].replace('float', 'float32')}"
                        f"{'' if kind != 'bytes_list' else ' (string)'}.")
    return getattr(feature, field).value


def _array(values: Any, dtype: str) -> np.ndarray:
    if dtype == "string":
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out
    return np.array(values, dtype=KINDS[dtype][1])


def _fixed(values: Any, key: str, spec: FixedLenFeature, what: str) -> Any:
    if values is None:
        if spec.default_value is None:
            raise DataError(f"{what}: feature {key!r} ({spec.dtype}) is required but could "
                            "not be found; give FixedLenFeature a default_value, or use "
                            "VarLenFeature.")
        default = spec.default_value  # an array is copied: a parse's caller may write to it
        return default.copy() if isinstance(default, np.ndarray) else default
    shape = spec.shape
    n = len(values)
    if not shape:  # a scalar: no array made, the common case (labels, encoded images)
        if n != 1:
            raise DataError(f"{what}: feature {key!r} has {n} {spec.dtype} values but "
                            "FixedLenFeature(shape=[]) takes exactly 1; fix the shape or "
                            "use VarLenFeature.")
        v = values[0]
        return v if spec.dtype == "string" else KINDS[spec.dtype][1].type(v)
    if n != math.prod(shape):
        raise DataError(f"{what}: feature {key!r} has {n} {spec.dtype} values but "
                        f"FixedLenFeature(shape={list(shape)}) takes {math.prod(shape)}; fix "
                        "the shape or use VarLenFeature.")
    return _array(values, spec.dtype).reshape(shape)


def _sequence_in_example(values: Any, key: str, spec: FixedLenSequenceFeature,
                         what: str) -> np.ndarray:
    item = math.prod(spec.shape)
    if values is None:
        return np.zeros((0, *spec.shape), KINDS[spec.dtype][1])
    n = len(values)
    if item == 0 or n % item:
        raise DataError(f"{what}: feature {key!r} has {n} {spec.dtype} values, not a "
                        f"multiple of the {item} that FixedLenSequenceFeature(shape="
                        f"{list(spec.shape)}) takes per item.")
    return _array(values, spec.dtype).reshape((n // item, *spec.shape))


def _parse_features(feature_map: Any, features: Mapping[str, Any], what: str) -> dict:
    out = {}
    for key, spec in features.items():
        feature = feature_map.get(key)
        values = None if feature is None else _values(feature, key, spec.dtype, what)
        if isinstance(spec, FixedLenFeature):
            out[key] = _fixed(values, key, spec, what)
        elif isinstance(spec, VarLenFeature):
            out[key] = _array(values if values is not None else (), spec.dtype)
        else:
            out[key] = _sequence_in_example(values, key, spec, what)
    return out


def parse_single_example(serialized: bytes, features: Mapping[str, Any],
                         example_names: Any = None, name: str | None = None) -> dict:
    """tf.io.parse_single_example: one serialized Example -> {key: value} for each spec."""
    what = "parse_single_example"
    features = _check_spec(features, what)
    example = _parse(protos.Example, serialized, what)
    return _parse_features(example.features.feature, features, what)


def _pad_stack(arrays: Sequence[np.ndarray], pad: Any, dtype: str) -> np.ndarray:
    """Arrays of shape (n_i, *rest) -> (batch, max n_i, *rest), padded with `pad`."""
    rest = arrays[0].shape[1:] if arrays else ()
    longest = max((a.shape[0] for a in arrays), default=0)
    out = np.full((len(arrays), longest, *rest), pad, dtype=KINDS[dtype][1])
    for i, a in enumerate(arrays):
        out[i, :a.shape[0]] = a
    return out


def parse_example(serialized: Any, features: Mapping[str, Any], example_names: Any = None,
                  name: str | None = None) -> dict:
    """tf.io.parse_example: a batch (list or 1-D array) of serialized Examples -> {key:
    batched value}. FixedLenFeature values are stacked; VarLenFeature and
    FixedLenSequenceFeature values are padded to the batch's longest (with 0, b"" or the
    spec's default_value), which is what TF's SparseTensor gives through tf.sparse.to_dense."""
    what = "parse_example"
    features = _check_spec(features, what)
    if isinstance(serialized, bytes | str):
        raise ConfigError(f"{what} takes a batch (a list of serialized Examples); for one "
                          "Example use parse_single_example.")
    rows = [parse_single_example(s, features) for s in serialized]
    out = {}
    for key, spec in features.items():
        column = [row[key] for row in rows]
        if isinstance(spec, FixedLenFeature):
            if spec.dtype == "string":
                arr = np.empty((len(column), *spec.shape), dtype=object)
                for i, v in enumerate(column):
                    arr[i] = v
                out[key] = arr
            else:
                out[key] = np.asarray(column, KINDS[spec.dtype][1]).reshape(
                    (len(column), *spec.shape))
        else:
            pad = spec.default_value if isinstance(spec, FixedLenSequenceFeature) \
                and spec.default_value is not None else KINDS[spec.dtype][2]
            out[key] = _pad_stack(column, pad, spec.dtype) if column else np.zeros(
                (0, 0, *getattr(spec, "shape", ())), KINDS[spec.dtype][1])
    return out


def parse_single_sequence_example(serialized: bytes, context_features: Any = None,
                                  sequence_features: Any = None, example_name: Any = None,
                                  name: str | None = None) -> tuple[dict, dict]:
    """tf.io.parse_single_sequence_example: one serialized SequenceExample -> (context,
    sequences). A FixedLenSequenceFeature gives (steps, *shape); a VarLenFeature (steps,
    longest step) padded with 0 or b"" (TF: a SparseTensor)."""
    what = "parse_single_sequence_example"
    context_features = _check_spec(context_features, what)
    sequence_features = _check_spec(sequence_features, what, sequence=True)
    example = _parse(protos.SequenceExample, serialized, what)
    context = _parse_features(example.context.feature, context_features, what)
    lists = example.feature_lists.feature_list
    sequences = {}
    for key, spec in sequence_features.items():
        feature_list = lists.get(key)
        if feature_list is None:
            if isinstance(spec, FixedLenSequenceFeature) and not spec.allow_missing:
                raise DataError(f"{what}: feature list {key!r} is required but could not be "
                                "found; pass allow_missing=True to read it as empty.")
            shape = spec.shape if isinstance(spec, FixedLenSequenceFeature) else (0,)
            sequences[key] = np.zeros((0, *shape), KINDS[spec.dtype][1])
            continue
        steps = []
        for t, feature in enumerate(feature_list.feature):
            values = _values(feature, key, spec.dtype, what)
            values = values if values is not None else ()
            if isinstance(spec, FixedLenSequenceFeature):
                if len(values) != math.prod(spec.shape):
                    raise DataError(f"{what}: feature list {key!r}, step {t}, has "
                                    f"{len(values)} values but FixedLenSequenceFeature(shape="
                                    f"{list(spec.shape)}) takes {math.prod(spec.shape)}.")
                steps.append(_array(values, spec.dtype).reshape(spec.shape))
            else:
                steps.append(_array(values, spec.dtype))
        if isinstance(spec, FixedLenSequenceFeature):
            sequences[key] = (np.stack(steps) if steps
                              else np.zeros((0, *spec.shape), KINDS[spec.dtype][1]))
        else:
            sequences[key] = _pad_stack(steps, KINDS[spec.dtype][2], spec.dtype)
    return context, sequences


# -- writing -----------------------------------------------------------------------------------

def _fill(feature: Any, key: str, value: Any) -> None:
    """Put a Python or numpy value into a Feature, choosing the list kind from the values."""
    if isinstance(value, protos.Feature):
        feature.CopyFrom(value)
        return
    if isinstance(value, bytes | str | np.bytes_ | np.str_):
        feature.bytes_list.value.append(value.encode() if isinstance(value, str) else
                                        bytes(value))
        return
    if isinstance(value, bool | int | np.integer | np.bool_):
        feature.int64_list.value.append(int(value))
        return
    if isinstance(value, float | np.floating):
        feature.float_list.value.append(float(value))
        return
    arr = value if isinstance(value, np.ndarray) else np.asarray(
        value, dtype=object if _has_text(value) else None)
    flat = arr.reshape(-1)
    if flat.size == 0 and not isinstance(value, np.ndarray):
        raise ConfigError(f"serialize_example: feature {key!r} is an empty list, whose "
                          "kind cannot be told; pass np.zeros(0, np.int64), "
                          "np.zeros(0, np.float32) or pk.io.Feature().")
    if arr.dtype.kind in "SUO":
        items = flat.tolist()
        if arr.dtype.kind == "O" and not all(isinstance(v, bytes | str) for v in items):
            odd = next(v for v in items if not isinstance(v, bytes | str))
            raise ConfigError(f"serialize_example: feature {key!r} holds {odd!r} (a "
                              f"{type(odd).__name__}); an Example feature is a list of one "
                              "kind: bytes/str, int or float (leave a missing feature out).")
        feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else bytes(v)
                                        for v in items)
    elif arr.dtype.kind in "iub":
        feature.int64_list.value.extend(flat.astype(np.int64).tolist())
    elif arr.dtype.kind == "f":
        feature.float_list.value.extend(flat.astype(np.float32).tolist())
    else:
        raise ConfigError(f"serialize_example: feature {key!r} has values of type "
                          f"{arr.dtype}; an Example holds bytes/str, ints and floats.")


def _has_text(value: Any) -> bool:
    return isinstance(value, list | tuple) and any(
        isinstance(v, bytes | str | np.bytes_ | np.str_) for v in value)


def _features_proto(features: Any, values: Mapping[str, Any], what: str) -> None:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{what} takes a dict {{key: value}}, got a "
                          f"{type(values).__name__}.")
    for key, value in values.items():
        if not isinstance(key, str):
            raise ConfigError(f"{what}: key {key!r} is not a str; Example keys are strings.")
        _fill(features.feature[key], key, value)


def make_example(features: Mapping[str, Any]) -> Any:
    """A tf.train.Example message from {key: value}: bytes/str -> bytes_list, ints and bools
    -> int64_list, floats -> float_list; lists and numpy arrays (any shape, flattened) by
    their values' kind; a pk.io.Feature as it is."""
    example = protos.Example()
    _features_proto(example.features, features, "serialize_example")
    return example


def serialize_example(features: Mapping[str, Any]) -> bytes:
    """{key: value} -> a serialized tf.train.Example (see make_example for the kinds)."""
    return make_example(features).SerializeToString()


def serialize_sequence_example(context: Mapping[str, Any] | None = None,
                               feature_lists: Mapping[str, Sequence[Any]] | None = None,
                               ) -> bytes:
    """A serialized tf.train.SequenceExample: `context` as in serialize_example, and
    `feature_lists` {key: [value of step 0, value of step 1, ...]}."""
    what = "serialize_sequence_example"
    example = protos.SequenceExample()
    _features_proto(example.context, context or {}, what)
    for key, steps in (feature_lists or {}).items():
        feature_list = example.feature_lists.feature_list[key]
        for step in steps:
            _fill(feature_list.feature.add(), key, step)
    return example.SerializeToString()
