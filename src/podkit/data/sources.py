"""Random-access sources: in-memory tensors, ranges, text lines and ArrayRecord files."""

from __future__ import annotations

import bisect
import glob
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from podkit.data import structure
from podkit.errors import ConfigError, InputError


def _as_tensors(value: Any) -> Any:
    """from_tensor_slices' input as arrays: tuples and dicts are structure, and a list is one
    tensor, as tf.data reads them. Bytes and strings stay Python objects (a numpy "S" array
    would drop their trailing zero bytes)."""
    if isinstance(value, dict):
        return {k: _as_tensors(v) for k, v in value.items()}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_as_tensors(v) for v in value)
    if isinstance(value, list):
        text = any(isinstance(v, bytes | str) for v in value)
        return np.asarray(value, dtype=object if text else None)
    return structure.map_structure(np.asarray, value)


class Slices:
    """from_tensor_slices: element i is the i-th row of every leaf."""

    def __init__(self, tensors: Any) -> None:
        tensors = _as_tensors(tensors)
        sizes = structure.map_structure(lambda a: a.shape[0] if a.ndim else None, tensors)
        flat = structure.leaves(sizes)
        if not flat:
            raise InputError("from_tensor_slices got an empty structure; pass arrays.")
        if any(s is None for s in flat):
            raise InputError(
                f"from_tensor_slices needs arrays with a leading dim to slice, got shapes "
                f"{structure.describe(tensors)}; wrap scalars in a list.")
        if len(set(flat)) > 1:
            raise InputError(
                f"from_tensor_slices got leading dims {sizes} (shapes "
                f"{structure.describe(tensors)}); every array must have the same first dim.")
        self.tensors, self.n = tensors, flat[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return structure.map_structure(lambda a: a[i], self.tensors)


class Range:
    """Dataset.range: int64 scalars, like tf.data."""

    def __init__(self, start: int, stop: int, step: int) -> None:
        if step == 0:
            raise ConfigError("range() step must not be 0.")
        self.start, self.stop, self.step = start, stop, step
        self.n = len(range(start, stop, step))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(self.start + i * self.step)


class Elements:
    """A list of already-computed elements (from_sequence and cache())."""

    def __init__(self, elements: Sequence[Any]) -> None:
        self.elements = elements

    def __len__(self) -> int:
        return len(self.elements)

    def __getitem__(self, i: int) -> Any:
        return self.elements[i]


def expand_files(files: str | os.PathLike | Sequence[str | os.PathLike], what: str) -> list[str]:
    """Paths or glob patterns -> existing files, in the order given (each pattern sorted)."""
    patterns = [files] if isinstance(files, str | os.PathLike) else list(files)
    if not patterns:
        raise InputError(f"{what} got no files; pass a path, a glob pattern or a list of them.")
    out: list[str] = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
            [pattern] if os.path.exists(pattern) else [])
        if not matches:
            raise InputError(f"{what}: no file matches {pattern!r}; check the path or pattern.")
        for m in matches:
            if os.path.isdir(m):
                raise InputError(f"{what}: {m!r} is a directory; pass files or a pattern such "
                                 f"as {os.path.join(m, '*')!r}.")
        out.extend(matches)
    return out


SCAN_BYTES = 16 << 20  # TextLines finds line ends in blocks of this size


def _line_ends(path: str) -> tuple[np.ndarray, int]:
    """(offsets of every b"\\n", the file's size), the file read in SCAN_BYTES blocks: its
    size in memory is the offsets', never the file's."""
    found, offset = [], 0
    with open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            found.append(np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n")) + offset)
            offset += len(block)
    return (np.concatenate(found) if found else np.zeros(0, np.int64)), offset


class TextLines:
    """Lines of text files without their line ends, as bytes; random access by line offsets
    (found at construction by scanning each file in blocks, as a stream)."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        starts, ends, which = [], [], []
        for f, path in enumerate(files):
            nl, size = _line_ends(path)
            s = np.concatenate([[0], nl + 1])
            e = np.concatenate([nl, [size]])
            if len(s) and s[-1] == size:  # a final newline ends the last line
                s, e = s[:-1], e[:-1]
            starts.append(s)
            ends.append(e)
            which.append(np.full(len(s), f, np.int32))
        self.starts = np.concatenate(starts).astype(np.int64)
        self.ends = np.concatenate(ends).astype(np.int64)
        self.which = np.concatenate(which)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> bytes:
        with open(self.files[self.which[i]], "rb") as f:
            f.seek(self.starts[i])
            line = f.read(int(self.ends[i] - self.starts[i]))
        return line[:-1] if line.endswith(b"\r") else line


# Batched reads (ArrayRecord's fan out over threads) pay when this process has idle cores; on
# one core, or in an input worker (every core busy computing), one read at a time is cheaper
# (ArrayRecord, one core: ~15 us per record one by one, ~25 us batched). Workers set it False.
BATCHED_READS = len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else True


class ArrayRecords:
    """ArrayRecord files as one sequence of records (bytes), with random access.

    One reader per file, opened on first use in each process (so the source pickles as its
    file names, for worker processes). A read is one call into the C++ reader: a few
    microseconds less per record than going through Grain's data source, which matters when
    every core is busy decoding.
    """

    def __init__(self, files: list[str]) -> None:
        from array_record.python.array_record_module import ArrayRecordReader

        counts = []
        for path in files:
            try:
                reader = ArrayRecordReader(path, "readahead_buffer_size:0")
                counts.append(reader.num_records())
                reader.close()
            except Exception as e:  # the reader's own message does not say which file
                raise InputError(f"ArrayRecordDataset: could not open {path!r}: {e}; is it an "
                                 "ArrayRecord file (written by write_array_record)?") from e
        self.files = files
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._starts = self.starts.tolist()  # for bisect: a numpy call per record costs 1 us
        self._readers: list[Any] = [None] * len(files)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _reader(self, k: int) -> Any:
        reader = self._readers[k]
        if reader is None:
            from array_record.python.array_record_module import ArrayRecordReader

            reader = self._readers[k] = ArrayRecordReader(self.files[k],
                                                          "readahead_buffer_size:0")
        return reader

    def __getitem__(self, i: int) -> bytes:
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} of {len(self)}")
        k = bisect.bisect_right(self._starts, i) - 1
        return self._reader(k).read([i - self._starts[k]])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        """Many records. With idle cores, one batched read per file (the C++ reader fans out
        over threads); on a busy or single core, one read per record, which costs less."""
        keys = np.asarray(indices, np.int64)
        which = np.searchsorted(self.starts, keys, side="right") - 1
        positions = (keys - self.starts[which]).tolist()
        if not BATCHED_READS:
            which_list = which.tolist()
            return [self._reader(k).read([p])[0] for k, p in zip(which_list, positions,
                                                                  strict=True)]
        out: list[Any] = [None] * len(keys)
        for k in np.unique(which):
            sel = np.flatnonzero(which == k)
            records = self._reader(int(k)).read([positions[j] for j in sel])
            for j, record in zip(sel, records, strict=True):
                out[j] = record
        return out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_readers": [None] * len(self.files)}


def write_array_record(dataset: Any, path_prefix: str | os.PathLike, num_shards: int = 1,
                       ) -> list[str]:
    """Write a dataset of bytes elements to `num_shards` ArrayRecord files.

    Elements go to the shards in contiguous runs, so reading the files in order gives back
    the dataset's order. Each file is written under a temporary name and renamed when
    complete: a killed writer never leaves a file that looks whole, and on an error nothing
    this call wrote remains.
    Returns the file names: `<path_prefix>-00000-of-00004.array_record`, ...
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    if not isinstance(num_shards, int) or num_shards < 1:
        raise ConfigError(f"num_shards={num_shards!r}; pass a positive int.")
    if not isinstance(dataset, list | tuple) and not hasattr(dataset, "cardinality"):
        raise InputError(f"write_array_record takes a pk.data Dataset or a list of bytes, not "
                         f"a {type(dataset).__name__}; e.g. write_array_record([b'...', ...], "
                         "prefix).")
    # A list of records is the everyday case: its length is its cardinality.
    n = len(dataset) if isinstance(dataset, list | tuple) else dataset.cardinality()
    if n < 0:
        raise InputError("write_array_record needs a finite dataset of known cardinality; add "
                         ".take(n) or drop filter().")
    prefix = os.fspath(path_prefix)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    names = [f"{prefix}-{i:05d}-of-{num_shards:05d}.array_record" for i in range(num_shards)]
    bounds = [n * i // num_shards for i in range(num_shards + 1)]
    it = iter(dataset)
    written: list[str] = []
    tmp = ""
    try:
        for shard, name in enumerate(names):
            tmp = name + ".tmp"
            writer = ArrayRecordWriter(tmp, "group_size:1")
            try:
                for j in range(bounds[shard], bounds[shard + 1]):
                    element = next(it)
                    if isinstance(element, str):
                        element = element.encode()
                    if not isinstance(element, bytes | np.bytes_):
                        raise InputError(
                            f"write_array_record: element {j} is a {type(element).__name__}, "
                            "not bytes; serialize first, e.g. .map(lambda x: x.tobytes()).")
                    writer.write(bytes(element))
            finally:
                writer.close()
            os.replace(tmp, name)
            written.append(name)
    except BaseException:
        # Nothing half-written stays behind: not the open shard, not the shards of this call
        # (an incomplete set would read as a shorter dataset).
        for path in [tmp, *written]:
            if path and os.path.exists(path):
                os.remove(path)
        raise
    finally:
        if hasattr(it, "close"):
            it.close()
    return names
