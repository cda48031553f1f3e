"""Replacing a local file all at once: written aside, then renamed over the target, so that a
reader (or a crash) sees the whole old file, the whole new one, or nothing. Both local writes
(local.py) and object-store downloads (objects.py) land files this way."""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from podkit.paths.base import TMP_SUFFIX


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


@functools.cache  # read once: the umask of a process does not change under it
def file_mode() -> int:
    """The mode a new file gets from open() under this process's umask (0o644 under the usual
    022): mkstemp's files are 0o600, which would leave checkpoints unreadable to the group
    that shares a run directory. The umask is read from /proc, not set and restored with
    os.umask (process-wide: racy with writer threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    return 0o644


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
        os.chmod(tmp, file_mode())
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

