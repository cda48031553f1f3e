"""A local working copy of a directory on object storage, for writers that append.

    mirror = Mirror("gs://bucket/runs/exp1", skip=("checkpoints",))
    mirror.pull()                  # the copy becomes what the bucket holds (a resumed run)
    ... write under mirror.local   # metrics.jsonl appended, TensorBoard's event files
    mirror.push()                  # what changed goes up, what was removed goes away

Objects cannot be appended to, and a run directory is appended to all the time: a line of
metrics every log point, TensorBoard events every few seconds. So the writers write a local
directory as they always do, and `push()` uploads the files that changed since the last push
(by size and modification time) and deletes the objects of files removed since. Keys under
`skip` are neither pulled nor pushed (checkpoints: the checkpoint manager writes and reads
them at the URL itself, each step whole).

The copy lives under `$PODKIT_CACHE/mirrors` (default ~/.cache/podkit), at a path named by the
URL, so every process on a machine finds the same one (`podkit launch` copies a hung
process's stacks into it); `pull()` makes it equal to the bucket, so a stale copy from an
earlier run never leaks into the next. A reader that must not touch a writer's copy (a
report beside a training run on the same machine) gives `local=` a place of its own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from podkit.errors import ConfigError, StorageError
from podkit.paths.base import TMP_SUFFIX
from podkit.paths.storage import open_storage, parse

_THREADS = 8


def cache_root() -> Path:
    """podkit's cache on this machine: `$PODKIT_CACHE`, default ~/.cache/podkit."""
    return Path(os.environ.get("PODKIT_CACHE") or Path.home() / ".cache" / "podkit")


class Mirror:
    """A local copy of the directory at `url` (gs:// or s3://); see the module docstring."""

    def __init__(self, url: str | os.PathLike, skip: tuple[str, ...] = (),
                 local: str | os.PathLike | None = None) -> None:
        place = parse(url, "mirrored directory")
        if not place.remote:
            raise ConfigError(f"{os.fspath(url)!r} is a local path; a Mirror copies a gs:// or "
                              "s3:// directory.")
        self.url = place.url.rstrip("/")
        self.skip = tuple(s.strip("/") for s in skip)
        name = place.key.rpartition("/")[2] or place.bucket
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        # `local`: another place for the copy (a reader's snapshot, apart from a writer's)
        self.local = Path(local) if local is not None else \
            cache_root() / "mirrors" / digest / name
        self._storage = open_storage(self.url)
        self._sent: dict[str, tuple[int, int]] = {}  # key -> (size, mtime_ns) as uploaded
        self._lock = threading.Lock()

    def _skipped(self, key: str) -> bool:
        return any(key == s or key.startswith(f"{s}/") for s in self.skip) \
            or key.endswith(TMP_SUFFIX)

    def _local_files(self) -> dict[str, Path]:
        if not self.local.is_dir():
            return {}
        out = {}
        for path in self.local.rglob("*"):
            key = path.relative_to(self.local).as_posix()
            if path.is_file() and not self._skipped(key) and TMP_SUFFIX not in key:
                out[key] = path
        return out

    @staticmethod
    def _signature(path: Path) -> tuple[int, int]:
        st = path.stat()
        return st.st_size, st.st_mtime_ns

    def pull(self) -> int:
        """Make the local copy what the bucket holds (outside `skip`): download every object,
        remove local files the bucket lacks. Returns the number of files downloaded."""
        with self._lock:
            remote = [e for e in self._storage.entries("") if not self._skipped(e.key)]
            keys = {e.key for e in remote}
            for key, path in self._local_files().items():
                if key not in keys:
                    path.unlink()
            self.local.mkdir(parents=True, exist_ok=True)

            def one(key: str) -> None:
                target = self.local / key
                self._storage.download_file(key, target)
                self._sent[key] = self._signature(target)

            with ThreadPoolExecutor(_THREADS) as pool:
                list(pool.map(one, sorted(keys)))
            return len(keys)

    def push(self) -> int:
        """Upload the files that changed since the last push or pull, delete the objects of
        files removed since. Returns the number of files uploaded."""
        with self._lock:
            now = self._local_files()
            changed = []
            for key, path in now.items():
                try:
                    signature = self._signature(path)
                except FileNotFoundError:  # removed while we looked
                    continue
                if self._sent.get(key) != signature:
                    changed.append((key, path, signature))

            def one(item: tuple[str, Path, tuple[int, int]]) -> None:
                key, path, signature = item
                self._storage.upload_file(path, key)
                self._sent[key] = signature

            with ThreadPoolExecutor(_THREADS) as pool:
                list(pool.map(one, changed))
            for key in sorted(set(self._sent) - set(now)):
                try:
                    self._storage.delete(key)
                except StorageError as e:
                    if not e.missing:
                        raise
                del self._sent[key]
            return len(changed)

    def remove_local(self) -> None:
        """Delete the local copy (the bucket keeps everything pushed)."""
        with self._lock:
            shutil.rmtree(self.local, ignore_errors=True)
            self._sent.clear()

    def __repr__(self) -> str:
        return f"Mirror({self.url!r} at {str(self.local)!r})"
