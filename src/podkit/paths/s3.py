"""`s3://bucket/prefix` through boto3, imported only when such a URL is opened."""

from __future__ import annotations

from pathlib import Path

from podkit.errors import ConfigError
from podkit.paths.base import Entry, check_key
from podkit.paths.objects import ObjectStore, download_aside, within
from podkit.paths.retry import (
    PERMISSION_CODES,
    TRANSIENT_CODES,
    RetryPolicy,
    bucket_on_404,
    http_status,
)


class S3Storage(ObjectStore):
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
        except Exception as e:  # e.g. a malformed AWS_ENDPOINT_URL
            raise ConfigError(f"{self.url}: cannot make an S3 client ({type(e).__name__}: {e})"
                              "; check AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3, "
                              "AWS_DEFAULT_REGION and AWS_PROFILE.") from e
        # s3transfer streams files in 8 MiB parts; its own download retries are off too.
        self._transfer = TransferConfig(max_concurrency=4, num_download_attempts=1)

    def write_bytes(self, key: str, data: bytes) -> None:
        name = self._key(check_key(key))
        self._call(bucket_on_404(lambda: self.client.put_object(
            Bucket=self.bucket_name, Key=name, Body=data)), "writing", key)

    def read_bytes(self, key: str) -> bytes:
        name = self._key(check_key(key))
        return self._call(lambda: self.client.get_object(
            Bucket=self.bucket_name, Key=name)["Body"].read(), "reading", key)

    def exists(self, key: str) -> bool:
        name = self._key(check_key(key))

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket_name, Key=name)
                return True
            except Exception as e:
                if http_status(e)[0] == 404:  # HEAD has no body: a missing bucket looks the same
                    return False
                raise

        return self._call(head, "looking up", key)

    def _objects(self, prefix: str) -> list[dict]:
        out: list[dict] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket_name, Prefix=self._list_prefix(prefix)):
            out.extend(page.get("Contents", []))
        return out

    def entries(self, prefix: str = "") -> list[Entry]:
        check_key(prefix, prefix=True)
        return self._call(bucket_on_404(lambda: sorted(
            (Entry(self._rel(o["Key"]), int(o["Size"]), o.get("ETag", ""))
             for o in self._objects(prefix)), key=lambda e: e.key)), "listing", prefix)

    def any_under(self, prefix: str) -> bool:
        check_key(prefix, prefix=True)
        return self._call(bucket_on_404(lambda: self.client.list_objects_v2(
            Bucket=self.bucket_name, Prefix=self._list_prefix(prefix), MaxKeys=1).get(
            "KeyCount", 0) > 0), "listing", prefix)

    def children(self, prefix: str) -> list[str]:
        check_key(prefix, prefix=True)
        below = self._key(prefix.rstrip("/")) + "/" if prefix.strip("/") else \
            (f"{self.prefix}/" if self.prefix else "")

        def ls() -> list[str]:
            names = set()
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket_name, Prefix=below, Delimiter="/"):
                names.update(o["Key"][len(below):] for o in page.get("Contents", []))
                names.update(c["Prefix"][len(below):].rstrip("/")
                             for c in page.get("CommonPrefixes", []))
            return sorted(n for n in names if n)

        return self._call(bucket_on_404(ls), "listing", prefix)

    def stat(self, key: str) -> Entry:
        name = self._key(check_key(key))

        def head() -> Entry:
            answer = self.client.head_object(Bucket=self.bucket_name, Key=name)
            return Entry(key, int(answer["ContentLength"]), answer.get("ETag", ""))

        return self._call(head, "sizing", key)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        name = self._key(check_key(key))
        if end <= start:
            return b""
        pin = {"IfMatch": version} if version else {}
        return self._call(lambda: self.client.get_object(
            Bucket=self.bucket_name, Key=name, Range=f"bytes={start}-{end - 1}",
            **pin)["Body"].read(), "reading", key)

    def delete(self, key: str) -> None:
        # DeleteObject answers 204 for a missing key: look first, so that a missing object is
        # the same error as on a disk.
        self.stat(key)
        name = self._key(key)
        self._call(lambda: self.client.delete_object(Bucket=self.bucket_name, Key=name),
                   "deleting", key)

    def copy(self, key: str, target: str) -> None:
        src, dst = self._key(check_key(key)), self._key(check_key(target))
        # the managed copy: multipart (UploadPartCopy) over 8 MiB, as CopyObject stops at 5 GB
        # (no bucket_on_404: here a 404 is most often the source object missing)
        self._call(lambda: self.client.copy(
            {"Bucket": self.bucket_name, "Key": src}, self.bucket_name, dst,
            Config=self._transfer), "copying", key)

    def delete_prefix(self, prefix: str) -> None:
        check_key(prefix, prefix=True)
        prefix = prefix.rstrip("/")

        def delete() -> None:
            from botocore.exceptions import ClientError

            names = [o["Key"] for o in self._objects(prefix) if within(self._rel(o["Key"]),
                                                                         prefix)]
            for i in range(0, len(names), 1000):  # DeleteObjects takes 1000 keys a call
                answer = self.client.delete_objects(Bucket=self.bucket_name, Delete={
                    "Objects": [{"Key": n} for n in names[i:i + 1000]], "Quiet": True})
                for failed in answer.get("Errors", []):
                    # A 200 answer can still refuse keys one by one; raise the first as the
                    # ClientError it would have been, to be classified like one.
                    code = failed.get("Code", "")
                    status = 403 if code in PERMISSION_CODES else \
                        503 if code in TRANSIENT_CODES else 400
                    raise ClientError({"Error": {"Code": code, "Message": failed.get(
                        "Message", "") + f" ({failed.get('Key')})"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "DeleteObjects")

        self._call(delete, "deleting", prefix)

    def upload_file(self, local: Path, key: str) -> None:
        src, name = self._source(local, key), self._key(check_key(key))
        self._call(bucket_on_404(lambda: self.client.upload_file(
            str(src), self.bucket_name, name, Config=self._transfer)), "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        name = self._key(check_key(key))
        self._call(lambda: download_aside(local, lambda tmp: self.client.download_file(
            self.bucket_name, name, tmp, Config=self._transfer)), "downloading", key)
