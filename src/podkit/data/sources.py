"""Random-access sources: in-memory tensors, ranges, text lines and ArrayRecord files.

Files are named by local paths, `gs://` or `s3://` URLs, read through podkit.paths."""

from __future__ import annotations

import bisect
import glob
import os
import tempfile
import threading
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from podkit import paths
from podkit.data import structure
from podkit.errors import ConfigError, DataError, InputError


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


def as_path(value: Any) -> str:
    """A file name as str: list_files' elements are bytes (as tf.data's are), or arrays."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode()
    return os.fspath(value)


def file_patterns(files: Any, what: str) -> list[str]:
    """A path, URL or pattern, or a sequence of them (str, bytes, PathLike), as strs."""
    single = isinstance(files, str | bytes | np.bytes_ | os.PathLike) or (
        isinstance(files, np.ndarray) and files.ndim == 0)
    patterns = [files] if single else list(files)
    if not patterns:
        raise InputError(f"{what} got no files; pass a path, a glob pattern or a list of them.")
    return [as_path(p) for p in patterns]


def match_files(pattern: str) -> list[str]:
    """The files a path or glob pattern names (local, gs:// or s3://), sorted; [] if none.

    A file that exists is itself, glob characters and all (`data[1].tfrecord`: tf.data's
    readers open the names they are given). A pattern matches as tf.io.gfile.glob does
    (a wildcard matches names that start with '.' too); local directories are left out."""
    local = not paths.is_url(pattern)
    if paths.exists(pattern) and not (local and os.path.isdir(pattern)):
        return [pattern]
    if glob.has_magic(pattern):
        return [m for m in paths.glob(pattern, include_hidden=True)
                if paths.is_url(m) or not os.path.isdir(m)]
    return []


def expand_files(files: str | os.PathLike | Sequence[str | os.PathLike], what: str) -> list[str]:
    """Paths, URLs (gs://, s3://) or glob patterns -> existing files, in the order given (each
    pattern sorted). A pattern that matches nothing is an InputError naming it."""
    out: list[str] = []
    for pattern in file_patterns(files, what):
        matches = match_files(pattern)
        if not matches:
            if paths.isdir(pattern):
                raise InputError(f"{what}: {pattern!r} is a directory; pass files or a pattern "
                                 f"such as {paths.join(pattern, '*')!r}.")
            raise InputError(f"{what}: no file matches {pattern!r}; check the path or pattern.")
        out.extend(matches)
    return out


def local_file(path: str) -> str:
    """A local path to read `path` from: the path itself, or for a URL the copy that
    paths.local_copy downloads once per process (while the object is unchanged) and keeps
    until the process exits; it needs the disk space."""
    with paths.local_copy(path) as local:
        return local


SCAN_BYTES = 16 << 20  # TextLines finds line ends in blocks of this size
REMOTE_BLOCK = 1 << 20  # a remote line is read with the lines after it, in one ranged read


def _line_ends(path: str) -> tuple[np.ndarray, int]:
    """(offsets of every b"\\n", the file's size), the file read in SCAN_BYTES blocks: its
    size in memory is the offsets', never the file's."""
    found, offset = [], 0
    with paths.open(path, "rb") as f:
        while block := f.read(SCAN_BYTES):
            found.append(np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n")) + offset)
            offset += len(block)
    return (np.concatenate(found) if found else np.zeros(0, np.int64)), offset


class TextLines:
    """Lines of text files without their line ends, as bytes; random access by line offsets
    (found at construction by scanning each file in blocks, as a stream). A remote file is
    read by ranged reads of REMOTE_BLOCK bytes, kept per file: reading lines in order costs
    one request per block."""

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
        self._remote: dict[int, Any] = {}  # file -> (handle, block start, block), per process
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.starts)

    def _read(self, k: int, start: int, end: int) -> bytes:
        path = self.files[k]
        if not paths.is_url(path):
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(end - start)
        with self._lock:  # one handle per file, shared by Grain's threads
            handle, at, block = self._remote.get(k) or (paths.open(path, "rb"), -1, b"")
            if not at <= start or end > at + len(block):
                handle.seek(start)
                at, block = start, handle.read(max(end - start, REMOTE_BLOCK))
            self._remote[k] = (handle, at, block)
            return block[start - at:end - at]

    def __getitem__(self, i: int) -> bytes:
        line = self._read(int(self.which[i]), int(self.starts[i]), int(self.ends[i]))
        return line[:-1] if line.endswith(b"\r") else line

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_remote": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


# tf.data's compression types -> zlib's window bits (GZIP: gzip header; ZLIB: zlib header)
COMPRESSIONS = {"GZIP": 16 + zlib.MAX_WBITS, "ZLIB": zlib.MAX_WBITS}


def compression_type(value: Any, what: str) -> str:
    """tf.data's compression_type: None or "" (plain files), "GZIP" or "ZLIB"."""
    if value is None or value == "":
        return ""
    if value not in COMPRESSIONS:
        raise ConfigError(f"{what}(compression_type={value!r}); pass None or \"\" (plain), "
                          "\"GZIP\" or \"ZLIB\", as tf.data.")
    return value


def compressed_lines(path: str, compression: str, buffer_size: int | None = None,
                     ) -> Iterator[bytes]:
    """The lines of a GZIP or ZLIB file (tf.data's compression types), read in order."""
    wbits = COMPRESSIONS[compression]
    chunk = buffer_size or (256 << 10)
    pending = b""
    with paths.open(path, "rb") as f:
        inflate = zlib.decompressobj(wbits)
        while True:
            raw = f.read(chunk)
            if not raw:
                break
            try:
                data = inflate.decompress(raw)
                # concatenated gzip members (what `cat a.gz b.gz` makes) read as one stream
                while inflate.eof and inflate.unused_data:
                    rest = inflate.unused_data
                    inflate = zlib.decompressobj(wbits)
                    data += inflate.decompress(rest)
            except zlib.error as e:
                raise DataError(f"TextLineDataset: {path!r} is not a valid {compression} file "
                                f"({e}); check compression_type.") from e
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line[:-1] if line.endswith(b"\r") else line
        if not inflate.eof:
            raise DataError(f"TextLineDataset: {path!r} ends before its {compression} stream "
                            "does (a truncated file?).")
    if pending:
        yield pending[:-1] if pending.endswith(b"\r") else pending


# Batched reads (ArrayRecord's fan out over threads) pay when this process has idle cores; on
# one core, or in an input worker (every core busy computing), one read at a time is cheaper
# (ArrayRecord, one core: ~15 us per record one by one, ~25 us batched). Workers set it False.
BATCHED_READS = len(os.sched_getaffinity(0)) > 1 if hasattr(os, "sched_getaffinity") else True


class ArrayRecords:
    """ArrayRecord files as one sequence of records (bytes), with random access.

    One reader per file, opened on first use in each process (so the source pickles as its
    file names, for worker processes). A read is one call into the C++ reader: a few
    microseconds less per record than going through Grain's data source, which matters when
    every core is busy decoding. The C++ reader needs local files: a `gs://` or `s3://` file is
    downloaded once per process (local_file), and worker processes read that copy.
    `skip` leading records of each file are not part of the data (cache()'s header).
    """

    def __init__(self, files: list[str], skip: int = 0) -> None:
        from array_record.python.array_record_module import ArrayRecordReader

        counts = []
        self.local = [local_file(path) for path in files]
        for path, local in zip(files, self.local, strict=True):
            try:
                reader = ArrayRecordReader(local, "readahead_buffer_size:0")
                counts.append(reader.num_records() - skip)
                reader.close()
            except Exception as e:  # the reader's own message does not say which file
                raise InputError(f"ArrayRecordDataset: could not open {path!r}: {e}; is it an "
                                 "ArrayRecord file (written by write_array_record)?") from e
        self.files, self.skip = files, skip
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._starts = self.starts.tolist()  # for bisect: a numpy call per record costs 1 us
        self._readers: list[Any] = [None] * len(files)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _reader(self, k: int) -> Any:
        reader = self._readers[k]
        if reader is None:
            from array_record.python.array_record_module import ArrayRecordReader

            reader = self._readers[k] = ArrayRecordReader(self.local[k],
                                                          "readahead_buffer_size:0")
        return reader

    def __getitem__(self, i: int) -> bytes:
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} of {len(self)}")
        k = bisect.bisect_right(self._starts, i) - 1
        return self._reader(k).read([i - self._starts[k] + self.skip])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        """Many records. With idle cores, one batched read per file (the C++ reader fans out
        over threads); on a busy or single core, one read per record, which costs less."""
        keys = np.asarray(indices, np.int64)
        which = np.searchsorted(self.starts, keys, side="right") - 1
        positions = (keys - self.starts[which] + self.skip).tolist()
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
    """Write a dataset of bytes elements to `num_shards` ArrayRecord files, local or at a
    `gs://` / `s3://` prefix.

    Elements go to the shards in contiguous runs, so reading the files in order gives back
    the dataset's order. A dataset of unknown length (from_generator, filter) is written as it
    comes: into the one file, or, with several shards, into a local spool file first that is
    then cut into the shards. Each file is written locally and renamed or uploaded when
    complete: a killed writer never leaves a file that looks whole, and on an error nothing
    this call wrote remains.
    Returns the file names: `<path_prefix>-00000-of-00004.array_record`, ...
    """
    from array_record.python.array_record_module import ArrayRecordReader

    if not isinstance(num_shards, int) or isinstance(num_shards, bool) or num_shards < 1:
        raise ConfigError(f"num_shards={num_shards!r}; pass a positive int.")
    if not isinstance(dataset, list | tuple) and not hasattr(dataset, "cardinality"):
        raise InputError(f"write_array_record takes a pk.data Dataset or a list of bytes, not "
                         f"a {type(dataset).__name__}; e.g. write_array_record([b'...', ...], "
                         "prefix).")
    # A list of records is the everyday case: its length is its cardinality.
    n = len(dataset) if isinstance(dataset, list | tuple) else dataset.cardinality()
    if n == -1:  # INFINITE_CARDINALITY (constants is not imported here: sources sits below)
        raise InputError("write_array_record got an endless dataset (repeat() without a "
                         "count); write a finite one, e.g. .take(n).")
    prefix = as_path(path_prefix)
    names = [f"{prefix}-{i:05d}-of-{num_shards:05d}.array_record" for i in range(num_shards)]
    it = iter(dataset)
    written: list[str] = []
    spool = ""
    try:
        records = (_record(j, e) for j, e in enumerate(it))
        if n < 0 and num_shards > 1:  # unknown length: count it in a spool file, then cut
            near = None if paths.is_url(prefix) else os.path.dirname(os.path.abspath(prefix))
            if near:
                os.makedirs(near, exist_ok=True)
            fd, spool = tempfile.mkstemp(suffix=".array_record.tmp", dir=near)
            os.close(fd)
            n = _write_records(spool, records)
            reader = ArrayRecordReader(spool, "readahead_buffer_size:0")
            records = _read_all(reader, n)
        bounds = [n * i // num_shards for i in range(num_shards + 1)] if n >= 0 else None
        for shard, name in enumerate(names):
            count = None if bounds is None else bounds[shard + 1] - bounds[shard]
            with paths.staged(name) as local:
                _write_records(local, records, count)
            written.append(name)
    except BaseException:
        # Nothing half-written stays behind: not the open shard (staged), not the shards of
        # this call (an incomplete set would read as a shorter dataset).
        for path in written:
            if paths.exists(path):
                paths.remove(path)
        raise
    finally:
        if hasattr(it, "close"):
            it.close()
        if spool and os.path.exists(spool):
            os.remove(spool)
    return names


def _record(j: int, element: Any) -> bytes:
    if isinstance(element, str):
        element = element.encode()
    if not isinstance(element, bytes | np.bytes_):
        raise InputError(
            f"write_array_record: element {j} is a {type(element).__name__}, not bytes; "
            "serialize first, e.g. .map(lambda x: x.tobytes()).")
    return bytes(element)


def _write_records(path: str, records: Iterator[bytes], count: int | None = None) -> int:
    """Write `count` records (None: all) of the iterator to an ArrayRecord file at `path`."""
    from array_record.python.array_record_module import ArrayRecordWriter

    writer = ArrayRecordWriter(path, "group_size:1")
    written = 0
    try:
        while count is None or written < count:
            record = next(records, None)
            if record is None:
                break
            writer.write(record)
            written += 1
    finally:
        writer.close()
    return written


def _read_all(reader: Any, n: int, chunk: int = 1024) -> Iterator[bytes]:
    try:
        for start in range(0, n, chunk):
            yield from reader.read(list(range(start, min(n, start + chunk))))
    finally:
        reader.close()
