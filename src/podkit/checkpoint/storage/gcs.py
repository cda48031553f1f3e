"""`gs://bucket/prefix` through google-cloud-storage, imported only when such a URL is opened."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from podkit.checkpoint.storage.base import check_key
from podkit.checkpoint.storage.objects import ObjectStore, download_aside, within
from podkit.checkpoint.storage.retry import RetryPolicy, bucket_on_404
from podkit.errors import ConfigError


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

    def list(self, prefix: str = "") -> list[str]:
        check_key(prefix, prefix=True)
        return self._call(lambda: sorted(self._rel(b.name) for b in self._blobs(prefix)),
                          "listing", prefix)

    def size(self, key: str) -> int:
        blob = self._blob(key)

        def size() -> int:
            blob.reload(retry=None)
            return int(blob.size)

        return self._call(size, "sizing", key)

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
