"""TFRecord files without TensorFlow: the framing, its CRCs, writing and reading.

A record is `uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)`,
little-endian, as TensorFlow's `tf.io.TFRecordWriter` writes it (tensorflow/core/lib/io/
record_writer.cc). A file may be compressed as a whole: "GZIP" (a gzip stream) or "ZLIB" (a
zlib stream with its header), as `tf.io.TFRecordOptions(compression_type=...)`.

    with pk.io.TFRecordWriter("train-00000.tfrecord") as w:
        w.write(pk.io.serialize_example({"label": 3, "image": jpeg_bytes}))
    for record in pk.io.tf_record_iterator("train-00000.tfrecord"):
        ...

A corrupt record (a CRC that does not match) or a truncated file is a `DataError` naming the
file and the byte offset of the record (in the decompressed stream for a compressed file).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import io as _stdio
import os
import struct
import threading
import weakref
import zlib
from collections.abc import Iterator
from typing import IO, Any

import google_crc32c
import numpy as np

from podkit.errors import ConfigError, DataError
from podkit.io import files

_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")   # masked CRC of the data
HEADER_BYTES, FOOTER_BYTES = _HEADER.size, _FOOTER.size
_COMPRESSIONS = ("", "GZIP", "ZLIB")
_READ_BLOCK = 1 << 20


def masked_crc32c(data: bytes | memoryview) -> int:
    """TensorFlow's masked CRC-32C (crc32c.h `Mask`): the CRC rotated right by 15 bits plus a
    constant, so that a CRC of data that itself holds CRCs stays well distributed."""
    crc = google_crc32c.value(bytes(data)) if isinstance(data, memoryview) else \
        google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def compression_of(value: Any, what: str = "compression_type") -> str:
    """None/""/"GZIP"/"ZLIB" or TFRecordOptions -> "", "GZIP" or "ZLIB" (a ConfigError
    otherwise), as tf.io accepts them."""
    if isinstance(value, TFRecordOptions):
        return value.compression_type
    if value is None:
        return ""
    if isinstance(value, str) and value.upper() in _COMPRESSIONS:
        return value.upper()
    raise ConfigError(f"{what}={value!r}; pass None, '', 'GZIP' or 'ZLIB' (or "
                      "pk.io.TFRecordOptions(compression_type=...)).")


@dataclasses.dataclass(frozen=True)
class TFRecordOptions:
    """tf.io.TFRecordOptions: how a TFRecord file is compressed. `compression_level` is
    zlib's 0-9 (None: zlib's default, 6, as TensorFlow's)."""

    compression_type: str | None = None
    compression_level: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression_type", compression_of(self.compression_type))
        level = self.compression_level
        if level is not None and (not isinstance(level, int) or not -1 <= level <= 9):
            raise ConfigError(f"compression_level={level!r}; pass an int from 0 to 9 or None.")


def _options(options: Any) -> TFRecordOptions:
    return options if isinstance(options, TFRecordOptions) else TFRecordOptions(
        compression_of(options, "options"))


def frame(record: bytes) -> bytes:
    """One record as the bytes a TFRecord file holds."""
    header = struct.pack("<Q", len(record))
    return b"".join((header, _FOOTER.pack(masked_crc32c(header)), record,
                     _FOOTER.pack(masked_crc32c(record))))


class _ZlibWriter:
    """A file object that compresses what is written into one zlib stream (TF's "ZLIB")."""

    def __init__(self, raw: IO[bytes], level: int) -> None:
        self._raw, self._z = raw, zlib.compressobj(level)

    def write(self, data: bytes) -> None:
        self._raw.write(self._z.compress(data))

    def flush(self) -> None:
        self._raw.write(self._z.flush(zlib.Z_SYNC_FLUSH))
        self._raw.flush()

    def close(self) -> None:
        self._raw.write(self._z.flush())
        self._raw.close()


class TFRecordWriter:
    """tf.io.TFRecordWriter: writes records (bytes) to a TFRecord file.

    `path` may be local or `gs://`/`s3://` (through podkit.paths); the file appears whole when
    the writer is closed (written under a temporary name, then renamed or uploaded), and a
    `with` block that raises leaves no file. A writer never closed is closed when it is
    collected or the interpreter exits, so its records are kept, as TF's writer keeps them;
    `flush()` does not make them visible before (TF's does). `options`: None, "GZIP", "ZLIB" or a
    TFRecordOptions.
    """

    def __init__(self, path: str | os.PathLike, options: Any = None) -> None:
        self.path = os.fspath(path)
        self.options = _options(options)
        self._sink = files.AtomicWrite(self.path)
        raw = self._sink.open()
        level = 6 if self.options.compression_level in (None, -1) else \
            self.options.compression_level
        if self.options.compression_type == "GZIP":
            # mtime=0: the same records give the same bytes (TF's gzip header has no time).
            self._out: Any = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=level,
                                           mtime=0)
            self._raw: IO[bytes] | None = raw
        elif self.options.compression_type == "ZLIB":
            self._out, self._raw = _ZlibWriter(raw, level), None
        else:
            self._out, self._raw = raw, None
        self._closed = False
        # Never closed (no `with`, no close()): finished when the writer is collected or the
        # interpreter exits, as TF's writer leaves its records in the file.
        self._finalizer = weakref.finalize(self, _finish, self._out, self._raw, self._sink)

    def write(self, record: bytes | str | bytearray | memoryview | np.bytes_) -> None:
        """Append one record (a str is written as UTF-8, as TF's writer does)."""
        if self._closed:
            raise ConfigError(f"TFRecordWriter({self.path!r}) is closed; open a new one.")
        if isinstance(record, str):
            record = record.encode()
        elif not isinstance(record, bytes | bytearray | memoryview | np.bytes_):
            raise ConfigError(f"TFRecordWriter.write takes bytes, got a "
                              f"{type(record).__name__}; serialize it first, e.g. "
                              "pk.io.serialize_example({...}).")
        self._out.write(frame(bytes(record)))

    def flush(self) -> None:
        """Push what was written so far to the (temporary) file."""
        self._out.flush()

    def close(self) -> None:
        """Finish the file: it appears at `path` now."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _finish(self._out, self._raw, self._sink)

    def _abort(self) -> None:
        self._closed = True
        self._finalizer.detach()
        try:
            self._out.close()
            if self._raw is not None:
                self._raw.close()
        finally:
            self._sink.abort()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abort()


def _finish(out: Any, raw: Any, sink: Any) -> None:
    out.close()
    if raw is not None:  # GzipFile leaves the file object it was given open
        raw.close()
    sink.commit()


def _corrupt(path: str, offset: int, what: str, compressed: bool, start: bytes = b"",
             ) -> DataError:
    where = f"byte offset {offset}" + (" of the decompressed stream" if compressed else "")
    kind = _compressed_kind(start) if offset == 0 and not compressed else None
    if kind is not None:  # read as a plain file, but it is a compressed stream
        return DataError(f"TFRecord file {path!r}: {what} at {where}; the file starts as a "
                         f"{kind} stream does: pass compression_type={kind!r}.")
    return DataError(f"TFRecord file {path!r}: {what} at {where}. The file is damaged; "
                     "write it again, or skip bad records with Dataset.ignore_errors().")


def _compressed_kind(start: bytes) -> str | None:
    """"GZIP" or "ZLIB" when a file's first bytes are that format's header."""
    if start[:2] == b"\x1f\x8b":
        return "GZIP"
    if len(start) >= 2 and start[0] == 0x78 and (start[0] << 8 | start[1]) % 31 == 0:
        return "ZLIB"  # RFC 1950: deflate, and a header check that divides by 31
    return None


def check_header(header: bytes, path: str, offset: int, compressed: bool = False) -> int:
    """The data length a 12-byte header gives, its CRC checked."""
    if len(header) < HEADER_BYTES:
        raise _corrupt(path, offset, f"truncated record (a {len(header)}-byte header of "
                       f"{HEADER_BYTES})", compressed)
    length, length_crc = _HEADER.unpack_from(header)
    if masked_crc32c(header[:8]) != length_crc:
        raise _corrupt(path, offset, "corrupt record (the length's CRC does not match)",
                       compressed, header)
    return length


def check_body(body: bytes, length: int, path: str, offset: int, compressed: bool = False,
               ) -> bytes:
    """The data of a record from what follows its header (data + CRC), its CRC checked."""
    if len(body) < length + FOOTER_BYTES:
        raise _corrupt(path, offset, f"truncated record ({len(body)} of "
                       f"{length + FOOTER_BYTES} bytes after the header)", compressed)
    data = body[:length]
    if masked_crc32c(data) != _FOOTER.unpack_from(body, length)[0]:
        raise _corrupt(path, offset, "corrupt record (the CRC of its data, at byte "
                       f"{offset + HEADER_BYTES}, does not match)", compressed)
    return data


def parse_framed(framed: bytes, path: str, offset: int) -> bytes:
    """A whole framed record (header, data, CRC) read in one piece -> its data, checked."""
    length = check_header(framed[:HEADER_BYTES], path, offset)
    return check_body(framed[HEADER_BYTES:], length, path, offset)


def read_record(stream: IO[bytes], path: str, offset: int, compressed: bool = False,
                ) -> bytes | None:
    """The record that starts at `offset` of `stream` (positioned there), its CRCs checked;
    None at the clean end of the file."""
    header = stream.read(HEADER_BYTES)
    if not header:
        return None
    length = check_header(header, path, offset, compressed)
    return check_body(stream.read(length + FOOTER_BYTES), length, path, offset, compressed)


def _decompressed(raw: IO[bytes], compression: str) -> IO[bytes]:
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "ZLIB":
        return _stdio.BufferedReader(_ZlibReader(raw), _READ_BLOCK)
    return raw


class _ZlibReader(_stdio.RawIOBase):
    """A readable stream of one zlib stream's decompressed bytes."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw, self._z, self._pending = raw, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            if self._z.eof:
                return 0
            chunk = self._raw.read(_READ_BLOCK)
            if not chunk:
                if self._z.eof:
                    return 0
                raise zlib.error("the zlib stream ends early")
            self._pending = self._z.decompress(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def iterate(path: str, compression: str = "", start: int = 0, skip: int = 0,
            ) -> Iterator[tuple[int, bytes]]:
    """(offset, record) of a TFRecord file in order, from byte `start` (uncompressed files),
    after dropping the first `skip` records; CRCs checked."""
    compressed = bool(compression)
    with _opened(path) as raw:
        if start:
            raw.seek(start)
        try:
            stream = _decompressed(raw, compression)
            offset, n = start, 0
            while True:
                record = read_record(stream, path, offset, compressed)
                if record is None:
                    return
                if n >= skip:
                    yield offset, record
                n += 1
                offset += HEADER_BYTES + len(record) + FOOTER_BYTES
        except (OSError, EOFError, zlib.error) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise DataError(f"TFRecord file {path!r}: the {compression or 'file'} stream "
                            f"cannot be read ({e}); is it complete, and is compression_type="
                            f"{compression or None!r} right?") from e


def _opened(path: str) -> IO[bytes]:
    """A TFRecord file opened for reading; a missing or unreadable one is a DataError."""
    try:
        return files.open_read(path)
    except FileNotFoundError as e:
        raise DataError(f"TFRecord file {path!r} does not exist; check the path (for a "
                        "pattern, pk.data.Dataset.list_files or a glob).") from e
    except OSError as e:
        raise DataError(f"TFRecord file {path!r} cannot be opened ({e}).") from e


def tf_record_iterator(path: str | os.PathLike, options: Any = None) -> Iterator[bytes]:
    """The records of one TFRecord file in order (tf.compat.v1.io.tf_record_iterator)."""
    compression = _options(options).compression_type
    for _, record in iterate(os.fspath(path), compression):
        yield record


def index(path: str | os.PathLike, buffer_size: int | None = None) -> np.ndarray:
    """The byte offsets of an uncompressed TFRecord file's records, and the file's end
    (int64, one more than the records), found in one pass that checks every record.

    As tf.data, a file is read up to its first bad record (a CRC that fails, a truncated
    end): that record becomes the last entry and runs to the end of the file, so reading it
    raises the DataError where TF raises its DataLossError, and `ignore_errors()` ends the
    file there, as TF's does."""
    path = os.fspath(path)
    starts, offset = [], 0
    with _opened(path) as raw:
        stream = _stdio.BufferedReader(raw, buffer_size or _READ_BLOCK) if not isinstance(
            raw, _stdio.BufferedReader) else raw
        while True:
            try:
                record = read_record(stream, path, offset)
            except DataError:
                starts.append(offset)
                offset = _size(raw)
                break
            if record is None:
                break
            starts.append(offset)
            offset += HEADER_BYTES + len(record) + FOOTER_BYTES
    return np.asarray([*starts, offset], np.int64)


def _size(f: IO[bytes]) -> int:
    return f.seek(0, os.SEEK_END)


# Local files kept open at once by the RecordFiles of a process, least recently read first:
# ImageNet's 1,024 training shards must not hold 1,024 descriptors (a common `ulimit -n`).
MAX_OPEN_FILES = 128
_OPEN_FDS: collections.OrderedDict[int, RecordFile] = collections.OrderedDict()
_OPEN_LOCK = threading.RLock()


def _open_fd(record_file: RecordFile) -> int:
    """Open `record_file`'s local file (its own lock held), first closing the least recently
    read files of other RecordFiles that are not being read when MAX_OPEN_FILES are open."""
    try:
        fd = os.open(record_file.path, os.O_RDONLY)
    except FileNotFoundError as e:
        raise DataError(f"TFRecord file {record_file.path!r} no longer exists (it was "
                        "indexed when the dataset was made); was it moved or deleted?") from e
    except OSError as e:
        raise DataError(f"TFRecord file {record_file.path!r} cannot be opened ({e}).") from e
    with _OPEN_LOCK:
        _OPEN_FDS[id(record_file)] = record_file
        for key in list(_OPEN_FDS):
            if len(_OPEN_FDS) <= MAX_OPEN_FILES:
                break
            other = _OPEN_FDS[key]
            if other is not record_file:
                other.close_if_idle()
    return fd


class RecordFile:
    """Random access to the records of one uncompressed TFRecord file, by the offsets of
    `index` (each record read in one piece and checked).

    A local file is read with os.pread (no shared position: safe from reader threads); a
    remote one by ranged reads of at least `block` bytes, kept, so records read in order
    cost one request per block. Opened on first use in each process and never pickled open
    (a dataset's source travels to input worker processes as its path)."""

    def __init__(self, path: str, block: int = _READ_BLOCK) -> None:
        self.path, self.block = path, block
        self.remote = files.is_url(path)
        self._fd: int | None = None
        self._handle: Any = None
        self._at, self._cached = -1, b""
        self._lock = threading.Lock()

    def read(self, start: int, end: int) -> bytes:
        """The record framed in bytes [start, end) of the file."""
        with self._lock:  # reader threads share it: one open, and no read of a closed fd
            if not self.remote:
                if self._fd is None:
                    self._fd = _open_fd(self)
                else:
                    with _OPEN_LOCK:
                        _OPEN_FDS.move_to_end(id(self))
                framed = os.pread(self._fd, end - start, start)
            else:
                if not (self._at <= start and end <= self._at + len(self._cached)):
                    if self._handle is None:
                        self._handle = _opened(self.path)
                    self._handle.seek(start)
                    self._at, self._cached = start, self._handle.read(
                        max(end - start, self.block))
                framed = self._cached[start - self._at:end - self._at]
        return parse_framed(framed, self.path, start)

    def close(self) -> None:
        with self._lock:
            self._close_fd()
            if self._handle is not None:
                self._handle.close()
                self._handle = None

    def close_if_idle(self) -> None:
        """Close the local file unless a read holds it right now (a read opens it again)."""
        if self._lock.acquire(blocking=False):
            try:
                self._close_fd()
            finally:
                self._lock.release()

    def _close_fd(self) -> None:
        """Close the local file (the caller holds the lock); read() opens it again."""
        if self._fd is not None:
            with _OPEN_LOCK:
                _OPEN_FDS.pop(id(self), None)
            os.close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict:
        return {"path": self.path, "block": self.block}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["block"])  # type: ignore[misc]

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing to do
            pass
