"""What os, os.path, glob and shutil do to files, for local paths, `s3://` and `gs://` alike.

An object store has no directories: a "directory" is a key prefix that some object's key
continues with '/', so `isdir("gs://b/runs")` is True when an object `runs/...` exists,
`makedirs` of a URL creates nothing, and a directory whose last object went away is gone.
Each verb takes the arguments of the one it is named after (os.makedirs's `mode` and
`exist_ok`, shutil.rmtree's `ignore_errors`, glob.glob's `include_hidden`) and returns what
it returns, except that listings are sorted. Errors are podkit's: StorageError naming the
path (`.missing` when it is not there) where os raises an OSError, ConfigError for a
malformed URL.
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import os
import posixpath
import re
import shutil

from podkit.errors import ConfigError, StorageError
from podkit.paths.base import TMP_SUFFIX, Entry, Storage
from podkit.paths.files import object_key
from podkit.paths.local import file_version
from podkit.paths.retry import RetryPolicy
from podkit.paths.storage import Place, bucket_storage, parse

_MAGIC = re.compile(r"[*?[]")


def _local(fn, what: str):
    return RetryPolicy().call(fn, what)


def missing_error(what: str, place: Place, fix: str) -> StorageError:
    """The StorageError (`.missing` set) for a path with nothing there."""
    err = StorageError(f"{what} {place.url} failed: there is nothing at {place.url}. {fix}")
    err.missing = True
    return err


def is_url(path: str | os.PathLike) -> bool:
    """True for `s3://bucket/...` and `gs://bucket/...`, False for a local path (or file://).
    A string that looks like a URL podkit cannot use (`gcs://`, `s3:/bucket`, `hdfs://`, no
    bucket) raises ConfigError, so that it never becomes a local folder called `s3:`."""
    return parse(path).remote


def join(path: str | os.PathLike, *parts: str) -> str:
    """`os.path.join` for local paths; '/'-joined for URLs."""
    place = parse(path)
    if not place.remote:
        return os.path.join(os.fspath(path), *parts)
    out = os.fspath(path).rstrip("/")
    for part in parts:
        out = f"{out}/{os.fspath(part).strip('/')}" if part else out
    return out


def _dir_key(place: Place) -> str:
    """The prefix of what lies under a directory ("" for a whole bucket)."""
    return f"{place.key}/" if place.key else ""


def exists(path: str | os.PathLike) -> bool:
    """Whether a file or a directory is there. A missing bucket is a StorageError."""
    place = parse(path)
    if not place.remote:
        return os.path.exists(place.key)
    storage = bucket_storage(place)
    if not place.key:
        storage.any_under("")  # raises if the bucket does not exist
        return True
    return storage.exists(place.key) or storage.any_under(_dir_key(place))


def isdir(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory (remotely: some object's key continues it with '/')."""
    place = parse(path)
    if not place.remote:
        return os.path.isdir(place.key)
    storage = bucket_storage(place)
    found = storage.any_under(_dir_key(place))
    return found or not place.key


def size(path: str | os.PathLike) -> int:
    """The file's size in bytes."""
    place = parse(path)
    if not place.remote:
        return _local(lambda: os.stat(place.key).st_size, f"sizing {place.key}")
    return bucket_storage(place).size(object_key(place))


def stat(path: str | os.PathLike) -> Entry:
    """The file's size and version (a local file's mtime and inode, an S3 ETag, a GCS
    generation): what a cache of something made from the file is keyed by."""
    place = parse(path)
    if not place.remote:
        st = _local(lambda: os.stat(place.key), f"sizing {place.key}")
        return Entry(place.key, st.st_size, file_version(st))
    entry = bucket_storage(place).stat(object_key(place))
    return Entry(place.url, entry.size, entry.version)


def listdir(path: str | os.PathLike | None = None) -> list[str]:
    """The names in a directory (files and subdirectories, as os.listdir; sorted, where
    os.listdir's order is arbitrary); None, as os.listdir's default, is '.'."""
    place = parse("." if path is None else path)
    if not place.remote:
        names = _local(lambda: os.listdir(place.key), f"listing {place.key}")
        return sorted(n for n in names if not n.endswith(TMP_SUFFIX))
    names = bucket_storage(place).children(_dir_key(place))
    if not names and place.key:
        raise missing_error("listing", place, "Check the URL: no object's key starts with "
                       f"{place.key}/.")
    return names


def makedirs(name: str | os.PathLike, mode: int = 0o777, exist_ok: bool = False) -> None:
    """os.makedirs: the directory and its missing parents; an existing directory is an error
    unless exist_ok, a file there is one always (a StorageError naming it).

    A URL: an object store has no directories (a directory is the prefix of the objects
    under it, and appears with the first one written), so nothing is created and `mode` has
    no use; as os.makedirs, a directory already there (an object under the prefix) is an
    error unless exist_ok, and an object with that very key is one always."""
    place = parse(name)
    if not place.remote:
        try:
            _local(lambda: os.makedirs(place.key, mode, exist_ok), f"creating {place.key}")
        except StorageError as e:
            if isinstance(e.__cause__, FileExistsError):
                raise _exists_error(place, directory=os.path.isdir(place.key)) from e.__cause__
            raise
        return
    storage = bucket_storage(place)
    if place.key and storage.exists(place.key):
        raise _exists_error(place, directory=False)
    if not exist_ok and (not place.key or storage.any_under(_dir_key(place))):
        raise _exists_error(place, directory=True)


def _exists_error(place: Place, directory: bool) -> StorageError:
    if directory:
        return StorageError(f"makedirs({place.url!r}): the directory exists already (as "
                            "os.makedirs, FileExistsError); pass exist_ok=True to accept it.")
    return StorageError(f"makedirs({place.url!r}): a file is there, so no directory can be; "
                        "remove it or choose another path.")


def remove(path: str | os.PathLike) -> None:
    """Delete one file; a missing one is a StorageError with `.missing`."""
    place = parse(path)
    if not place.remote:
        _local(lambda: os.remove(place.key), f"deleting {place.key}")
        return
    bucket_storage(place).delete(object_key(place))


def rmtree(path: str | os.PathLike, ignore_errors: bool = False) -> None:
    """shutil.rmtree: delete a directory and everything under it; a missing one is a
    StorageError (`.missing`). ignore_errors=True: what cannot be deleted (or is not there)
    is left without an error, as shutil's."""
    place = parse(path)
    if not place.remote:
        _local(lambda: shutil.rmtree(place.key, ignore_errors=ignore_errors),
               f"deleting {place.key}")
        return
    try:
        _rmtree_prefix(place)
    except StorageError:
        if not ignore_errors:
            raise


def _rmtree_prefix(place: Place) -> None:
    if not place.key:
        raise ConfigError(f"rmtree({place.url!r}) would empty the whole bucket; podkit "
                          "deletes prefixes only: name one (BUCKET/prefix).")
    storage = bucket_storage(place)
    if not storage.any_under(_dir_key(place)):
        raise missing_error("deleting", place, "Check the URL: no object's key starts with "
                       f"{place.key}/.")
    storage.delete_prefix(_dir_key(place))


def glob(pathname: str | os.PathLike, *, include_hidden: bool = False) -> list[str]:
    """glob.glob: the paths matching `pathname`, sorted (glob.glob's order is arbitrary).
    `*`, `?` and `[...]` match within one path segment (never across '/'; `**` is not
    recursive); matching directories are included. As glob.glob, a wildcard does not match
    a name that starts with '.' unless include_hidden=True (tf.io.gfile.glob and
    Dataset.list_files match them: pass include_hidden=True for their answer). A URL is
    listed by the prefix before its first magic character, with the same rules."""
    place = parse(pathname)
    if not place.remote:
        found = _glob.glob(place.key, include_hidden=include_hidden)
        return sorted(p for p in found if not p.endswith(TMP_SUFFIX))
    match = _MAGIC.search(place.key)
    if match is None:
        return [place.url] if exists(place.url) else []
    storage = bucket_storage(place)
    listed = place.key[:match.start()]
    if listed.rsplit("/", 1)[-1] in (".", ".."):  # not a key prefix: list the directory
        listed = listed[:listed.rfind("/") + 1]
    return sorted(f"{place.scheme}://{place.bucket}/{key}"
                  for key in _matching(storage, place.key, listed, include_hidden))


def _matching(storage: Storage, pattern: str, listed: str, include_hidden: bool,
              ) -> set[str]:
    parts = pattern.split("/")
    found = set()
    for entry in storage.entries(listed):
        segments = entry.key.split("/")
        if len(segments) < len(parts) or entry.key.endswith(TMP_SUFFIX):
            continue
        head = segments[:len(parts)]
        if all(_segment_matches(s, p, include_hidden)
               for s, p in zip(head, parts, strict=True)):
            found.add(posixpath.join(*head))
    return found


def _segment_matches(name: str, pattern: str, include_hidden: bool) -> bool:
    """glob's rule for one segment: a hidden name matches only a pattern that starts with
    '.' (or any, with include_hidden)."""
    if name.startswith(".") and not pattern.startswith(".") and not include_hidden:
        return False
    return fnmatch.fnmatchcase(name, pattern)
