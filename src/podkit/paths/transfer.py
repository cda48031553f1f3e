"""Whole files and directories between a place and this machine: `local_copy` (a local path to
read from), `staged` (a local path to write at, put in place on a clean exit), `rename`.

For the readers and writers that need a real file: h5py, ArrayRecord's C++ reader, Orbax. A
remote file or directory is downloaded once per process into a cache directory (removed when
the process ends) keyed by its URL and every object's size and version, so a replaced object
is downloaded again and an unchanged one is not.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from podkit.errors import StorageError
from podkit.paths import ops
from podkit.paths.atomic import file_mode
from podkit.paths.base import TMP_SUFFIX, Entry
from podkit.paths.files import object_key
from podkit.paths.files import open as open_file
from podkit.paths.retry import RetryPolicy
from podkit.paths.storage import Place, bucket_storage, parse

_THREADS = 8  # objects of a directory moved at a time (each a request-bound transfer)
_cache: dict[str, str] = {}
_cache_lock = threading.Lock()


def _cache_dir() -> str:
    """The per-process download cache (a forked child reuses its parent's: its files are put
    in place atomically; only the process that made it removes it)."""
    with _cache_lock:
        if "dir" not in _cache:
            made = tempfile.mkdtemp(prefix="podkit-paths-")
            _cache["dir"] = made
            owner = os.getpid()
            atexit.register(lambda: os.getpid() == owner and shutil.rmtree(
                made, ignore_errors=True))
        return _cache["dir"]


def _download_tree(place: Place, entries: list[Entry], target: Path) -> None:
    storage, below = bucket_storage(place), len(place.key) + 1 if place.key else 0

    def one(entry: Entry) -> None:
        storage.download_file(entry.key, target / entry.key[below:])

    with ThreadPoolExecutor(_THREADS) as pool:
        list(pool.map(one, entries))


@contextmanager
def local_copy(path: str | os.PathLike) -> Iterator[str]:
    """A local path holding what `path` holds: the path itself when local; for a URL, a
    download of the file (or of every object under the directory) into this process's cache,
    made once while the objects are unchanged. Read it inside the block; a URL with nothing
    there is a StorageError with `.missing`.

        with paths.local_copy("gs://bucket/model.weights.h5") as local:
            h5py.File(local, "r")
    """
    place = parse(path)
    if not place.remote:
        if not os.path.exists(place.key):
            raise ops.missing_error("reading", place, "Check the path.")
        yield place.key
        return
    storage = bucket_storage(place)
    entries, is_file = [], False
    if place.key:
        try:
            entries, is_file = [storage.stat(place.key)], True
        except StorageError as e:
            if not e.missing:
                raise
    if not is_file:
        entries = storage.entries(f"{place.key}/" if place.key else "")
    if not entries:
        raise ops.missing_error("downloading", place, "Check the URL.")
    digest = hashlib.sha256(repr((place.url, is_file, [
        (e.key, e.size, e.version) for e in entries])).encode()).hexdigest()[:24]
    name = base_name(place)
    target = Path(_cache_dir()) / digest / name
    if not target.exists():
        if is_file:
            storage.download_file(place.key, target)
        else:
            staging = Path(tempfile.mkdtemp(dir=_cache_dir(), suffix=TMP_SUFFIX))
            try:
                _download_tree(place, entries, staging / name)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(staging / name, target)
                except OSError:
                    if not target.is_dir():  # not a concurrent download that got there first
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    yield str(target)


def base_name(place: Place) -> str:
    """The last part of a URL's key (the bucket's name for a bucket)."""
    return place.key.rpartition("/")[2] or place.bucket


def _put_local(staging: Path, target: Path) -> None:
    """Move a staged file or directory over `target`: a file by one rename (with the mode
    open() would have given it); a directory by moving the old one aside, renaming the new
    one in, then deleting the old one."""
    if staging.is_file():  # libraries that write aside themselves leave 0o600 files
        os.chmod(staging, file_mode())
    if staging.is_dir() and target.exists():
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.",
                                      suffix=TMP_SUFFIX))
        os.rename(target, aside / "old")
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(aside / "old", target)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(staging, target)


def _put_remote(staging: Path, place: Place) -> None:
    """Upload a staged file, or every file under a staged directory, then delete what the
    directory's old version held and the new one does not (so a reader sees the old objects
    until each new one lands, never a prefix with neither)."""
    storage = bucket_storage(place)
    key = object_key(place)
    if staging.is_file():
        storage.upload_file(staging, key)
        return
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    keys = [f"{key}/{p.relative_to(staging).as_posix()}" for p in files]
    old = {e.key for e in storage.entries(f"{key}/")}
    with ThreadPoolExecutor(_THREADS) as pool:
        list(pool.map(storage.upload_file, files, keys))
    for stale in sorted(old - set(keys)):
        storage.delete(stale)
    if storage.exists(key):  # a file the directory replaces
        storage.delete(key)


@contextmanager
def staged(path: str | os.PathLike) -> Iterator[str]:
    """A local path at which to write a file or a directory for `path`; when the block ends
    cleanly, what was written there replaces `path` (renamed into place locally, uploaded to
    a URL). If the block raises, nothing is put in place and the staging is removed.

        with paths.staged("gs://bucket/export/model") as local:
            writer.save(local)          # any library that writes local files
    """
    place = parse(path)
    if place.remote:
        object_key(place)
        root = Path(tempfile.mkdtemp(prefix="podkit-staged-"))
        target = None
    else:
        target = Path(place.key).absolute()
        RetryPolicy().call(lambda: target.parent.mkdir(parents=True, exist_ok=True),
                           f"creating {target.parent}")
        root = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.",
                                     suffix=TMP_SUFFIX))
    staging = root / (target.name if target else base_name(place))
    try:
        yield str(staging)
        if not staging.exists():
            raise StorageError(f"nothing was written at the staging path {staging} for "
                               f"{place.url}; write the file or directory there inside the "
                               "`with paths.staged(...)` block.")
        if target is None:
            _put_remote(staging, place)
        else:
            RetryPolicy().call(lambda: _put_local(staging, target), f"writing {target}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def rename(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """os.rename (POSIX's, i.e. os.replace): move a file or a directory to `dst`, replacing
    a file there, or an empty directory with a directory. As os.rename, a file onto a
    directory, a directory onto a file or onto a directory that holds something, and a
    directory into itself are errors (a StorageError naming both), and renaming a path to
    itself does nothing; unlike it, dst's missing parent directories are made (a write makes
    them). Within one bucket by server-side copies and deletes (not atomic for a directory:
    objects move one at a time); between places by a copy, then deleting the source."""
    a, b = parse(src), parse(dst)
    if not a.remote and not b.remote:
        Path(b.key).absolute().parent.mkdir(parents=True, exist_ok=True)
        RetryPolicy().call(lambda: os.replace(a.key, b.key), f"renaming {a.key} to {b.key}")
        return
    if (a.scheme, a.bucket, a.key) == (b.scheme, b.bucket, b.key):
        return  # as os.rename(p, p); copying an object onto itself, then deleting it, loses it
    kind = _kind(a)
    if kind is None:
        raise ops.missing_error("renaming", a, "Check the path.")
    _check_target(a, b, kind)
    if a.remote and b.remote and (a.scheme, a.bucket) == (b.scheme, b.bucket):
        storage = bucket_storage(a)
        source, target = object_key(a), object_key(b)
        if kind == "file":
            storage.copy(source, target)
            storage.delete(source)
            return
        for entry in storage.entries(f"{source}/"):
            storage.copy(entry.key, target + entry.key[len(source):])
        storage.delete_prefix(f"{source}/")
        return
    if kind != "file":
        with local_copy(src) as here, staged(dst) as there:
            shutil.copytree(here, there)
        ops.rmtree(src)
    else:
        with open_file(src, "rb") as f, open_file(dst, "wb") as g:
            shutil.copyfileobj(f, g, 1 << 20)
        ops.remove(src)


def _kind(place: Place) -> str | None:
    """"file", "dir", "empty dir" (local only: an object store has none) or None (nothing)."""
    if not place.remote:
        if os.path.isdir(place.key):
            return "dir" if os.listdir(place.key) else "empty dir"
        return "file" if os.path.lexists(place.key) else None
    storage = bucket_storage(place)
    if place.key and storage.exists(place.key):
        return "file"
    return "dir" if not place.key or storage.any_under(f"{place.key}/") else None


def _check_target(a: Place, b: Place, kind: str) -> None:
    """os.rename's refusals, for the moves os.replace does not make (remote or across)."""
    moved = f"rename({a.url!r}, {b.url!r})"
    if kind != "file" and (a.scheme, a.bucket) == (b.scheme, b.bucket) and \
            b.key.startswith(f"{a.key}/"):
        raise StorageError(f"{moved}: a directory cannot move into itself; choose a target "
                           "outside it.")
    there = _kind(b)
    if kind == "file" and there in ("dir", "empty dir"):
        raise StorageError(f"{moved}: the target is a directory (os.rename: IsADirectoryError); "
                           "name the file's new path inside it.")
    if kind != "file" and there == "file":
        raise StorageError(f"{moved}: the target is a file (os.rename: NotADirectoryError); "
                           "remove it or choose another path.")
    if kind != "file" and there == "dir":
        raise StorageError(f"{moved}: the target directory holds something (os.rename: "
                           "OSError, directory not empty); remove it first (rmtree) or "
                           "choose another path.")
