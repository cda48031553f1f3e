"""Where checkpoint bytes go: local paths, `s3://bucket/prefix`, `gs://bucket/prefix`.

    storage = open_storage("s3://bucket/runs/exp", RetryPolicy(attempts=6))
    storage.write_bytes("step_0000000100/COMMIT.json", data)

One small interface for the three, so that the checkpoint format (format.py) and the manager
never care where they write. Keys are relative to the root named by the URL, with '/'
separators. A local write is atomic per object (temporary file in the same directory, fsync,
rename, fsync of the directory), as a PUT is on an object store: a reader sees the whole old
object, the whole new one, or nothing.

`base.py` the interface (`Storage`) and key rules; `retry.py` the `RetryPolicy` every call goes
through and the classification of errors (transient or permanent, the cause and the fix);
`atomic.py` replacing a local file all at once (local writes and downloads); `local.py`
directories; `objects.py` what object stores share, `s3.py` and `gcs.py` the two.

Environment, read by the libraries themselves: S3 -- AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_PROFILE, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 (any
S3-compatible server), AWS_CA_BUNDLE; GCS -- application-default credentials
(GOOGLE_APPLICATION_CREDENTIALS), GOOGLE_CLOUD_PROJECT, and STORAGE_EMULATOR_HOST (with it,
google-cloud-storage uses anonymous credentials, as Google's emulators expect). boto3 and
google-cloud-storage are imported only when such a URL is opened.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from podkit.checkpoint.storage.base import Storage
from podkit.checkpoint.storage.gcs import GCSStorage
from podkit.checkpoint.storage.local import LocalStorage
from podkit.checkpoint.storage.retry import RetryPolicy, classify
from podkit.checkpoint.storage.s3 import S3Storage
from podkit.errors import ConfigError, StorageError

__all__ = ["GCSStorage", "LocalStorage", "RetryPolicy", "S3Storage", "Storage", "StorageError",
           "classify", "open_storage"]

_URL_LIKE = re.compile(r"^(s3|gs|gcs|file|hdfs|http|https|az|abfs|abfss|wasb|wasbs):/?(?!/)",
                       re.IGNORECASE)


def open_storage(url: str | os.PathLike, retry: RetryPolicy | None = None) -> Storage:
    """The storage for a path, a `file://` URL, `s3://bucket/prefix` or `gs://bucket/prefix`.
    Malformed URLs, unknown schemes and a missing client library raise ConfigError."""
    retry = retry if retry is not None else RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise ConfigError(f"retry={retry!r}: pass a pk.checkpoint.RetryPolicy.")
    if isinstance(url, os.PathLike):
        return LocalStorage(Path(url), retry)
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{url!r} is not a checkpoint location; pass a path, s3://bucket/"
                          "prefix or gs://bucket/prefix.")
    scheme, sep, rest = url.partition("://")
    if not sep:
        if _URL_LIKE.match(url):  # "s3:/bucket": a URL with a slash missing, not a directory
            raise ConfigError(f"{url!r} looks like a URL without '//'; write "
                              f"{url.partition(':')[0]}://BUCKET/prefix (or ./{url} for a "
                              "local directory of that name).")
        return LocalStorage(Path(url), retry)
    scheme = scheme.lower()
    if scheme == "file":
        if rest and not rest.startswith("/"):
            raise ConfigError(f"{url!r}: a file:// URL needs an absolute path (file:///abs/dir)"
                              "; or pass the path itself.")
        return LocalStorage(Path(rest or "/"), retry)
    if scheme in ("s3", "gs"):
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(f"{url!r} names no bucket; write {scheme}://BUCKET/prefix.")
        if any(p in (".", "..") for p in prefix.split("/")):
            raise ConfigError(f"{url!r}: '.' and '..' are not allowed in an object store "
                              "prefix; write the prefix out.")
        return (S3Storage if scheme == "s3" else GCSStorage)(bucket, prefix, retry)
    hint = " (Google Cloud Storage is gs://)" if scheme == "gcs" else ""
    raise ConfigError(f"{url!r}: unknown storage scheme {scheme!r}{hint}; podkit writes "
                      "checkpoints to paths, file://, s3://BUCKET/prefix and gs://BUCKET/prefix.")
