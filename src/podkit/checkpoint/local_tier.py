"""The local checkpoint tier: frequent saves to each process's own disk, each copied to a peer.

    tier = LocalTier("/tmp/podkit-local/RUN", every_steps=50, keep=2)
    tier.save(step, {"state": state, "sums": sums}, meta={...}, data_state=...)

Beside the persistent tier (`CheckpointManager`: object storage, Orbax, a commit record for
the whole step), a local step costs no storage round trip and no coordination: each process
writes only the shards it holds (`shards.py`: raw bytes and an index), with its data-iterator
state and the meta record, under its own directory, and marks that part complete with a
commit file of its own, written last. Its peer, process (i + 1) % n, receives the same bytes
through a device collective (`peer.py`) and writes them into *its* directory as a copy of
process i, so a process whose disk (or host) is lost can get its shards back from the peer.

    DIR/process_{i}/step_{S:010d}/part_{i}/       this process's shards at step S
                                  part_{i-1}/     the copy it keeps of process i - 1's
        shards.bin   record.json   COMMIT.json    (sizes and xxh3-128 of the other two; last)

What the loop waits for: the packing of its shards into one buffer and the transfer are
dispatched like a step (the loop goes on; they run after the step on the devices); the copy
off the device, the peer's record and the writes run on a background thread. A failure there
is a warning (the step is not marked complete; the persistent tier is unaffected): the local
tier only ever shortens what a restart redoes.

Restore (`tiers.py`) picks the newest step that is complete for every process, in its own
directory or as its peer's copy, against the persistent tier's newest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from podkit import agree
from podkit.checkpoint import arrays, peer, shards
from podkit.checkpoint import format as fmt
from podkit.errors import ConfigError

DATA, RECORD, DONE = "shards.bin", "record.json", "COMMIT.json"
_KEY = "podkit/local-tier/"  # the coordination service's keys of the peers' records


def default_dir(persistent: str) -> str:
    """The local tier of the checkpoints in `persistent` (a path or URL): a directory on this
    machine's disk named after it, so a restarted process finds it again."""
    tag = hashlib.sha256(persistent.encode()).hexdigest()[:16]
    return str(Path(tempfile.gettempdir()) / "podkit-local-checkpoints" / tag)


class LocalDamage(Exception):
    """A part of a local step that cannot be used (missing, incomplete, corrupt)."""


class LocalTier:
    """Frequent checkpoints on each process's local disk, each process's copied to its peer
    (see the module docstring). every_steps: saves when the step crosses a multiple of it;
    keep: the newest complete steps kept; timeout_s: how long a save waits for the peer's
    record."""

    def __init__(self, directory: str | os.PathLike, every_steps: int, keep: int = 2,
                 timeout_s: float = 600.0) -> None:
        for name, v in (("local_every_steps", every_steps), ("local_keep", keep)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"CheckpointManager({name}={v!r}): must be a positive int.")
        if "://" in os.fspath(directory):
            raise ConfigError(f"local_dir={os.fspath(directory)!r}: the local tier is a "
                              "directory on this machine (a path, e.g. under /tmp or "
                              "/dev/shm), not a URL; the persistent tier takes URLs.")
        self.directory = Path(directory)
        self.every_steps, self.keep, self.timeout_s = every_steps, keep, timeout_s
        self._thread: threading.Thread | None = None
        self.last_requested: int | None = None
        self.last_saved: int | None = None  # the newest step whose parts this process wrote
        self.last_blocking_s = 0.0  # what save() cost the caller, for logs and benchmarks
        self.failures = 0

    def __repr__(self) -> str:
        return f"LocalTier({str(self.directory)!r}, every_steps={self.every_steps})"

    @property
    def root(self) -> Path:
        """This process's own directory (no process reads another's)."""
        return self.directory / f"process_{jax.process_index()}"

    def due(self, step: int, previous_step: int) -> bool:
        return step // self.every_steps > previous_step // self.every_steps

    # -- save --------------------------------------------------------------------------------
    def save(self, step: int, tree: Any, meta: dict | None = None,
             data_state: Any = None) -> None:
        """Save `tree` as local step `step`. Every process calls it, at the same step, from
        the thread that dispatches the steps (it dispatches a collective)."""
        self.wait()
        t0 = time.perf_counter()
        self.last_requested = step
        n, i = jax.process_count(), jax.process_index()
        flat = arrays.flatten(tree)
        plans = shards.layout(flat)
        length = peer.padded(max(p["length"] for p in plans))
        buffer = shards.pack(flat, plans[i], length)
        received = peer.shift(buffer, 1) if n > 1 else None
        record = json.dumps(dict(plans[i], step=step, process=i, processes=n,
                                 meta=dict(meta or {}, step=step), data_state=data_state),
                            sort_keys=True, default=fmt.jsonable)
        self._thread = threading.Thread(
            target=self._write, name=f"podkit-local-ckpt-{step}", daemon=True,
            args=(step, buffer, plans[i]["length"], record, received,
                  plans[(i - 1) % n]["length"]))
        self._thread.start()
        self.last_blocking_s = time.perf_counter() - t0

    def _write(self, step: int, buffer: jax.Array, length: int, record: str,
               received: jax.Array | None, peer_length: int) -> None:
        n, i = jax.process_count(), jax.process_index()
        try:
            client = agree.coordination_client() if n > 1 else None
            if client is not None:  # the peer writes this record beside its copy
                client.key_value_set(self._key(step, i), record, allow_overwrite=True)
            self._write_part(step, i, np.asarray(buffer)[:length], record.encode())
            del buffer
            if received is not None:
                if client is None:
                    raise RuntimeError("no coordination service to get the peer's record from")
                j = (i - 1) % n
                theirs = client.blocking_key_value_get(self._key(step, j),
                                                       int(self.timeout_s * 1000))
                client.key_value_delete(self._key(step, j))
                self._write_part(step, j, np.asarray(received)[:peer_length], theirs.encode())
            self.last_saved = step
            self._collect()
        except Exception as e:  # the local tier only shortens a restart's redo: say, go on
            self.failures += 1
            warnings.warn(f"podkit: local checkpoint step {step} in {self.root} failed: "
                          f"{type(e).__name__}: {e}. The persistent tier is unaffected.",
                          stacklevel=1)

    def _key(self, step: int, process: int) -> str:
        tag = hashlib.sha256(str(self.directory.absolute()).encode()).hexdigest()[:12]
        return f"{_KEY}{tag}/{step}/{process}"

    def _write_part(self, step: int, part: int, data: np.ndarray, record: bytes) -> None:
        d = self.root / fmt.step_dir(step) / f"part_{part}"
        if d.exists():  # a step left half-written by an earlier run
            shutil.rmtree(d)
        d.mkdir(parents=True)
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        (d / DATA).write_bytes(view)
        (d / RECORD).write_bytes(record)
        done = json.dumps({"step": step, "part": part, "files": {
            DATA: [len(view), fmt.hash_bytes(view)],
            RECORD: [len(record), fmt.hash_bytes(record)]}}).encode()
        tmp = d / f".{DONE}.tmp"
        tmp.write_bytes(done)
        os.replace(tmp, d / DONE)  # the part exists from here on, whole

    def _collect(self) -> None:
        """Keep the newest `keep` steps this process holds its own part of; older step
        directories go (a newer incomplete one may be a save in progress)."""
        complete = [s for s in self.steps() if (self._part_dir(s, jax.process_index())
                                                / DONE).exists()]
        kept = set(complete[-self.keep:])
        newest = complete[-1] if complete else None
        for d in self.root.iterdir() if self.root.is_dir() else ():
            s = fmt.parse_step(d.name)
            if s is not None and newest is not None and s < newest and s not in kept:
                shutil.rmtree(d, ignore_errors=True)

    def wait(self) -> None:
        """Until the local save in flight is written (its failure was a warning)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- what is there -----------------------------------------------------------------------
    def _part_dir(self, step: int, part: int) -> Path:
        return self.root / fmt.step_dir(step) / f"part_{part}"

    def steps(self) -> list[int]:
        """The steps in this process's directory (whole, partial or damaged: `read_part`
        tells), oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(s for s in map(fmt.parse_step, (d.name for d in self.root.iterdir()))
                      if s is not None)

    def read_part(self, step: int, part: int) -> tuple[dict, bytes]:
        """(record, shard bytes) of process `part`'s shards at `step`, as this process holds
        them, checked against its commit file; LocalDamage says why not."""
        d = self._part_dir(step, part)
        try:
            done = json.loads((d / DONE).read_bytes())
        except (OSError, ValueError):
            raise LocalDamage(f"incomplete in {d} (no commit file)") from None
        blobs = {}
        for name, (size, digest) in done["files"].items():
            try:
                blob = (d / name).read_bytes()
            except OSError:
                raise LocalDamage(f"{d / name} is missing") from None
            if len(blob) != size or fmt.hash_bytes(blob) != digest:
                raise LocalDamage(f"{d / name} does not match its size or checksum")
            blobs[name] = blob
        return json.loads(blobs[RECORD]), blobs[DATA]
