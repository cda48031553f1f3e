"""Retries and error classification for every storage call.

Every call goes through a `RetryPolicy`, and the libraries' own retries are turned off
(botocore `total_max_attempts=1`, s3transfer `num_download_attempts=1`, google-cloud-storage
`retry=None`) so that one policy decides how long podkit keeps trying. Errors are classified:

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
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import math
import random
import re
import time
from collections.abc import Callable
from typing import TypeVar

from podkit.errors import ConfigError, StorageError

T = TypeVar("T")

_log = logging.getLogger("podkit.paths")

# Local errnos worth another try: the call was interrupted or the resource briefly busy. Kept
# small on purpose: EIO, ENOSPC, EROFS... do not get better by waiting a second.
_TRANSIENT_ERRNO = {errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT}
_TRANSIENT_HTTP = {408, 429, 500, 502, 503, 504}
TRANSIENT_CODES = {"SlowDown", "RequestTimeout", "RequestTimeoutException", "InternalError",
                    "ServiceUnavailable", "Throttling", "ThrottlingException",
                    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
                    "PriorRequestNotComplete"}
PERMISSION_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
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
_LOCAL_PERMISSION_FIX = ("Permission denied: fix the directory's permissions or write "
                         "elsewhere (for checkpoints: checkpoint.dir).")
_FIXES = {
    errno.ENOSPC: "No space left: the disk is full; free space, or write elsewhere (for "
                  "checkpoints: checkpoint.dir).",
    errno.EDQUOT: "The disk quota is used up: free space or raise the quota, or write "
                  "elsewhere.",
    errno.EROFS: "The file system is read-only: remount it read-write or write to a writable "
                 "directory.",
    errno.EACCES: _LOCAL_PERMISSION_FIX,
    errno.EPERM: _LOCAL_PERMISSION_FIX,
    errno.ENOENT: "There is no such file: check the path (a checkpoint's: whether it was "
                  "deleted).",
    errno.ENOTDIR: "A part of the path is a file, not a directory: check the path.",
    errno.EISDIR: "The key names a directory, not a file: check the key.",
    errno.EIO: "The disk or network file system reported an I/O error: check the device "
               "(dmesg) or the mount; podkit does not retry EIO.",
}
_MISSING_FIX = ("There is no such file or object: check the path (a checkpoint's: whether "
                "it was deleted or never committed).")
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
            except Exception as e:  # every failure is classified below
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
                cause = cause.rstrip(". ")  # the library's own full stop, not a doubled one
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


def http_status(e: BaseException) -> tuple[int | None, str | None]:
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


class Changed(Exception):
    """A ranged read found a newer version of the object than the one it started on."""


_CHANGED_FIX = ("The object was replaced while it was being read: open it again (and do not "
                "overwrite a file that is being read).")


class _NoSuchBucket(Exception):
    """A write answered 404: only the bucket can be missing (S3 says NoSuchBucket, GCS and its
    emulators may answer a bare 404)."""


def bucket_on_404(fn: Callable[[], T]) -> Callable[[], T]:
    """fn, with a 404 raised as _NoSuchBucket: for writes and listings, which never miss an
    object."""
    def call() -> T:
        try:
            return fn()
        except Exception as e:
            if any(http_status(inner)[0] == 404 for inner in _chain(e)):
                raise _NoSuchBucket(str(e)) from e
            raise

    return call


def _classify_one(e: BaseException) -> tuple[bool, str] | None:
    """(transient, fix) when this error alone tells what happened, else None."""
    if isinstance(e, _NoSuchBucket):
        return False, _BUCKET_FIX
    if isinstance(e, Changed):
        return False, _CHANGED_FIX
    status, code = http_status(e)
    if status == 412:  # a read pinned to a version (If-Match, ifGenerationMatch) found another
        return False, _CHANGED_FIX
    if status is not None:
        if status in _TRANSIENT_HTTP or code in TRANSIENT_CODES:
            return True, ("The server kept answering with a temporary error (throttling or "
                          "overload): check the service's health.")
        if status in (401, 403) or code in PERMISSION_CODES:
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
            status = http_status(inner)[0]
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
        status, code = http_status(inner)
        if status is not None:
            return status == 404 and code != "NoSuchBucket" and not _BUCKET_GONE.search(
                str(inner))
    return False
