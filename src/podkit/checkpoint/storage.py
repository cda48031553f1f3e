"""Where checkpoint bytes go: local paths, `s3://bucket/prefix`, `gs://bucket/prefix`.

    storage = open_storage("s3://bucket/runs/exp", RetryPolicy(attempts=6))
    storage.write_bytes("step_0000000100/COMMIT.json", data)

One interface for the three, keys relative to the root with '/' separators. Every call goes
through a `RetryPolicy`: transient errors (connection resets and timeouts, throttling, HTTP
408/429/5xx, EAGAIN/EINTR/EBUSY/ETIMEDOUT) are retried with exponential backoff and jitter;
permanent ones (permission denied, bad credentials, missing bucket, no space, read-only file
system) are raised at once. Either way the caller gets a `StorageError` naming the URL and key,
the attempts, the cause and the fix. The libraries' own retries are turned off so that one
policy decides.

Environment, as each library reads it: S3 — AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 (any S3-compatible server); GCS —
application-default credentials, GOOGLE_CLOUD_PROJECT, and STORAGE_EMULATOR_HOST (then
anonymous credentials, as Google's emulators expect).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from podkit.errors import ConfigError, StorageError

T = TypeVar("T")

__all__ = ["RetryPolicy", "Storage", "StorageError", "open_storage"]

_TRANSIENT_ERRNO = {errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT}
_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable",
                    "Throttling", "ThrottlingException", "RequestTimeTooSkewed"}
_FIXES = {
    errno.ENOSPC: "the disk is full: free space, or point the checkpoints elsewhere",
    errno.EDQUOT: "the disk quota is used up: free space or raise the quota",
    errno.EROFS: "the file system is read-only: point the checkpoints at a writable directory",
    errno.EACCES: "this process may not write there: fix the permissions or point the "
                  "checkpoints elsewhere",
    errno.EPERM: "this process may not write there: fix the permissions or point the "
                 "checkpoints elsewhere",
}


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for transient storage errors: waits initial_s, initial_s *
    multiplier, ... (capped at max_s, with +-20% jitter) between `attempts` tries in all."""

    attempts: int = 6
    initial_s: float = 0.2
    max_s: float = 10.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) \
                or self.attempts < 1:
            raise ConfigError(f"RetryPolicy(attempts={self.attempts!r}): use an int >= 1.")
        for name in ("initial_s", "max_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"RetryPolicy({name}={value!r}): use a number >= 0.")
        if not isinstance(self.multiplier, int | float) or self.multiplier < 1:
            raise ConfigError(f"RetryPolicy(multiplier={self.multiplier!r}): use a number "
                              ">= 1.")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number `attempt` (1-based)."""
        base = min(self.initial_s * self.multiplier ** (attempt - 1), self.max_s)
        return base * random.uniform(0.8, 1.2)

    def call(self, fn: Callable[[], T], what: str) -> T:
        """fn(), retried on transient errors; any failure is a StorageError about `what`."""
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except StorageError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below
                transient, cause, fix = classify(e)
                if transient and attempt < self.attempts:
                    time.sleep(self.delay(attempt))
                    continue
                tries = f"after {attempt} attempt{'s' if attempt > 1 else ''}"
                err = StorageError(f"{what} failed {tries}: {cause}. {fix}")
                err.transient = transient
                err.missing = _is_missing(e)
                raise err from e
        raise AssertionError("unreachable")


def _is_missing(e: BaseException) -> bool:
    for inner in _chain(e):
        if isinstance(inner, FileNotFoundError):
            return True
        status, code = _http(inner)
        if status == 404 and code not in ("NoSuchBucket",):
            return True
    return False


def _http(e: BaseException) -> tuple[int | None, str | None]:
    """(HTTP status, service error code) of a boto3 or google-cloud error, if it is one."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore.exceptions.ClientError
        meta = response.get("ResponseMetadata", {})
        return meta.get("HTTPStatusCode"), response.get("Error", {}).get("Code")
    code = getattr(e, "code", None)  # google.api_core.exceptions.GoogleAPICallError
    if isinstance(code, int):
        return code, type(e).__name__
    return None, None


def _chain(e: BaseException) -> list[BaseException]:
    """The error and what it wraps (boto3's S3UploadFailedError wraps the ClientError)."""
    out: list[BaseException] = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def classify(e: BaseException) -> tuple[bool, str, str]:
    """(transient, what happened, what to do) for an error from a storage call."""
    cause = f"{type(e).__name__}: {e}"
    for inner in _chain(e)[1:]:
        if _http(inner)[0] is not None or (isinstance(inner, OSError) and inner.errno):
            transient, _, fix = classify(inner)
            return transient, cause, fix
    if isinstance(e, OSError) and e.errno is not None and not _http(e)[0]:
        if e.errno in _TRANSIENT_ERRNO:
            return True, cause, "It was retried with backoff; the storage kept failing."
        return False, cause, (_FIXES.get(e.errno, "check the path") + ".")
    status, code = _http(e)
    if status is not None:
        if status in _TRANSIENT_HTTP or code in _TRANSIENT_CODES:
            return True, cause, ("The server kept answering with a temporary error; retried "
                                 "with backoff. Check the service, or raise RetryPolicy.attempts.")
        if status in (401, 403):
            return False, cause, ("Permission denied: check the credentials (AWS_ACCESS_KEY_ID "
                                  "/ GOOGLE_APPLICATION_CREDENTIALS) and the bucket's policy.")
        if code == "NoSuchBucket" or (status == 404 and "bucket" in str(e).lower()):
            return False, cause, "The bucket does not exist: create it or fix the URL."
        return False, cause, "The server refused the request."
    names = {type(c).__name__ for c in type(e).__mro__}
    if names & {"ConnectionError", "EndpointConnectionError", "ConnectTimeoutError",
                "ReadTimeoutError", "TimeoutError", "ProtocolError", "ChunkedEncodingError",
                "ConnectionClosedError", "ResponseStreamingError", "IncompleteReadError",
                "ServiceUnavailable", "TooManyRequests", "InternalServerError", "GatewayTimeout",
                "BadGateway", "RetryError"}:
        return True, cause, ("The storage could not be reached; retried with backoff. Check "
                             "the endpoint (AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST) and the "
                             "network.")
    if names & {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"}:
        return False, cause, ("No credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or "
                              "Google application-default credentials.")
    return False, cause, "This error is not one podkit retries."


class Storage:
    """The operations a checkpoint needs (see the module docstring)."""

    url: str
    retry: RetryPolicy

    def _call(self, fn: Callable[[], T], op: str, key: str) -> T:
        return self.retry.call(fn, f"{op} {self.url.rstrip('/')}/{key}")

    def write_bytes(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def read_bytes(self, key: str) -> bytes:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str = "") -> list[str]:
        raise NotImplementedError

    def size(self, key: str) -> int:
        raise NotImplementedError

    def delete_prefix(self, prefix: str) -> None:
        raise NotImplementedError

    def upload_file(self, local: Path, key: str) -> None:
        raise NotImplementedError

    def download_file(self, key: str, local: Path) -> None:
        raise NotImplementedError

    def local_dir(self) -> Path | None:
        return None


class LocalStorage(Storage):
    """A directory. Writes are atomic per file: a temporary file in the same directory,
    fsynced, renamed over the key, and the directory fsynced."""

    def __init__(self, root: Path, retry: RetryPolicy) -> None:
        self.root, self.retry = root.absolute(), retry
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / key

    def write_bytes(self, key: str, data: bytes) -> None:
        def write() -> None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            _fsync_dir(path.parent)

        self._call(write, "writing", key)

    def read_bytes(self, key: str) -> bytes:
        return self._call(self._path(key).read_bytes, "reading", key)

    def exists(self, key: str) -> bool:
        return self._call(self._path(key).is_file, "looking up", key)

    def list(self, prefix: str = "") -> list[str]:
        def walk() -> list[str]:
            if not self.root.is_dir():
                return []
            out = []
            for dirpath, _, files in os.walk(self.root):
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in files:
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix) and not name.startswith("."):
                        out.append(key)
            return sorted(out)

        return self._call(walk, "listing", prefix)

    def size(self, key: str) -> int:
        return self._call(lambda: self._path(key).stat().st_size, "sizing", key)

    def delete_prefix(self, prefix: str) -> None:
        def delete() -> None:
            path = self._path(prefix.rstrip("/")) if prefix else self.root
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        self.write_bytes(key, Path(local).read_bytes())

    def download_file(self, key: str, local: Path) -> None:
        self._call(lambda: shutil.copyfile(self._path(key), local), "reading", key)

    def local_dir(self) -> Path:
        return self.root


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class S3Storage(Storage):
    """`s3://bucket/prefix` through boto3 (any S3-compatible server via AWS_ENDPOINT_URL)."""

    def __init__(self, bucket: str, prefix: str, retry: RetryPolicy) -> None:
        try:
            import boto3
            import botocore.config
        except ImportError:  # pragma: no cover - pinned in requirements.lock
            raise ConfigError("s3:// checkpoints need boto3 (pip install boto3).") from None
        self.bucket, self.prefix, self.retry = bucket, prefix.strip("/"), retry
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        config = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                        connect_timeout=10, read_timeout=60)
        self.client = boto3.client("s3", config=config)
        from boto3.s3.transfer import TransferConfig

        self._transfer = TransferConfig(use_threads=True, max_concurrency=4)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def write_bytes(self, key: str, data: bytes) -> None:
        self._call(lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key),
                                                  Body=data), "writing", key)

    def read_bytes(self, key: str) -> bytes:
        return self._call(lambda: self.client.get_object(
            Bucket=self.bucket, Key=self._key(key))["Body"].read(), "reading", key)

    def exists(self, key: str) -> bool:
        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=self._key(key))
                return True
            except Exception as e:
                if _http(e)[0] == 404:
                    return False
                raise

        return self._call(head, "looking up", key)

    def _objects(self, prefix: str) -> list[dict]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        out: list[dict] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full):
            out.extend(page.get("Contents", []))
        return out

    def list(self, prefix: str = "") -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        return self._call(lambda: sorted(o["Key"][strip:] for o in self._objects(prefix)),
                          "listing", prefix)

    def size(self, key: str) -> int:
        return self._call(lambda: self.client.head_object(
            Bucket=self.bucket, Key=self._key(key))["ContentLength"], "sizing", key)

    def delete_prefix(self, prefix: str) -> None:
        def delete() -> None:
            keys = [{"Key": o["Key"]} for o in self._objects(prefix)]
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=self.bucket,
                                           Delete={"Objects": keys[i:i + 1000]})

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        self._call(lambda: self.client.upload_file(str(local), self.bucket, self._key(key),
                                                   Config=self._transfer), "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        def download() -> None:
            tmp = Path(local).with_name(Path(local).name + ".part")
            self.client.download_file(self.bucket, self._key(key), str(tmp),
                                      Config=self._transfer)
            os.replace(tmp, local)

        self._call(download, "downloading", key)


class GCSStorage(Storage):
    """`gs://bucket/prefix` through google-cloud-storage (STORAGE_EMULATOR_HOST honoured)."""

    def __init__(self, bucket: str, prefix: str, retry: RetryPolicy) -> None:
        try:
            from google.cloud import storage as gcs
        except ImportError:  # pragma: no cover - pinned in requirements.lock
            raise ConfigError("gs:// checkpoints need google-cloud-storage.") from None
        self.prefix, self.retry = prefix.strip("/"), retry
        self.url = f"gs://{bucket}/{self.prefix}".rstrip("/")
        project = os.environ.get("GOOGLE_CLOUD_PROJECT", "podkit")
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            client = gcs.Client(project=project, credentials=AnonymousCredentials())
        else:
            client = gcs.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT"))
        self.bucket = client.bucket(bucket)

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(f"{self.prefix}/{key}" if self.prefix else key)

    def write_bytes(self, key: str, data: bytes) -> None:
        self._call(lambda: self._blob(key).upload_from_string(data, retry=None), "writing", key)

    def read_bytes(self, key: str) -> bytes:
        return self._call(lambda: self._blob(key).download_as_bytes(retry=None), "reading", key)

    def exists(self, key: str) -> bool:
        return self._call(lambda: self._blob(key).exists(retry=None), "looking up", key)

    def _blobs(self, prefix: str) -> list:
        full = (f"{self.prefix}/{prefix}" if self.prefix else prefix) if prefix else \
            (f"{self.prefix}/" if self.prefix else "")
        return list(self.bucket.list_blobs(prefix=full, retry=None))

    def list(self, prefix: str = "") -> list[str]:
        strip = len(self.prefix) + 1 if self.prefix else 0
        return self._call(lambda: sorted(b.name[strip:] for b in self._blobs(prefix)),
                          "listing", prefix)

    def size(self, key: str) -> int:
        def size() -> int:
            blob = self._blob(key)
            blob.reload(retry=None)
            return int(blob.size)

        return self._call(size, "sizing", key)

    def delete_prefix(self, prefix: str) -> None:
        def delete() -> None:
            for blob in self._blobs(prefix):
                blob.delete(retry=None)

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        self._call(lambda: self._blob(key).upload_from_filename(str(local), retry=None),
                   "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        def download() -> None:
            tmp = Path(local).with_name(Path(local).name + ".part")
            self._blob(key).download_to_filename(str(tmp), retry=None)
            os.replace(tmp, local)

        self._call(download, "downloading", key)


def open_storage(url: str | os.PathLike, retry: RetryPolicy | None = None) -> Storage:
    """The storage for a path, `file://` URL, `s3://bucket/prefix` or `gs://bucket/prefix`."""
    retry = retry if retry is not None else RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise ConfigError(f"retry={retry!r}: pass a pk.checkpoint.RetryPolicy.")
    if isinstance(url, os.PathLike):
        return LocalStorage(Path(url), retry)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{url!r} is not a checkpoint location; pass a path, s3://bucket/"
                          "prefix or gs://bucket/prefix.")
    scheme, sep, rest = url.partition("://")
    if not sep:
        return LocalStorage(Path(url), retry)
    if scheme == "file":
        return LocalStorage(Path(rest), retry)
    if scheme in ("s3", "gs"):
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ConfigError(f"{url!r} names no bucket; write {scheme}://BUCKET/prefix.")
        return (S3Storage if scheme == "s3" else GCSStorage)(bucket, prefix, retry)
    raise ConfigError(f"{url!r}: unknown storage scheme {scheme!r}; podkit writes checkpoints "
                      "to paths, file://, s3:// and gs://.")
