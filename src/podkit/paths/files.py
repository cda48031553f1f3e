"""File objects over any place: `open(path, mode)`.

Reading an object reads it by ranges (`RangeReader`, buffered by io.BufferedReader), so a
reader can seek to a record's offset without downloading the whole object; every range is
pinned to the version the file was opened on. Writing goes to a temporary file (beside the
target when local, in the temporary directory when remote) that is put in place when the file
is closed: renamed over the target, or uploaded. A `with` block that raises, or a file dropped
without close(), leaves the target as it was.
"""

from __future__ import annotations

import builtins
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from podkit.errors import ConfigError
from podkit.paths.atomic import file_mode
from podkit.paths.base import TMP_SUFFIX, Storage
from podkit.paths.retry import RetryPolicy
from podkit.paths.storage import Place, bucket_storage, parse

READ_BUFFER = 1 << 20  # bytes per ranged GET of a remote file: one round trip per MiB
MODES = ("rb", "wb", "r", "w")


class RangeReader(io.RawIOBase):
    """A read-only, seekable raw file over one stored object, read by ranges."""

    def __init__(self, storage: Storage, key: str, url: str) -> None:
        super().__init__()
        entry = storage.stat(key)
        self.storage, self.key, self.name = storage, key, url
        self.length, self.version, self.pos = entry.size, entry.version, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}.get(whence)
        if base is None:
            raise ConfigError(f"seek(whence={whence!r}) on {self.name}: use 0, 1 or 2.")
        if base + offset < 0:
            raise ConfigError(f"seek to {base + offset} in {self.name}: offsets are >= 0.")
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self.length - self.pos)
        if want <= 0:
            return 0
        data = self.storage.read_range(self.key, self.pos, self.pos + want, self.version)
        view[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        data = self.storage.read_range(self.key, self.pos, self.length, self.version)
        self.pos += len(data)
        return data


class AtomicWriter(io.BufferedWriter):
    """A file written aside and handed to `commit(tmp)` when closed; discarded (nothing
    committed) when its `with` block raises or it is dropped unclosed."""

    def __init__(self, tmp: str, commit: Callable[[str], None], name: str) -> None:
        super().__init__(io.FileIO(tmp, "w"), buffer_size=READ_BUFFER)
        self._tmp, self._commit, self._discarded = tmp, commit, False
        self.target = name

    def discard(self) -> None:
        self._discarded = True

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
            if not self._discarded:
                self._commit(self._tmp)
        finally:
            if os.path.exists(self._tmp):
                os.unlink(self._tmp)

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is not None:
            self.discard()
        self.close()

    def __del__(self) -> None:
        if not self.closed:  # dropped without close(): an error path, not a finished file
            self.discard()
            self.close()


class AtomicTextWriter(io.TextIOWrapper):
    """Text over an AtomicWriter, with the same rule for a raising `with` block."""

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is not None:
            self.buffer.discard()
        self.close()

    def __del__(self) -> None:
        if not self.closed:
            self.buffer.discard()
            self.close()


def _local_writer(path: Path, place: Place) -> AtomicWriter:
    retry = RetryPolicy()
    retry.call(lambda: path.parent.mkdir(parents=True, exist_ok=True), f"creating {path.parent}")
    fd, tmp = retry.call(lambda: tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                                  suffix=TMP_SUFFIX), f"writing {path}")
    os.close(fd)

    def commit(tmp: str) -> None:
        os.chmod(tmp, file_mode())  # mkstemp's 0o600 is not what open() would have made
        retry.call(lambda: os.replace(tmp, path), f"writing {path}")

    return AtomicWriter(tmp, commit, place.url)


def object_key(place: Place) -> str:
    """The key of the object `place` names; ConfigError for a bucket itself."""
    if not place.key:
        raise ConfigError(f"{place.url!r} is a bucket, not a file: name an object in it "
                          f"({place.url}/file).")
    return place.key


def _remote_writer(place: Place) -> AtomicWriter:
    key = object_key(place)  # before any client is made
    storage = bucket_storage(place)
    fd, tmp = tempfile.mkstemp(prefix="podkit-upload-", suffix=TMP_SUFFIX)
    os.close(fd)
    return AtomicWriter(tmp, lambda tmp: storage.upload_file(Path(tmp), key), place.url)


def open(path: str | os.PathLike, mode: str = "r", *, encoding: str = "utf-8",
         newline: str | None = None, buffer_size: int = READ_BUFFER) -> IO:
    """A file object for a local path, `s3://bucket/key` or `gs://bucket/key`.

    mode "r" (the default, text, as builtins.open's and tf.io.gfile.GFile's) or "rb": a
    remote file is read by ranged GETs, buffered and seekable. mode "wb"/"w": written to a
    temporary file and put in place (renamed, or uploaded) on close, all at once;
    if the `with` block raises, nothing is written. Text modes take `encoding` and `newline`
    as builtins.open does. `buffer_size`: the bytes of one ranged GET of a remote read (every
    read fetches at least this much: a reader that seeks to small records at random offsets
    passes less; a sequential scan gains from more). Errors are StorageError (`.missing` for a
    file that is not there) naming the path, or ConfigError for a malformed URL or mode.

        with paths.open("gs://bucket/data/x.tfrecord", "rb") as f:
            f.seek(offset); header = f.read(12)
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ConfigError(f"buffer_size={buffer_size!r}: use a number of bytes >= 1.")
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r} for {os.fspath(path)!r}: the path layer opens files "
                          f"with {', '.join(map(repr, MODES))} (no appending or updating: "
                          "objects are written whole).")
    place = parse(path)
    if mode.startswith("r"):
        if place.remote:
            key = object_key(place)
            raw = RangeReader(bucket_storage(place), key, place.url)
            binary: IO = io.BufferedReader(raw, buffer_size=buffer_size)
        else:
            binary = RetryPolicy().call(lambda: builtins.open(place.key, "rb"),
                                        f"opening {place.key}")
        return binary if mode == "rb" else io.TextIOWrapper(binary, encoding=encoding,
                                                             newline=newline)
    writer = _remote_writer(place) if place.remote else _local_writer(Path(place.key), place)
    return writer if mode == "wb" else AtomicTextWriter(writer, encoding=encoding,
                                                        newline=newline)
