"""Replacing a local file all at once: written aside, then renamed over the target, so that a
reader (or a crash) sees the whole old file, the whole new one, or nothing. Both local writes
(local.py) and object-store downloads (objects.py) land files this way."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from podkit.checkpoint.storage.base import TMP_SUFFIX


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems (FUSE, SMB) cannot fsync a directory
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


@contextmanager
def replacing(path: Path, durable: bool = True) -> Iterator[str]:
    """Yield the name of an empty temporary file beside `path` (whose directory must exist)
    to write; when the block ends, rename it over `path`. If the block (or the rename) fails,
    the temporary file is removed and `path` is untouched.

    durable: fsync the file before the rename and the directory after it, so that the new
    file survives a crash. A scratch copy (a download) skips both.

    The temporary file is in the same directory because a rename is atomic only within one
    file system; its name ends in TMP_SUFFIX, which list() hides."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.close(fd)  # the writer opens it by name: a download client takes a file name, not a file
    try:
        yield tmp
        if durable:
            # By name, not through the writer's file: a client may have renamed its own
            # temporary file onto `tmp`, and fsync flushes the file, whichever descriptor.
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)

