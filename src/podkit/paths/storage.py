"""Naming a place: a local path, `file://`, `s3://bucket/key` or `gs://bucket/key`, checked
once here for every user of the path layer, and the `Storage` rooted at it.

    storage = open_storage("s3://bucket/runs/exp", RetryPolicy(attempts=6))
    storage.write_bytes("step_0000000100/COMMIT.json", data)

`open_storage` gives a root and keys below it (what checkpoints use); `parse` names a path's
place (bucket and key) and `bucket_storage` the storage of its bucket (what `podkit.paths`
uses). A malformed
URL (`s3:/bucket`, `gcs://`, no bucket, '.' or '..' parts) is a ConfigError naming it and the
fix, never a local folder called `s3:`.

Environment, read by the libraries themselves: S3 -- AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_PROFILE, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 (any
S3-compatible server), AWS_CA_BUNDLE; GCS -- application-default credentials
(GOOGLE_APPLICATION_CREDENTIALS), GOOGLE_CLOUD_PROJECT, and STORAGE_EMULATOR_HOST (with it,
google-cloud-storage uses anonymous credentials, as Google's emulators expect). boto3 and
google-cloud-storage are imported only when such a URL is opened.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path

from podkit.errors import ConfigError
from podkit.paths.base import Storage
from podkit.paths.gcs import GCSStorage
from podkit.paths.local import LocalStorage
from podkit.paths.retry import RetryPolicy
from podkit.paths.s3 import S3Storage

SCHEMES = ("s3", "gs")
_COLON_MISSING = re.compile(r"^(s3|gs|gcs|file|hdfs|https?|az|abfss?|wasbs?)//", re.IGNORECASE)
_URL_LIKE = re.compile(r"^(s3|gs|gcs|file|hdfs|http|https|az|abfs|abfss|wasb|wasbs):/?(?!/)",
                       re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Place:
    """A checked path: `scheme` "s3"/"gs" with `bucket` and `key` ('/'-separated, "" for the
    bucket itself, no trailing '/'), or "" with `key` the local path."""

    scheme: str
    bucket: str
    key: str

    @property
    def remote(self) -> bool:
        return bool(self.scheme)

    @property
    def url(self) -> str:
        if not self.remote:
            return self.key
        return f"{self.scheme}://{self.bucket}/{self.key}" if self.key else \
            f"{self.scheme}://{self.bucket}"


def parse(path: str | os.PathLike, what: str = "path") -> Place:
    """The place a path names; ConfigError for anything URL-like podkit cannot read or write
    (the message names the URL and the fix)."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        return Place("", "", str(path))
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{path!r} is not a {what}; pass a local path, s3://BUCKET/key or "
                          "gs://BUCKET/key.")
    scheme, sep, rest = path.partition("://")
    if not sep:
        if _URL_LIKE.match(path):  # "s3:/bucket": a URL with a slash missing, not a directory
            raise ConfigError(f"{path!r} looks like a URL without '//'; write "
                              f"{path.partition(':')[0]}://BUCKET/key (or ./{path} for a "
                              "local file or directory of that name).")
        if _COLON_MISSING.match(path):  # "s3//bucket": a local "s3/bucket" folder otherwise
            raise ConfigError(f"{path!r} looks like a URL without its ':'; write "
                              f"{path.partition('/')[0]}://BUCKET/key (or ./{path} for a "
                              "local path of that name).")
        return Place("", "", path)
    scheme = scheme.lower()
    if scheme == "file":
        if rest and not rest.startswith("/"):
            raise ConfigError(f"{path!r}: a file:// URL needs an absolute path (file:///abs/dir)"
                              "; or pass the path itself.")
        return Place("", "", rest or "/")
    if scheme in SCHEMES:
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ConfigError(f"{path!r} names no bucket; write {scheme}://BUCKET/key.")
        key = key.rstrip("/")
        if any(p in ("", ".", "..") for p in key.split("/")) and key:
            raise ConfigError(f"{path!r}: empty, '.' and '..' parts are not allowed in an "
                              "object store key; write the key out (a/b/c).")
        return Place(scheme, bucket, key)
    hint = " (Google Cloud Storage is gs://)" if scheme == "gcs" else ""
    raise ConfigError(f"{path!r}: unknown storage scheme {scheme!r}{hint}; podkit reads and "
                      "writes local paths, file://, s3://BUCKET/key and gs://BUCKET/key.")


def open_storage(url: str | os.PathLike, retry: RetryPolicy | None = None) -> Storage:
    """The storage rooted at a path, a `file://` URL, `s3://bucket/prefix` or
    `gs://bucket/prefix`. Malformed URLs, unknown schemes and a missing client library raise
    ConfigError."""
    retry = retry if retry is not None else RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise ConfigError(f"retry={retry!r}: pass a pk.checkpoint.RetryPolicy.")
    place = parse(url, "checkpoint location")
    if not place.remote:
        return LocalStorage(Path(place.key), retry)
    return (S3Storage if place.scheme == "s3" else GCSStorage)(place.bucket, place.key, retry)


# Environment the clients read when made: a client made under other values would talk to
# another server (the tests point these at local servers, one test at a time).
_CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE",
               "AWS_DEFAULT_REGION", "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT",
               "GOOGLE_APPLICATION_CREDENTIALS")
_buckets: dict[tuple, Storage] = {}
_lock = threading.Lock()


def bucket_storage(place: Place) -> Storage:
    """The storage rooted at `place`'s bucket, made once per process, bucket and client
    environment (making a client reads credentials; a forked child makes its own)."""
    cache_key = (place.scheme, place.bucket, os.getpid(),
                 tuple(os.environ.get(k) for k in _CLIENT_ENV))
    with _lock:
        store = _buckets.get(cache_key)
        if store is None:
            cls = S3Storage if place.scheme == "s3" else GCSStorage
            store = _buckets[cache_key] = cls(place.bucket, "", RetryPolicy())
        return store
