"""Where checkpoint bytes go: local paths, `s3://bucket/prefix`, `gs://bucket/prefix`.

    storage = open_storage("s3://bucket/runs/exp", RetryPolicy(attempts=6))
    storage.write_bytes("step_0000000100/COMMIT.json", data)

One small interface for the three, so that the checkpoint format (format.py) and the manager
never care where they write. Keys are relative to the root named by the URL, with '/'
separators. A local write is atomic per object (temporary file in the same directory, fsync,
rename, fsync of the directory), as a PUT is on an object store: a reader sees the whole old
object, the whole new one, or nothing.

Every call goes through a `RetryPolicy`, and the libraries' own retries are turned off (botocore
`total_max_attempts=1`, s3transfer `num_download_attempts=1`, google-cloud-storage `retry=None`)
so that one policy decides how long podkit keeps trying. Errors are classified:

- transient, retried with exponential backoff: connection refused/reset/closed, timeouts, HTTP
  408/429/500/502/503/504, the throttling codes (SlowDown, RequestTimeout, InternalError,
  ServiceUnavailable, Throttling...), a download whose checksum did not match, and on a local
  file system only EAGAIN, EINTR, EBUSY and ETIMEDOUT. EIO is deliberately *not* retried: it
  means a failing disk or a lost network file system, where retrying hides the fault and rarely
  helps.
- permanent, raised at once: HTTP 401/403 (AccessDenied, InvalidAccessKeyId,
  SignatureDoesNotMatch), missing credentials, a missing bucket or object, other 4xx, and locally
  EACCES/EPERM, EROFS, ENOSPC, EDQUOT, ENOENT...

Either way the caller gets a `StorageError` naming the operation and URL, the attempts, the
cause and the fix; `.transient` says which kind it was and `.missing` that the object does not
exist.

Environment, read by the libraries themselves: S3 -- AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_PROFILE, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 (any
S3-compatible server), AWS_CA_BUNDLE; GCS -- application-default credentials
(GOOGLE_APPLICATION_CREDENTIALS), GOOGLE_CLOUD_PROJECT, and STORAGE_EMULATOR_HOST (with it,
google-cloud-storage uses anonymous credentials, as Google's emulators expect). boto3 and
google-cloud-storage are imported only when such a URL is opened.
"""

from __future__ import annotations

import abc
import dataclasses
import errno
import logging
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from podkit.errors import ConfigError, StorageError

T = TypeVar("T")

__all__ = ["GCSStorage", "LocalStorage", "RetryPolicy", "S3Storage", "Storage", "StorageError",
           "classify", "open_storage"]

_log = logging.getLogger("podkit.checkpoint")

# Local errnos worth another try: the call was interrupted or the resource briefly busy. Kept
# small on purpose: EIO, ENOSPC, EROFS... do not get better by waiting a second.
_TRANSIENT_ERRNO = {errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT}
_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}
_TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "RequestTimeoutException", "InternalError",
                    "ServiceUnavailable", "Throttling", "ThrottlingException",
                    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
                    "PriorRequestNotComplete"}
_PERMISSION_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                     "ExpiredToken", "InvalidToken", "AllAccessDisabled", "AccountProblem"}
# Exception class names (anywhere in the MRO) of network failures, from the standard library,
# urllib3, requests, botocore and google-auth; matched by name so that neither boto3 nor
# google-cloud-storage has to be imported to classify.
_NETWORK_TYPES = {"ConnectionError", "TimeoutError", "Timeout", "ReadTimeout", "ConnectTimeout",
                  "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                  "ConnectionClosedError", "ResponseStreamingError", "IncompleteReadError",
                  "ProtocolError", "ChunkedEncodingError", "NewConnectionError",
                  "IncompleteRead", "RemoteDisconnected", "TransportError", "DataCorruption"}
_CREDENTIAL_TYPES = {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                     "RefreshError", "CredentialRetrievalError", "UnauthorizedSSOTokenError"}

_PERMISSION_FIX = ("Permission denied: check the credentials (AWS_ACCESS_KEY_ID/"
                   "AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS) and the bucket's "
                   "policy.")
_LOCAL_PERMISSION_FIX = ("Permission denied: fix the directory's permissions or point the "
                         "checkpoints elsewhere.")
_FIXES = {
    errno.ENOSPC: "No space left: the disk is full; free space, or point the checkpoints "
                  "(checkpoint.dir) elsewhere.",
    errno.EDQUOT: "The disk quota is used up: free space or raise the quota, or point the "
                  "checkpoints elsewhere.",
    errno.EROFS: "The file system is read-only: remount it read-write or point the checkpoints "
                 "at a writable directory.",
    errno.EACCES: _LOCAL_PERMISSION_FIX,
    errno.EPERM: _LOCAL_PERMISSION_FIX,
    errno.ENOENT: "There is no such file: check the path, or whether the checkpoint was deleted.",
    errno.ENOTDIR: "A part of the path is a file, not a directory: check the path.",
    errno.EISDIR: "The key names a directory, not a file: check the key.",
    errno.EIO: "The disk or network file system reported an I/O error: check the device "
               "(dmesg) or the mount; podkit does not retry EIO.",
}
_MISSING_FIX = ("There is no such object: check the URL, or whether the checkpoint was "
                "deleted or never committed.")
_BUCKET_FIX = "The bucket does not exist: create it or fix the URL."
_BUCKET_GONE = re.compile(r"NoSuchBucket|bucket does not exist|bucket not found|no such bucket",
                          re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for transient storage errors: `attempts` tries in all, waiting
    initial_s, initial_s * multiplier, ... (each capped at max_s, plus up to 10% jitter so that
    many processes do not retry in lockstep) between them."""

    attempts: int = 6
    initial_s: float = 0.2
    max_s: float = 10.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) \
                or self.attempts < 1:
            raise ConfigError(f"RetryPolicy(attempts={self.attempts!r}): use an int >= 1 "
                              "(the total number of tries; 1 = no retries).")
        for name in ("initial_s", "max_s", "multiplier"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < 0:
                raise ConfigError(f"RetryPolicy({name}={value!r}): use a finite number >= 0.")
        if self.multiplier < 1:
            raise ConfigError(f"RetryPolicy(multiplier={self.multiplier!r}): use a number >= 1 "
                              "(the backoff grows by it after each failed try).")
        if self.max_s < self.initial_s:
            raise ConfigError(f"RetryPolicy(max_s={self.max_s!r}) is below initial_s="
                              f"{self.initial_s!r}: use max_s >= initial_s.")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed try number `attempt` (1-based); never less than the
        nominal backoff, so the total wait is at least the sum of the backoffs."""
        base = min(self.initial_s * self.multiplier ** (attempt - 1), self.max_s)
        return base * (1.0 + 0.1 * random.random())

    def call(self, fn: Callable[[], T], what: str) -> T:
        """fn(), retried on transient errors with backoff; permanent ones are raised at once.
        Whatever fails is raised as a StorageError about `what` (e.g. "writing s3://b/k")."""
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except StorageError:
                raise  # already classified and worded (a nested call)
            except Exception as e:  # noqa: BLE001 - every failure is classified below
                transient, cause, fix = classify(e)
                if transient and attempt < self.attempts:
                    pause = self.delay(attempt)
                    _log.warning("podkit: %s failed (%s); try %d of %d in %.2f s", what, cause,
                                 attempt + 1, self.attempts, pause)
                    time.sleep(pause)
                    continue
                tries = f"after {attempt} attempt{'s' if attempt > 1 else ''}"
                if transient:
                    fix += (f" {self} gave up; raise attempts or max_s to ride out longer "
                            "outages.")
                err = StorageError(f"{what} failed {tries}: {cause}. {fix}")
                err.transient = transient
                err.missing = _is_missing(e)
                raise err from e
        raise AssertionError("unreachable")  # pragma: no cover - attempts >= 1


def _chain(e: BaseException) -> list[BaseException]:
    """The error and what it wraps: boto3's S3UploadFailedError wraps the ClientError,
    s3transfer's RetriesExceededError carries `last_exception`."""
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not seen for seen in out):
        out.append(cur)
        inner = getattr(cur, "last_exception", None)
        cur = inner if isinstance(inner, BaseException) else (cur.__cause__ or cur.__context__)
    return out


def _http(e: BaseException) -> tuple[int | None, str | None]:
    """(HTTP status, service error code) of a boto3 or google-cloud error, if it is one."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):  # botocore.exceptions.ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = response.get("Error", {}).get("Code")
        if status is None and code and str(code).isdigit():
            status = int(code)
        return status, code
    code = getattr(e, "code", None)  # google.api_core.exceptions.GoogleAPICallError
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code < 600:
        return code, type(e).__name__
    status = getattr(response, "status_code", None)  # requests / google-resumable-media
    if isinstance(status, int):
        return status, type(e).__name__
    return None, None


def _names(e: BaseException) -> set[str]:
    return {c.__name__ for c in type(e).__mro__}


class _NoSuchBucket(Exception):
    """A write answered 404: only the bucket can be missing (S3 says NoSuchBucket, GCS and its
    emulators may answer a bare 404)."""


def _bucket_on_404(fn: Callable[[], T]) -> Callable[[], T]:
    """fn, with a 404 raised as _NoSuchBucket: for writes, which never miss an object."""
    def call() -> T:
        try:
            return fn()
        except Exception as e:
            if any(_http(inner)[0] == 404 for inner in _chain(e)):
                raise _NoSuchBucket(str(e)) from e
            raise

    return call


def _classify_one(e: BaseException) -> tuple[bool, str] | None:
    """(transient, fix) when this error alone tells what happened, else None."""
    if isinstance(e, _NoSuchBucket):
        return False, _BUCKET_FIX
    status, code = _http(e)
    if status is not None:
        if status in _TRANSIENT_HTTP or code in _TRANSIENT_CODES:
            return True, ("The server kept answering with a temporary error (throttling or "
                          "overload): check the service's health.")
        if status in (401, 403) or code in _PERMISSION_CODES:
            if code == "RequestTimeTooSkewed":
                return False, "This machine's clock is off: synchronise it (NTP)."
            return False, _PERMISSION_FIX
        if code == "NoSuchBucket" or (status == 404 and _BUCKET_GONE.search(str(e))):
            return False, _BUCKET_FIX
        if status == 404:
            return False, _MISSING_FIX
        return False, f"The server refused the request (HTTP {status}, {code})."
    names = _names(e)
    if names & _CREDENTIAL_TYPES:
        return False, ("No usable credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or "
                       "AWS_PROFILE) for s3://, or Google application-default credentials "
                       "(gcloud auth application-default login, GOOGLE_APPLICATION_CREDENTIALS) "
                       "for gs://.")
    if names & _NETWORK_TYPES:
        if "CERTIFICATE_VERIFY_FAILED" in str(e):
            return False, ("The server's TLS certificate was not trusted: check the endpoint "
                           "and the CA bundle (AWS_CA_BUNDLE, REQUESTS_CA_BUNDLE).")
        return True, ("The storage could not be reached or the connection broke: check the "
                      "endpoint (AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST) and the network.")
    if isinstance(e, OSError) and e.errno is not None:
        if e.errno in _TRANSIENT_ERRNO:
            return True, "The file system stayed busy: check the disk or the mount."
        return False, _FIXES.get(e.errno, "Check the path and the file system.")
    return None


def classify(e: BaseException) -> tuple[bool, str, str]:
    """(transient, what happened, what to do) for an error raised by a storage call. The first
    error in the chain (the error, then what it wraps) that tells decides."""
    shown = e.__cause__ if isinstance(e, _NoSuchBucket) and e.__cause__ is not None else e
    cause = f"{type(shown).__name__}: {shown}"
    for inner in _chain(e):
        verdict = _classify_one(inner)
        if verdict is not None:
            status = _http(inner)[0]
            if status is not None and str(status) not in cause:  # botocore names only the code
                cause += f" (HTTP {status})"
            return verdict[0], cause, verdict[1]
    return False, cause, "This error is not one podkit retries; see the cause."


def _is_missing(e: BaseException) -> bool:
    """The object (not the bucket) does not exist."""
    for inner in _chain(e):
        if isinstance(inner, _NoSuchBucket):
            return False
        if isinstance(inner, FileNotFoundError):
            return True
        status, code = _http(inner)
        if status is not None:
            return status == 404 and code != "NoSuchBucket" and not _BUCKET_GONE.search(
                str(inner))
    return False


def _check_key(key: str, prefix: bool = False) -> str:
    """A key (or, with prefix=True, a key prefix) relative to the root: no leading '/', no
    '.' or '..' parts (which would leave the root on a local disk), no empty parts."""
    if not isinstance(key, str):
        raise ConfigError(f"storage key {key!r}: use a str with '/' separators.")
    parts = key.split("/")
    if prefix and parts[-1] == "":
        parts = parts[:-1]  # "step_1/" and "" are prefixes
    if (not prefix and not key) or any(p in ("", ".", "..") for p in parts) or "\0" in key:
        raise ConfigError(f"storage key {key!r}: use a relative key like 'step_0000000100/"
                          "COMMIT.json' (no leading '/', no '.', '..' or empty parts).")
    return key


class Storage(abc.ABC):
    """Checkpoint storage: a root (`url`) holding objects named by '/'-separated keys.

    `list(prefix)` matches keys by string prefix, as object stores do; `delete_prefix(prefix)`
    deletes like a directory: the key `prefix` and everything under `prefix/`, so deleting
    "step_1" never touches "step_10". Every operation is retried by `retry`.
    """

    url: str
    retry: RetryPolicy

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def _where(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}" if key else self.url

    def _call(self, fn: Callable[[], T], op: str, key: str) -> T:
        return self.retry.call(fn, f"{op} {self._where(key)}")

    def _source(self, local: Path | str, key: str) -> Path:
        """The local file to upload, checked before any retry: a missing source is the
        caller's mistake, not a missing object."""
        local = Path(local)
        if not local.is_file():
            raise StorageError(f"uploading {local} to {self._where(key)} failed: {local} is "
                               "not a file; pass the path of an existing file.")
        return local

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing it atomically."""

    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; a missing one raises StorageError with .missing set."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object (not a directory) is stored under `key`."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with `prefix`, recursively, sorted."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete `prefix` and everything under `prefix/` (all of it for ""); fine if absent."""

    @abc.abstractmethod
    def upload_file(self, local: Path, key: str) -> None:
        """Store a local file under `key`, streaming it."""

    @abc.abstractmethod
    def download_file(self, key: str, local: Path) -> None:
        """Copy the object to a local file (written aside, then renamed into place)."""

    def local_dir(self) -> Path | None:
        """The root directory for local storage (Orbax writes into it directly); None for an
        object store."""
        return None


# -- local ------------------------------------------------------------------------------------

_TMP_SUFFIX = ".podkit-tmp"  # names a write in progress; list() hides them


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems (FUSE, SMB) cannot fsync a directory
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _makedirs(path: Path) -> None:
    """mkdir -p, fsyncing the parent of every directory made, so that the new file's path
    survives a crash along with the file."""
    missing = []
    while not path.is_dir() and path.parent != path:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass  # made concurrently (another process), or a file: the write names it
        _fsync_dir(d.parent)


def _atomic_write(path: Path, write: Callable[[BinaryIO], Any], durable: bool = True) -> None:
    """Write a temporary file beside `path` with `write(f)`, then rename it over `path`; on
    any failure the temporary file is removed and `path` is untouched."""
    _makedirs(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(path.parent)


def _rmtree(path: Path) -> None:
    """rmtree that tolerates entries vanishing meanwhile (another process deleting too)."""
    def ignore_missing(func: Any, p: str, exc: Any) -> None:
        e = exc if isinstance(exc, BaseException) else exc[1]
        if not isinstance(e, FileNotFoundError):
            raise e

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=ignore_missing)
    else:  # pragma: no cover - Python 3.11
        shutil.rmtree(path, onerror=ignore_missing)


def _raise_unless_missing(e: OSError) -> None:
    """os.walk's onerror: an unreadable directory is an error (os.walk skips it silently
    otherwise), one that is not there is an empty listing."""
    if not isinstance(e, FileNotFoundError):
        raise e


class LocalStorage(Storage):
    """A directory (created on the first write). Writes are atomic per file: a temporary file
    in the same directory, fsynced, renamed over the key, and the directory fsynced."""

    def __init__(self, root: Path, retry: RetryPolicy) -> None:
        self.root, self.retry = Path(root).expanduser().absolute(), retry
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def write_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._call(lambda: _atomic_write(path, lambda f: f.write(data)), "writing", key)

    def read_bytes(self, key: str) -> bytes:
        return self._call(self._path(key).read_bytes, "reading", key)

    def exists(self, key: str) -> bool:
        return self._call(self._path(key).is_file, "looking up", key)

    def list(self, prefix: str = "") -> list[str]:
        _check_key(prefix, prefix=True)

        def walk() -> list[str]:
            # Walk only the directory the prefix is in, not the whole root.
            base = self.root / prefix.rpartition("/")[0]
            out = []
            for dirpath, _, files in os.walk(base, onerror=_raise_unless_missing):
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in files:
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix) and not name.endswith(_TMP_SUFFIX):
                        out.append(key)
            return sorted(out)

        return self._call(walk, "listing", prefix)

    def size(self, key: str) -> int:
        path = self._path(key)
        return self._call(lambda: path.stat().st_size, "sizing", key)

    def delete_prefix(self, prefix: str) -> None:
        _check_key(prefix, prefix=True)
        path = self.root / prefix.rstrip("/")

        def delete() -> None:
            if path == self.root:  # everything: empty the root, keep it (local_dir)
                for child in (self.root.iterdir() if self.root.is_dir() else ()):
                    if child.is_dir() and not child.is_symlink():
                        _rmtree(child)
                    else:
                        child.unlink(missing_ok=True)
            elif path.is_dir() and not path.is_symlink():
                _rmtree(path)
            else:
                path.unlink(missing_ok=True)

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        src, path = self._source(local, key), self._path(key)

        def upload() -> None:
            with open(src, "rb") as f:
                _atomic_write(path, lambda out: shutil.copyfileobj(f, out, 1 << 20))

        self._call(upload, "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        path, local = self._path(key), Path(local)

        def download() -> None:
            with open(path, "rb") as f:  # opened first: a missing key leaves nothing behind
                # a scratch copy: no fsync (the checkpoint itself is what must be durable)
                _atomic_write(local, lambda out: shutil.copyfileobj(f, out, 1 << 20),
                              durable=False)

        self._call(download, "downloading", key)

    def local_dir(self) -> Path:
        return self.root


# -- object stores ----------------------------------------------------------------------------

def _download_aside(local: Path, fetch: Callable[[str], Any]) -> None:
    """fetch(tmp) writes the object to a temporary file beside `local`, renamed into place on
    success and removed on failure."""
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.", suffix=_TMP_SUFFIX)
    os.close(fd)
    try:
        fetch(tmp)
        os.replace(tmp, local)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _within(rel: str, prefix: str) -> bool:
    """Directory semantics of delete_prefix: `prefix` itself or anything under `prefix/`."""
    return not prefix or rel == prefix or rel.startswith(prefix + "/")


class _ObjectStore(Storage):
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


class S3Storage(_ObjectStore):
    """`s3://bucket/prefix` through boto3 (any S3-compatible server via AWS_ENDPOINT_URL)."""

    def __init__(self, bucket: str, prefix: str, retry: RetryPolicy) -> None:
        super().__init__("s3", bucket, prefix, retry)
        try:
            import boto3
            import botocore.config
            from boto3.s3.transfer import TransferConfig
        except ImportError as e:  # pragma: no cover - pinned in requirements.lock
            raise ConfigError(f"{self.url}: s3:// checkpoints need boto3 ({e}); install it "
                              "with `pip install boto3` (pinned in requirements.lock).") from None
        # total_max_attempts=1: botocore tries once and RetryPolicy decides (botocore's
        # `max_attempts` counts retries, so max_attempts=1 would still mean two tries).
        config = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                        connect_timeout=10, read_timeout=60)
        try:
            # A session per storage: boto3's default session is not safe to share between
            # threads that make clients. Making a client reads the environment, no network.
            self.client = boto3.session.Session().client("s3", config=config)
        except Exception as e:  # noqa: BLE001 - e.g. a malformed AWS_ENDPOINT_URL
            raise ConfigError(f"{self.url}: cannot make an S3 client ({type(e).__name__}: {e})"
                              "; check AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, "
                              "AWS_DEFAULT_REGION and AWS_PROFILE.") from e
        # s3transfer streams files in 8 MiB parts; its own download retries are off too.
        self._transfer = TransferConfig(max_concurrency=4, num_download_attempts=1)

    def write_bytes(self, key: str, data: bytes) -> None:
        name = self._key(_check_key(key))
        self._call(_bucket_on_404(lambda: self.client.put_object(
            Bucket=self.bucket_name, Key=name, Body=data)), "writing", key)

    def read_bytes(self, key: str) -> bytes:
        name = self._key(_check_key(key))
        return self._call(lambda: self.client.get_object(
            Bucket=self.bucket_name, Key=name)["Body"].read(), "reading", key)

    def exists(self, key: str) -> bool:
        name = self._key(_check_key(key))

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket_name, Key=name)
                return True
            except Exception as e:
                if _http(e)[0] == 404:  # HEAD has no body: a missing bucket looks the same
                    return False
                raise

        return self._call(head, "looking up", key)

    def _objects(self, prefix: str) -> list[dict]:
        out: list[dict] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket_name, Prefix=self._list_prefix(prefix)):
            out.extend(page.get("Contents", []))
        return out

    def list(self, prefix: str = "") -> list[str]:
        _check_key(prefix, prefix=True)
        return self._call(lambda: sorted(self._rel(o["Key"]) for o in self._objects(prefix)),
                          "listing", prefix)

    def size(self, key: str) -> int:
        name = self._key(_check_key(key))
        return self._call(lambda: int(self.client.head_object(
            Bucket=self.bucket_name, Key=name)["ContentLength"]), "sizing", key)

    def delete_prefix(self, prefix: str) -> None:
        _check_key(prefix, prefix=True)
        prefix = prefix.rstrip("/")

        def delete() -> None:
            from botocore.exceptions import ClientError

            names = [o["Key"] for o in self._objects(prefix) if _within(self._rel(o["Key"]),
                                                                         prefix)]
            for i in range(0, len(names), 1000):  # DeleteObjects takes 1000 keys a call
                answer = self.client.delete_objects(Bucket=self.bucket_name, Delete={
                    "Objects": [{"Key": n} for n in names[i:i + 1000]], "Quiet": True})
                for failed in answer.get("Errors", []):
                    # A 200 answer can still refuse keys one by one; raise the first as the
                    # ClientError it would have been, to be classified like one.
                    code = failed.get("Code", "")
                    status = 403 if code in _PERMISSION_CODES else \
                        503 if code in _TRANSIENT_CODES else 400
                    raise ClientError({"Error": {"Code": code, "Message": failed.get(
                        "Message", "") + f" ({failed.get('Key')})"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "DeleteObjects")

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        src, name = self._source(local, key), self._key(_check_key(key))
        self._call(_bucket_on_404(lambda: self.client.upload_file(
            str(src), self.bucket_name, name, Config=self._transfer)), "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        name = self._key(_check_key(key))
        self._call(lambda: _download_aside(local, lambda tmp: self.client.download_file(
            self.bucket_name, name, tmp, Config=self._transfer)), "downloading", key)


class GCSStorage(_ObjectStore):
    """`gs://bucket/prefix` through google-cloud-storage (STORAGE_EMULATOR_HOST honoured)."""

    _CHUNK = 32 << 20  # resumable uploads (files > 8 MiB) send and hold 32 MiB at a time

    def __init__(self, bucket: str, prefix: str, retry: RetryPolicy) -> None:
        super().__init__("gs", bucket, prefix, retry)
        try:
            from google.cloud import storage as gcs
        except ImportError as e:  # pragma: no cover - pinned in requirements.lock
            raise ConfigError(f"{self.url}: gs:// checkpoints need google-cloud-storage ({e}); "
                              "install it with `pip install google-cloud-storage` (pinned in "
                              "requirements.lock).") from None
        # With STORAGE_EMULATOR_HOST set, Client() itself switches to anonymous credentials
        # and the emulator's endpoint; otherwise it finds application-default credentials and
        # the project (passing project=None would switch that inference off).
        project = os.environ.get("GOOGLE_CLOUD_PROJECT")
        kwargs = {"project": project} if project else {}
        self.client = self.retry.call(lambda: gcs.Client(**kwargs), f"connecting to {self.url}")
        if getattr(self.client, "_bucket_metadata_cache", None) is not None:
            # google-cloud-storage >= 3.x fetches each bucket's metadata in a background thread,
            # only to label tracing spans: a request outside RetryPolicy that needs
            # storage.buckets.get. podkit does without (every check of the attribute is
            # `if cache`).
            self.client._bucket_metadata_cache = None
        self.bucket = self.client.bucket(bucket)

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(self._key(_check_key(key)))

    def write_bytes(self, key: str, data: bytes) -> None:
        blob = self._blob(key)
        self._call(_bucket_on_404(lambda: blob.upload_from_string(data, retry=None)), "writing",
                   key)

    def read_bytes(self, key: str) -> bytes:
        blob = self._blob(key)
        return self._call(lambda: blob.download_as_bytes(retry=None), "reading", key)

    def exists(self, key: str) -> bool:
        blob = self._blob(key)
        return self._call(lambda: blob.exists(retry=None), "looking up", key)

    def _blobs(self, prefix: str) -> list:
        return list(self.bucket.list_blobs(prefix=self._list_prefix(prefix), retry=None))

    def list(self, prefix: str = "") -> list[str]:
        _check_key(prefix, prefix=True)
        return self._call(lambda: sorted(self._rel(b.name) for b in self._blobs(prefix)),
                          "listing", prefix)

    def size(self, key: str) -> int:
        blob = self._blob(key)

        def size() -> int:
            blob.reload(retry=None)
            return int(blob.size)

        return self._call(size, "sizing", key)

    def delete_prefix(self, prefix: str) -> None:
        _check_key(prefix, prefix=True)
        prefix = prefix.rstrip("/")

        def delete() -> None:
            from google.api_core.exceptions import NotFound

            for blob in self._blobs(prefix):
                if _within(self._rel(blob.name), prefix):
                    try:
                        blob.delete(retry=None)
                    except NotFound:  # deleted meanwhile (or by an earlier try): fine
                        pass

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        src, blob = self._source(local, key), self._blob(key)
        # Only for uploads: a blob with a chunk size would also download in ranged chunks,
        # without the whole-object checksum.
        blob.chunk_size = self._CHUNK
        self._call(_bucket_on_404(lambda: blob.upload_from_filename(str(src), retry=None)),
                   "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        blob = self._blob(key)
        self._call(lambda: _download_aside(
            local, lambda tmp: blob.download_to_filename(tmp, retry=None)), "downloading", key)


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
