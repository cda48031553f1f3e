"""Checkpoints: transactional, asynchronous, verified, on local disks and object stores.

    manager = pk.checkpoint.CheckpointManager("runs/exp/checkpoints", every_steps=500)
    model.fit(x, y, epochs=10, checkpoint=manager)     # or checkpoint="runs/exp/checkpoints"

`arrays.py` a pytree as named flat arrays on disk (Orbax), checked before reading (also the
arrays of `model.save`); `format.py` what a checkpoint is on storage (step directories,
per-process manifests, the commit record written last); `manager.py` when and how a TrainState
is saved and restored; the local tier beside it: `local_tier.py` (each process's shards on its
own disk), `shards.py` (them as one buffer), `peer.py` (copied to a peer process), `tiers.py`
(restore from the newer tier). The bytes go through the path layer's storages (`podkit.paths`: local
paths, s3://, gs://, with retries). This package imports nothing above it (no model, saving,
callbacks or train).
"""

from __future__ import annotations

from podkit.checkpoint.format import CheckpointInfo
from podkit.checkpoint.manager import CheckpointManager, Restored
from podkit.errors import StorageError
from podkit.paths import RetryPolicy, open_storage

__all__ = ["CheckpointInfo", "CheckpointManager", "Restored", "RetryPolicy", "StorageError",
           "open_storage"]
