"""One path layer for every file podkit reads or writes: local paths, `gs://` and `s3://`.

    from podkit import paths
    with paths.open("gs://bucket/data/train-00000.tfrecord", "rb") as f:  # ranged, seekable
        f.seek(offset)
    with paths.open("s3://bucket/out/x.json", "w") as f:             # uploaded whole on close
        f.write(text)
    paths.glob("gs://bucket/data/train-*.tfrecord")
    with paths.local_copy("gs://bucket/m.weights.h5") as local: ...  # for h5py, C++ readers
    with paths.staged("gs://bucket/export/model") as local: ...      # write here, uploaded

Local paths, `s3://` and `gs://` behave the same or fail with a podkit error naming the path:
a malformed URL (`gcs://`, `s3:/bucket`, no bucket) is a ConfigError, never a local folder
called `gs:`; a storage failure is a StorageError (`.missing` for nothing there, `.transient`
for a cause that retries did not outlast). Writes are atomic: a file or directory appears
whole when its writer closes cleanly, and not at all when it raises.

The backends are podkit's own object-store clients (boto3 and google-cloud-storage, with the
`RetryPolicy` every call goes through and one classification of errors): `base.py` the
`Storage` interface, `retry.py`, `atomic.py` (local files replaced at once), `local.py`,
`objects.py` (what S3 and GCS share), `s3.py`, `gcs.py`; `storage.py` URL checks and
`open_storage` (a root and keys below it, what checkpoints use). On top: `files.py` `open`,
`ops.py` the os/glob/shutil verbs (and `stat`: size and version), `transfer.py`
`local_copy`, `staged`, `rename`; `mirror.py` a local working copy of a remote directory for
writers that append (run directories on gs:// and s3://).
"""

from __future__ import annotations

from podkit.paths.base import Entry, Storage
from podkit.paths.files import open
from podkit.paths.mirror import Mirror, cache_root
from podkit.paths.ops import (
    exists,
    glob,
    is_url,
    isdir,
    join,
    listdir,
    makedirs,
    remove,
    rmtree,
    size,
    stat,
)
from podkit.paths.retry import RetryPolicy, classify
from podkit.paths.storage import open_storage
from podkit.paths.transfer import local_copy, rename, staged

__all__ = ["Entry", "Mirror", "RetryPolicy", "Storage", "cache_root", "classify", "exists",
           "glob", "is_url", "isdir",
           "join", "listdir", "local_copy", "makedirs", "open", "open_storage", "remove",
           "rename", "rmtree", "size", "staged", "stat"]
