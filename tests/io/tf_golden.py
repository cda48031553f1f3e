"""Reading tests/golden/tf/ (written by TensorFlow, make_tf_fixtures.py) without TensorFlow."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

import podkit as pk

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tf"


def load(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())


def unhex(values: list[str]) -> list[bytes]:
    return [bytes.fromhex(v) for v in values]


def plain(value) -> dict:
    """A parsed value as the fixture script writes TF's: dtype, shape, flat values."""
    arr = np.asarray(value, dtype=object) if isinstance(value, bytes) else np.asarray(value)
    flat = arr.reshape(-1).tolist()
    if arr.dtype == object:
        return {"dtype": "string", "shape": list(arr.shape), "values": [v.hex() for v in flat]}
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "values": flat}


def _default(d):
    if isinstance(d, dict):
        h = d["hex"]
        return [bytes.fromhex(x) for x in h] if isinstance(h, list) else bytes.fromhex(h)
    return d


def spec(s: dict):
    """A pk.io spec from the fixture's JSON of a tf.io spec."""
    if s["kind"] == "FixedLenFeature":
        return pk.io.FixedLenFeature(s["shape"], s["dtype"], _default(s["default_value"]))
    if s["kind"] == "VarLenFeature":
        return pk.io.VarLenFeature(s["dtype"])
    return pk.io.FixedLenSequenceFeature(s["shape"], s["dtype"], s["allow_missing"],
                                         _default(s["default_value"]))


def specs(d: dict) -> dict:
    return {k: spec(v) for k, v in d.items()}


def digest(arr: np.ndarray) -> dict:
    arr = np.ascontiguousarray(arr)
    return {"shape": list(arr.shape), "dtype": arr.dtype.name,
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
