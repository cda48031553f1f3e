"""How pk.io reaches files: through podkit.paths (local paths, gs://, s3://).

Three operations: open a file to read (seekable; ranged reads for a URL), tell one version of
a file from another (for cached indexes), and write a file that appears whole or not at all.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

from podkit import paths


def is_url(path: str) -> bool:
    return paths.is_url(path)


def open_read(path: str) -> IO[bytes]:
    """A seekable binary file object for `path` (a plain file when local: the fast path)."""
    if paths.is_url(path):
        return paths.open(path, "rb")
    return open(path, "rb")  # the caller closes it


def version(path: str) -> str:
    """What identifies this version of the file: size and mtime, or the object's version
    (S3 ETag, GCS generation)."""
    if paths.is_url(path):
        entry = paths.stat(path)
        return f"{entry.size}:{entry.version}"
    st = os.stat(path)
    return f"{st.st_size}:{st.st_mtime_ns}"


class AtomicWrite:
    """A file written at a staging path and put in place by `commit()` (renamed, or
    uploaded); `abort()` leaves nothing. Through `paths.staged`, for local paths and URLs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._staged: Any = paths.staged(path)
        self._tmp = os.fspath(self._staged.__enter__())
        self._f: IO[bytes] | None = None

    def open(self) -> IO[bytes]:
        self._f = open(self._tmp, "wb")  # closed by the writer or by commit()/abort()
        return self._f

    def commit(self) -> None:
        if self._f is not None and not self._f.closed:
            self._f.close()
        self._staged.__exit__(None, None, None)

    def abort(self) -> None:
        if self._f is not None and not self._f.closed:
            self._f.close()
        error = sys.exc_info()[1] or RuntimeError(f"writing {self.path} abandoned")
        self._staged.__exit__(type(error), error, error.__traceback__)
