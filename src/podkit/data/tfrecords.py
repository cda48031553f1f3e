"""pk.data.TFRecordDataset's sources: TFRecord files as records (bytes), as tf.data reads them.

Uncompressed files have random access: a one-pass index of each file's record offsets
(every record framed and checked, up to the first bad one, as tf.data reads) is built when
the dataset is made (so its cardinality is known) and cached under
`$PODKIT_CACHE/tfrecord-index` (default ~/.cache/podkit), keyed by the path and the file's
version (size and mtime, or the object's ETag/generation) — never beside the data, which may
be read-only or remote — so shuffle, shard, exact resume and fit()'s per-process split work
as on ArrayRecord. Each read checks the record's length and data CRCs again. A remote file is
read once more for its index on the first run (each host of a pod keeps its own cache);
later runs read only the index. GZIP and ZLIB files have no offsets to seek to and are read
in order, file after file: a stream.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from podkit.data.constants import UNKNOWN_CARDINALITY
from podkit.data.ops.base import Node
from podkit.data.ops.source import Source
from podkit.data.stream import Context, FilesStream, Stream
from podkit.errors import DataError
from podkit.io import files as io_files
from podkit.io import tfrecord

INDEX_THREADS = 8  # files indexed at once when a dataset is made


def cache_dir() -> Path:
    """Where record indexes are kept: `$PODKIT_CACHE/tfrecord-index`."""
    from podkit.paths import cache_root

    return cache_root() / "tfrecord-index"


def _index_key(path: str) -> str:
    where = path if io_files.is_url(path) else os.path.abspath(path)
    return hashlib.sha256(f"{where}\0{io_files.version(path)}".encode()).hexdigest()[:32]


# Then a flag (int64: 1 when the file is damaged), then the offsets, all little-endian int64.
# Version 1 files had no flag: they are read as missing and built again.
_MAGIC = b"PKTFIDX2"


class FileIndex(NamedTuple):
    """One file's record offsets and end (tfrecord.index) and whether its last entry is a
    damaged record (a CRC that fails, a truncated end) that reading raises on."""

    offsets: np.ndarray
    damaged: bool


def _last_is_damaged(path: str, offsets: np.ndarray, buffer_size: int | None) -> bool:
    """tfrecord.index ends a file at its first bad record, kept as the last entry so that
    reading it raises as tf.data does; read that entry once to know which files have one."""
    if len(offsets) < 2:
        return False
    reader = tfrecord.RecordFile(path, buffer_size or (1 << 20))
    try:
        reader.read(int(offsets[-2]), int(offsets[-1]))
    except DataError:
        return True
    finally:
        reader.close()
    return False


def cached_index(path: str, buffer_size: int | None = None) -> FileIndex:
    """The file's record offsets and end (tfrecord.index) and its damage, from the cache or
    found now and cached (written under a temporary name and renamed: readers never see half
    a file).

    The cache file is raw int64s behind a magic: read on indexing threads, so not through
    np.load, whose header parsing (ast) is not thread-safe on CPython 3.11."""
    folder = cache_dir()
    target = folder / f"{_index_key(path)}.idx"
    head = len(_MAGIC) + 8
    try:
        data = target.read_bytes()
        if data[:len(_MAGIC)] == _MAGIC and (len(data) - head) % 8 == 0 and len(data) > head:
            flag = int.from_bytes(data[len(_MAGIC):head], "little")
            return FileIndex(np.frombuffer(data, "<i8", offset=head).astype(np.int64),
                             bool(flag))
    except OSError:
        pass  # not there, or unreadable: build it again
    offsets = tfrecord.index(path, buffer_size)
    damaged = _last_is_damaged(path, offsets, buffer_size)
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".index-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + int(damaged).to_bytes(8, "little")
                    + offsets.astype("<i8").tobytes())
        os.replace(tmp, target)
    except OSError:  # a read-only or full cache costs a scan per construction, nothing else
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
    return FileIndex(offsets, damaged)


def interleave_order(counts: Sequence[int], cycle: int) -> np.ndarray:
    """The records' global indices in the order tf.data's interleave (and TFRecordDataset's
    num_parallel_reads) reads files: `cycle` files open, one record from each in turn, a
    finished file's slot refilled with the next file when the turn comes back to it
    (tensorflow/core/kernels/data/interleave_dataset_op.cc)."""
    first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
    slots: list[list[int] | None] = [None] * cycle
    out: list[int] = []
    at, next_file, open_files = 0, 0, 0
    while next_file < len(counts) or open_files:
        slot = slots[at]
        if slot is not None:
            f, pos = slot
            if pos < counts[f]:
                out.append(first[f] + pos)
                slot[1] += 1
            else:
                slots[at], open_files = None, open_files - 1
            at = (at + 1) % cycle
        elif next_file < len(counts):
            slots[at], next_file, open_files = [next_file, 0], next_file + 1, open_files + 1
        else:
            at = (at + 1) % cycle
    return np.asarray(out, np.int64)


class TFRecords:
    """Records of uncompressed TFRecord files as one random-access sequence of bytes: file
    after file, or with `cycle` > 1 in tf.data's num_parallel_reads order."""

    def __init__(self, files: list[str], buffer_size: int | None = None,
                 cycle: int | None = None) -> None:
        # Files are indexed on threads: a remote scan waits on the network, a local one on
        # the disk, and the CRCs run in C.
        with ThreadPoolExecutor(min(INDEX_THREADS, max(1, len(files)))) as pool:
            found = list(pool.map(lambda p: cached_index(p, buffer_size), files))
        indexes = [index.offsets for index in found]
        # Reading these raises at their last entry, so their element count is not defined.
        self.damaged = [f for f, index in zip(files, found, strict=True) if index.damaged]
        starts = [offsets[:-1] for offsets in indexes]
        ends = [offsets[1:] for offsets in indexes]
        counts = [len(s) for s in starts]
        self.files = files
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.starts = np.concatenate(starts) if starts else np.zeros(0, np.int64)
        self.ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
        self._first = self.first.tolist()  # bisect on a list: a numpy call costs ~1 us
        self._readers = [tfrecord.RecordFile(p, buffer_size or (1 << 20)) for p in files]
        self.order = None if not cycle or cycle == 1 else interleave_order(
            [len(x) for x in starts], cycle)

    def __len__(self) -> int:
        """The entries, a damaged file's bad record included (reading it raises)."""
        return int(self.first[-1])

    def __getitem__(self, i: int) -> bytes:
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} of {len(self)}")
        if self.order is not None:
            i = int(self.order[i])
        k = bisect.bisect_right(self._first, i) - 1
        return self._readers[k].read(int(self.starts[i]), int(self.ends[i]))

    def __repr__(self) -> str:
        return f"tfrecord{self.files}"


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TFRecordSource(Source):
    """TFRecordDataset of plain files: random access by the index. Its cardinality is the
    record count when every file is whole; when one is damaged, UNKNOWN, which is what
    tf.data says of every TFRecordDataset: iterating raises at the bad record, and with
    ignore_errors() the file ends there, so no count of elements holds for both."""

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY if self.source.damaged else len(self.source)


def compressed_records(path: str, compression: str, skip: int = 0) -> Iterator[bytes]:
    """The records of one compressed file in order, the first `skip` left out."""
    for _, record in tfrecord.iterate(path, compression, skip=skip):
        yield record


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CompressedTFRecords(Node):
    """TFRecordDataset of GZIP or ZLIB files: read in order, file after file (a stream, its
    cardinality unknown, as tf.data's)."""

    files: tuple[str, ...]
    compression: str
    name = "tfrecord"

    def describe_args(self) -> dict[str, Any]:
        return {"files": list(self.files), "compression": self.compression}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def varies(self) -> bool:
        return False

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return CompressedStream(self.files, self.compression)


class CompressedStream(FilesStream):
    """The records of compressed files; the state is (file, records read of it)."""

    key = "count"

    def __init__(self, files: Sequence[str], compression: str) -> None:
        super().__init__(files)
        self._compression = compression

    def open(self, path: str, skip: int) -> Iterator[bytes]:
        return compressed_records(path, self._compression, skip)
