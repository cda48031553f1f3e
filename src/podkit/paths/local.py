"""Local directories: atomic writes per object (temporary file, fsync, rename, fsync of the
directory), as a PUT is on an object store."""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from podkit.paths.atomic import fsync_dir, replacing
from podkit.paths.base import TMP_SUFFIX, Entry, Storage, check_key
from podkit.paths.retry import Changed as _Changed
from podkit.paths.retry import RetryPolicy


def file_version(st: os.stat_result) -> str:
    """A local file's version: its mtime and inode (a file replaced by a rename is a new
    inode, even within the file system's clock resolution)."""
    return f"{st.st_mtime_ns}:{st.st_ino}"


def _makedirs(path: Path) -> None:
    """mkdir -p, fsyncing the parent of every directory made, so that the new file's path
    survives a crash along with the file."""
    missing = []
    while not path.is_dir() and path.parent != path:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass  # made concurrently (another process), or a file: the write names it
        fsync_dir(d.parent)


def _atomic_write(path: Path, write: Callable[[BinaryIO], Any], durable: bool = True) -> None:
    """Write a temporary file beside `path` with `write(f)`, then rename it over `path`; on
    any failure the temporary file is removed and `path` is untouched."""
    _makedirs(path.parent)
    with replacing(path, durable) as tmp, open(tmp, "wb") as f:
        write(f)


def _rmtree(path: Path) -> None:
    """rmtree that tolerates entries vanishing meanwhile (another process deleting too)."""
    def ignore_missing(func: Any, p: str, exc: Any) -> None:
        e = exc if isinstance(exc, BaseException) else exc[1]
        if not isinstance(e, FileNotFoundError):
            raise e

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=ignore_missing)
    else:  # pragma: no cover - Python 3.11
        shutil.rmtree(path, onerror=ignore_missing)


def _raise_unless_missing(e: OSError) -> None:
    """os.walk's onerror: an unreadable directory is an error (os.walk skips it silently
    otherwise), one that is not there is an empty listing."""
    if not isinstance(e, FileNotFoundError):
        raise e


class LocalStorage(Storage):
    """A directory (created on the first write). Writes are atomic per file: a temporary file
    in the same directory, fsynced, renamed over the key, and the directory fsynced."""

    def __init__(self, root: Path, retry: RetryPolicy) -> None:
        self.root, self.retry = Path(root).expanduser().absolute(), retry
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._call(lambda: _atomic_write(path, lambda f: f.write(data)), "writing", key)

    def read_bytes(self, key: str) -> bytes:
        return self._call(self._path(key).read_bytes, "reading", key)

    def exists(self, key: str) -> bool:
        return self._call(self._path(key).is_file, "looking up", key)

    def entries(self, prefix: str = "") -> list[Entry]:
        check_key(prefix, prefix=True)

        def walk() -> list[Entry]:
            # Walk only the directory the prefix is in, not the whole root.
            base = self.root / prefix.rpartition("/")[0]
            out = []
            for dirpath, _, files in os.walk(base, onerror=_raise_unless_missing):
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in files:
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix) and not name.endswith(TMP_SUFFIX):
                        st = os.stat(os.path.join(dirpath, name))
                        out.append(Entry(key, st.st_size, file_version(st)))
            return sorted(out, key=lambda e: e.key)

        return self._call(walk, "listing", prefix)

    def children(self, prefix: str) -> list[str]:
        path = self.root / check_key(prefix, prefix=True).rstrip("/")

        def listdir() -> list[str]:
            try:
                return sorted(n for n in os.listdir(path) if not n.endswith(TMP_SUFFIX))
            except FileNotFoundError:
                return []

        return self._call(listdir, "listing", prefix)

    def stat(self, key: str) -> Entry:
        path = self._path(key)

        def stat() -> Entry:
            st = path.stat()
            if not path.is_file():
                raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
            return Entry(key, st.st_size, file_version(st))

        return self._call(stat, "sizing", key)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            with open(path, "rb") as f:
                if version is not None and file_version(os.fstat(f.fileno())) != version:
                    raise _Changed(f"{path} changed while it was read (version {version})")
                f.seek(start)
                return f.read(max(0, end - start))

        return self._call(read, "reading", key)

    def delete(self, key: str) -> None:
        path = self._path(key)
        self._call(path.unlink, "deleting", key)

    def copy(self, key: str, target: str) -> None:
        src, dst = self._path(key), self._path(target)

        def copy() -> None:
            with open(src, "rb") as f:
                _atomic_write(dst, lambda out: shutil.copyfileobj(f, out, 1 << 20))

        self._call(copy, "copying", key)

    def delete_prefix(self, prefix: str) -> None:
        check_key(prefix, prefix=True)
        path = self.root / prefix.rstrip("/")

        def delete() -> None:
            if path == self.root:  # everything: empty the root, keep it (local_dir)
                for child in (self.root.iterdir() if self.root.is_dir() else ()):
                    if child.is_dir() and not child.is_symlink():
                        _rmtree(child)
                    else:
                        child.unlink(missing_ok=True)
            elif path.is_dir() and not path.is_symlink():
                _rmtree(path)
            else:
                path.unlink(missing_ok=True)

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        src, path = self._source(local, key), self._path(key)

        def upload() -> None:
            with open(src, "rb") as f:
                _atomic_write(path, lambda out: shutil.copyfileobj(f, out, 1 << 20))

        self._call(upload, "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        path, local = self._path(key), Path(local)

        def download() -> None:
            with open(path, "rb") as f:  # opened first: a missing key leaves nothing behind
                # a scratch copy: no fsync (the checkpoint itself is what must be durable)
                _atomic_write(local, lambda out: shutil.copyfileobj(f, out, 1 << 20),
                              durable=False)

        self._call(download, "downloading", key)

    def local_dir(self) -> Path:
        return self.root
