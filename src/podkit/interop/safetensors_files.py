"""Reading safetensors files as memory maps: one file, or a Hugging Face sharded checkpoint
(`model.safetensors.index.json` naming the file of each tensor).

    tensors = SafetensorsDir(directory)        # model.safetensors or its sharded index
    tensors.names(); tensors.shape("w"); tensors.read("w")[2:4]   # only those rows are read

The format is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte offsets) and the raw data. Tensors are numpy views of a memory map of the
file, so a slice reads only its pages: a checkpoint streams to its devices a piece at a time
and is never loaded whole into host memory. The safetensors package itself cannot hand numpy
a bfloat16 tensor (most LLM checkpoints are bfloat16); ml_dtypes gives numpy that dtype.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from podkit.errors import InputError

DTYPES: dict[str, Any] = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class SafetensorsFile:
    """One .safetensors file: its tensors as views of a read-only memory map."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{self.path} is not a readable safetensors file ({e}).") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._start = 8 + length
        self._map: np.memmap | None = None

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def read(self, name: str) -> np.ndarray:
        """The tensor as a read-only view (nothing is read until it is indexed or copied)."""
        entry = self._entries[name]
        if entry["dtype"] not in DTYPES:
            raise InputError(f"{self.path}: tensor {name!r} has dtype {entry['dtype']}, which "
                             f"podkit does not read (it reads {', '.join(DTYPES)}).")
        if self._map is None:
            self._map = np.memmap(self.path, np.uint8, mode="r")
        begin, end = entry["data_offsets"]
        raw = self._map[self._start + begin:self._start + end]
        return raw.view(DTYPES[entry["dtype"]]).reshape(entry["shape"])


class SafetensorsDir:
    """A model directory's tensors: `model.safetensors`, or the shards its index names."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        index = self.directory / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise InputError(f"{index} is not a safetensors index (no weight_map: "
                                 f"{e}).") from None
            files = {name: SafetensorsFile(self.directory / name)
                     for name in sorted(set(weight_map.values()))}
            self._where = {tensor: files[name] for tensor, name in weight_map.items()}
        elif (self.directory / SINGLE).is_file():
            single = SafetensorsFile(self.directory / SINGLE)
            self._where = dict.fromkeys(single.names(), single)
        else:
            raise InputError(f"{self.directory} holds neither {SINGLE} nor {INDEX}: a Hugging "
                             "Face model directory keeps its weights in safetensors files "
                             "(save_pretrained writes them; .bin checkpoints are not read).")

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return self._file(name).shape(name)

    def read(self, name: str) -> np.ndarray:
        return self._file(name).read(name)

    def _file(self, name: str) -> SafetensorsFile:
        if name not in self._where:
            raise InputError(f"{self.directory}: no tensor {name!r} in its safetensors files "
                             f"({len(self._where)} tensors, e.g. "
                             f"{', '.join(sorted(self._where)[:3])}).")
        return self._where[name]
