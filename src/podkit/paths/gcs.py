"""`gs://bucket/prefix` through google-cloud-storage, imported only when such a URL is opened."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError
from podkit.paths.base import Entry, check_key
from podkit.paths.objects import ObjectStore, download_aside, within
from podkit.paths.retry import RetryPolicy, bucket_on_404


class GCSStorage(ObjectStore):
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
            self.client._bucket_metadata_cache = None  # noqa: SLF001 - see above
        self.bucket = self.client.bucket(bucket)

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(self._key(check_key(key)))

    def write_bytes(self, key: str, data: bytes) -> None:
        blob = self._blob(key)
        self._call(bucket_on_404(lambda: blob.upload_from_string(data, retry=None)), "writing",
                   key)

    def read_bytes(self, key: str) -> bytes:
        blob = self._blob(key)
        return self._call(lambda: blob.download_as_bytes(retry=None), "reading", key)

    def exists(self, key: str) -> bool:
        blob = self._blob(key)
        return self._call(lambda: blob.exists(retry=None), "looking up", key)

    def _blobs(self, prefix: str) -> list:
        return list(self.bucket.list_blobs(prefix=self._list_prefix(prefix), retry=None))

    def entries(self, prefix: str = "") -> list[Entry]:
        check_key(prefix, prefix=True)
        return self._call(bucket_on_404(lambda: sorted(
            (Entry(self._rel(b.name), int(b.size or 0), str(b.generation))
             for b in self._blobs(prefix)), key=lambda e: e.key)), "listing", prefix)

    def any_under(self, prefix: str) -> bool:
        check_key(prefix, prefix=True)
        return self._call(bucket_on_404(lambda: any(True for _ in self.bucket.list_blobs(
            prefix=self._list_prefix(prefix), max_results=1, retry=None))), "listing", prefix)

    def children(self, prefix: str) -> list[str]:
        check_key(prefix, prefix=True)
        below = self._key(prefix.rstrip("/")) + "/" if prefix.strip("/") else \
            (f"{self.prefix}/" if self.prefix else "")

        def ls() -> list[str]:
            pages = self.bucket.list_blobs(prefix=below, delimiter="/", retry=None)
            names = {b.name[len(below):] for b in pages}  # consumed first: then .prefixes
            names.update(p[len(below):].rstrip("/") for p in pages.prefixes)
            return sorted(n for n in names if n)

        return self._call(bucket_on_404(ls), "listing", prefix)

    def stat(self, key: str) -> Entry:
        blob = self._blob(key)

        def stat() -> Entry:
            blob.reload(retry=None)
            return Entry(key, int(blob.size), str(blob.generation))

        return self._call(stat, "sizing", key)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        blob = self._blob(key)
        if end <= start:
            return b""
        pin = {"if_generation_match": int(version)} if version else {}
        # `end` is inclusive in google-cloud-storage
        return self._call(lambda: blob.download_as_bytes(start=start, end=end - 1, retry=None,
                                                         **pin), "reading", key)

    def delete(self, key: str) -> None:
        blob = self._blob(key)
        self._call(lambda: blob.delete(retry=None), "deleting", key)

    def copy(self, key: str, target: str) -> None:
        blob, name = self._blob(key), self._key(check_key(target))
        # (no bucket_on_404: here a 404 is most often the source object missing)
        self._call(lambda: self.bucket.copy_blob(blob, self.bucket, name, retry=None),
                   "copying", key)

    def delete_prefix(self, prefix: str) -> None:
        check_key(prefix, prefix=True)
        prefix = prefix.rstrip("/")

        def delete() -> None:
            from google.api_core.exceptions import NotFound

            for blob in self._blobs(prefix):
                if within(self._rel(blob.name), prefix):
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
        self._call(bucket_on_404(lambda: blob.upload_from_filename(str(src), retry=None)),
                   "uploading", key)

    def download_file(self, key: str, local: Path) -> None:
        blob = self._blob(key)
        self._call(lambda: download_aside(
            local, lambda tmp: blob.download_to_filename(tmp, retry=None)), "downloading", key)
