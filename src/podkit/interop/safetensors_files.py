"""Reading safetensors files: one file, or a Hugging Face sharded checkpoint
(`model.safetensors.index.json` naming the file of each tensor), local or on gs:// / s3://.

    tensors = SafetensorsDir(directory)        # model.safetensors or its sharded index
    tensors.names(); tensors.shape("w"); tensors.read("w")[2:4]   # only those rows are read

The format is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte offsets) and the raw data. A local file's tensors are numpy views of a memory
map of the file, so a slice reads only its pages: a checkpoint streams to its devices a piece
at a time and is never loaded whole into host memory. A remote file (through podkit.paths) is
read by ranges: its header by one ranged GET, each tensor by one ranged GET of its bytes when
it is first read, pinned to the object's version when the file was opened. Nothing is written
to local disk (a downloaded copy of a 70B checkpoint would need 140 GB of it on every host),
and host memory holds the tensors being placed, not the checkpoint. The safetensors package
itself cannot hand numpy a bfloat16 tensor (most LLM checkpoints are bfloat16); ml_dtypes
gives numpy that dtype.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import IO, Any

import ml_dtypes
import numpy as np

from podkit import paths
from podkit.errors import InputError, StorageError

DTYPES: dict[str, Any] = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class SafetensorsFile:
    """One .safetensors file: its tensors as views of a read-only memory map (local), or
    read by ranges when first asked for (gs://, s3://)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.remote = paths.is_url(self.path)
        self._file: IO | None = None
        self._lock = threading.Lock()
        f = paths.open(self.path, "rb")  # a missing or denied object: StorageError, named
        try:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError,
                MemoryError, OverflowError) as e:
            f.close()
            raise InputError(f"{self.path} is not a readable safetensors file ({e}).") from None
        if self.remote:
            self._file = f  # kept open: every later range reads the version opened here
        else:
            f.close()
        self.metadata = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._start = 8 + length
        self._map: np.memmap | None = None

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def read(self, name: str) -> np.ndarray:
        """The tensor, read-only: locally a view (nothing is read until it is indexed or
        copied); remotely its bytes, fetched now by one ranged read."""
        entry = self._entries[name]
        if entry["dtype"] not in DTYPES:
            raise InputError(f"{self.path}: tensor {name!r} has dtype {entry['dtype']}, which "
                             f"podkit does not read (it reads {', '.join(DTYPES)}).")
        begin, end = entry["data_offsets"]
        if self.remote:
            with self._lock:
                assert self._file is not None
                self._file.seek(self._start + begin)
                raw = self._file.read(end - begin)
            if len(raw) != end - begin:
                raise InputError(f"{self.path} ends inside tensor {name!r} ({len(raw)} of its "
                                 f"{end - begin} bytes): a truncated upload.")
            raw = np.frombuffer(raw, np.uint8)
        else:
            if self._map is None:
                self._map = np.memmap(self.path, np.uint8, mode="r")
            raw = self._map[self._start + begin:self._start + end]
        return raw.view(DTYPES[entry["dtype"]]).reshape(entry["shape"])


class SafetensorsDir:
    """A model directory's tensors (local, gs:// or s3://): `model.safetensors`, or the
    shards its index names. A storage failure (a missing object, denied access) is the path
    layer's StorageError naming the URL and the cause."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        index = paths.join(self.directory, INDEX)
        single = paths.join(self.directory, SINGLE)
        if paths.exists(index):
            try:
                with paths.open(index, "r") as f:
                    weight_map = json.loads(f.read())["weight_map"]
                files = {name: SafetensorsFile(paths.join(self.directory, name))
                         for name in sorted(set(weight_map.values()))}
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise InputError(f"{index} is not a safetensors index (no weight_map: "
                                 f"{e}).") from None
            except StorageError as e:
                if not e.missing:
                    raise
                raise InputError(f"{index} names a shard that is not there ({e}).") from None
            self._where = {tensor: files[name] for tensor, name in weight_map.items()}
        elif paths.exists(single):
            single_file = SafetensorsFile(single)
            self._where = dict.fromkeys(single_file.names(), single_file)
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
