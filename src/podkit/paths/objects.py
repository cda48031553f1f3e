"""What the object stores (S3, GCS) share: a bucket, a key prefix inside it, downloads aside."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from podkit.paths.atomic import replacing
from podkit.paths.base import Storage
from podkit.paths.retry import RetryPolicy


def download_aside(local: Path, fetch: Callable[[str], Any]) -> None:
    """fetch(tmp) writes the object to a temporary file beside `local`, renamed into place on
    success and removed on failure."""
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    # a scratch copy: no fsync (the checkpoint in the store is what must be durable)
    with replacing(local, durable=False) as tmp:
        fetch(tmp)


def within(rel: str, prefix: str) -> bool:
    """Directory semantics of delete_prefix: `prefix` itself or anything under `prefix/`."""
    return not prefix or rel == prefix or rel.startswith(prefix + "/")


class ObjectStore(Storage):
    """What S3 and GCS share: a bucket and a key prefix inside it."""

    def __init__(self, scheme: str, bucket: str, prefix: str, retry: RetryPolicy) -> None:
        self.bucket_name, self.prefix, self.retry = bucket, prefix.strip("/"), retry
        self.url = f"{scheme}://{bucket}/{self.prefix}".rstrip("/")

    def _key(self, key: str) -> str:
        """The object name in the bucket."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, name: str) -> str:
        return name[len(self.prefix) + 1:] if self.prefix else name

    def _list_prefix(self, prefix: str) -> str:
        """The bucket-level prefix to list for a key prefix ("" = everything under the root;
        the trailing '/' keeps "runs/a" from listing "runs/ab")."""
        return self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
