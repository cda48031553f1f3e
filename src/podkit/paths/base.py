"""The storage interface: a root holding objects named by '/'-separated keys, and the key rules.

The backends of the path layer (local.py, s3.py, gcs.py) implement it; checkpoints use it
directly, everything else through `podkit.paths`."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from podkit.errors import ConfigError, StorageError
from podkit.paths.retry import RetryPolicy

T = TypeVar("T")

TMP_SUFFIX = ".podkit-tmp"  # names a write in progress (local or a download); list() hides them


@dataclasses.dataclass(frozen=True)
class Entry:
    """One stored object: its key, its size in bytes and its version (an S3 ETag, a GCS
    generation, a local file's mtime and inode): what a cached download is keyed by and what a
    ranged read pins, so that a file replaced mid-read is an error, not a mix of two files."""

    key: str
    size: int
    version: str


def check_key(key: str, prefix: bool = False) -> str:
    """A key (or, with prefix=True, a key prefix) relative to the root: no leading '/', no
    '.' or '..' parts (which would leave the root on a local disk), no empty parts."""
    if not isinstance(key, str):
        raise ConfigError(f"storage key {key!r}: use a str with '/' separators.")
    parts = key.split("/")
    if prefix and parts[-1] == "":
        parts = parts[:-1]  # "step_1/" and "" are prefixes
    if (not prefix and not key) or any(p in ("", ".", "..") for p in parts) or "\0" in key:
        raise ConfigError(f"storage key {key!r}: use a relative key like 'step_0000000100/"
                          "COMMIT.json' (no leading '/', no '.', '..' or empty parts).")
    return key


class Storage(abc.ABC):
    """Checkpoint storage: a root (`url`) holding objects named by '/'-separated keys.

    `list(prefix)` matches keys by string prefix, as object stores do; `delete_prefix(prefix)`
    deletes like a directory: the key `prefix` and everything under `prefix/`, so deleting
    "step_1" never touches "step_10". Every operation is retried by `retry`.
    """

    url: str
    retry: RetryPolicy

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _where(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}" if key else self.url

    def _call(self, fn: Callable[[], T], op: str, key: str) -> T:
        return self.retry.call(fn, f"{op} {self._where(key)}")

    def _source(self, local: Path | str, key: str) -> Path:
        """The local file to upload, checked before any retry: a missing source is the
        caller's mistake, not a missing object."""
        local = Path(local)
        if not local.is_file():
            raise StorageError(f"uploading {local} to {self._where(key)} failed: {local} is "
                               "not a file; pass the path of an existing file.")
        return local

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing it atomically."""

    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; a missing one raises StorageError with .missing set."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object (not a directory) is stored under `key`."""

    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with `prefix`, recursively, sorted."""
        return [e.key for e in self.entries(prefix)]

    @abc.abstractmethod
    def entries(self, prefix: str = "") -> list[Entry]:
        """Every object whose key starts with `prefix`, recursively, sorted by key."""

    def any_under(self, prefix: str) -> bool:
        """Whether any object's key starts with `prefix` (one listed object is enough)."""
        return bool(self.entries(prefix))

    @abc.abstractmethod
    def children(self, prefix: str) -> list[str]:
        """The names one level below the directory `prefix` ("" = the root): objects and
        the first parts of longer keys (as os.listdir), sorted; [] when there is none."""

    def size(self, key: str) -> int:
        """The object's size in bytes."""
        return self.stat(key).size

    @abc.abstractmethod
    def stat(self, key: str) -> Entry:
        """The object's size and version; a missing one raises StorageError with .missing."""

    @abc.abstractmethod
    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        """Bytes [start, end) of the object (fewer past its end). With `version` (from
        stat()), a changed object raises StorageError instead of returning the new bytes."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; a missing one raises StorageError with .missing set."""

    @abc.abstractmethod
    def copy(self, key: str, target: str) -> None:
        """Copy the object `key` to `target` in the same storage (server-side remotely)."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete `prefix` and everything under `prefix/` (all of it for ""); fine if absent."""

    @abc.abstractmethod
    def upload_file(self, local: Path, key: str) -> None:
        """Store a local file under `key`, streaming it."""

    @abc.abstractmethod
    def download_file(self, key: str, local: Path) -> None:
        """Copy the object to a local file (written aside, then renamed into place)."""

    def local_dir(self) -> Path | None:
        """The root directory for local storage (Orbax writes into it directly); None for an
        object store."""
        return None
