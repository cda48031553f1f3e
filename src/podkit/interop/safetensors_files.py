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


# -- writing -------------------------------------------------------------------------------------
NAMES = {np.dtype(v).name if v is not ml_dtypes.bfloat16 else "bfloat16": k
         for k, v in DTYPES.items()}
SHARD_BYTES = 5 * 1000**3  # transformers' default max_shard_size ("5GB")


def _code(dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in NAMES:
        raise InputError(f"dtype {name} has no safetensors code (podkit writes "
                         f"{', '.join(sorted(NAMES))}).")
    return NAMES[name]


def write_file(path: str | os.PathLike, tensors: list[tuple[str, tuple, Any, Any]],
               metadata: dict[str, str] | None = None) -> None:
    """One .safetensors file of `tensors`: (name, shape, dtype, make) with `make()` giving the
    array when its turn comes, so that one tensor at a time is in host memory."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {})}
    offset = 0
    for name, shape, dtype, _ in tensors:
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _code(dtype), "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the format asks
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, dtype, make in tensors:
            array = np.ascontiguousarray(make(), dtype=dtype)
            if array.shape != tuple(shape):
                raise InputError(f"tensor {name!r} came out {array.shape}, not {tuple(shape)}.")
            f.write(memoryview(array.reshape(-1).view(np.uint8)))


def write_checkpoint(directory: str | os.PathLike, tensors: list[tuple[str, tuple, Any, Any]],
                     max_shard_bytes: int = SHARD_BYTES) -> list[str]:
    """`tensors` as transformers' save_pretrained lays them out: model.safetensors, or past
    `max_shard_bytes` model-0000i-of-0000n.safetensors shards and model.safetensors.index.json.
    Returns the files written."""
    directory = Path(directory)
    shards: list[list] = [[]]
    size = 0
    total = 0
    for entry in tensors:
        nbytes = int(np.prod(entry[1], dtype=np.int64)) * np.dtype(entry[2]).itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
        total += nbytes
    metadata = {"format": "pt"}  # what transformers checks for a PyTorch-loadable file
    if len(shards) == 1:
        write_file(directory / SINGLE, shards[0], metadata)
        return [SINGLE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards, strict=True):
        write_file(directory / name, shard, metadata)
    index = {"metadata": {"total_size": total},
             "weight_map": {t[0]: name for name, shard in zip(names, shards, strict=True)
                            for t in shard}}
    (directory / INDEX).write_text(json.dumps(index, indent=2))
    return [*names, INDEX]
