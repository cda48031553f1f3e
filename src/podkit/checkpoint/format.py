"""What a checkpoint is on storage, and how to tell a whole one from a broken one.

    DIR/step_0000000500/
        state/              the arrays, written by Orbax (every process writes its shards)
        process_0.json      per process: the files it wrote (size, xxh3-128) and its
        process_1.json      data-iterator state
        meta.json           process 0: step, epoch position, metrics history, config
        COMMIT.json         process 0, written last: every file above with size and checksum

A step exists for readers only when COMMIT.json does, and COMMIT.json is written only after
every process's manifest is there (so every process finished writing). Anything else — no
commit record, a file missing, a size or checksum that differs — is incomplete or corrupt and
is never loaded. No file is ever unpickled: the records are JSON, the arrays Orbax's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import mmap
import os
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xxhash

FORMAT = "podkit.checkpoint/1"
STATE = "state"
META = "meta.json"
COMMIT = "COMMIT.json"
_STEP = re.compile(r"^step_(\d{10})$")
_CHUNK = 16 << 20  # bytes per read when a file is hashed by reading it
_HASH_THREADS = 4  # files hashed at once (xxhash releases the GIL)

Status = Literal["valid", "incomplete", "corrupt"]


def step_dir(step: int) -> str:
    return f"step_{step:010d}"


def parse_step(name: str) -> int | None:
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def manifest_name(process: int) -> str:
    return f"process_{process}.json"


def owner(relpath: str) -> int:
    """Which process writes a file of Orbax's layout: `ocdbt.process_i/...` and
    `array_metadatas/process_i` are process i's, everything else process 0's."""
    parts = relpath.split("/")
    for i, part in enumerate(parts):
        if part.startswith("ocdbt.process_"):
            return int(part.removeprefix("ocdbt.process_"))
        if part == "array_metadatas" and i + 1 < len(parts):
            return int(parts[i + 1].removeprefix("process_"))
    return 0


def hash_file(path: Path, sync: bool = False, mapped: bool = False) -> str:
    """xxh3-128 of a file; `sync` also makes it durable first (fsync), so a commit record
    written after it never points at bytes still in the page cache. `mapped` hashes the page
    cache in place (mmap: no copy into Python) -- only for files no one truncates meanwhile,
    as files this process has just written (a truncated mapping ends the process, SIGBUS)."""
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        if sync:
            os.fsync(f.fileno())
        size = os.fstat(f.fileno()).st_size
        if mapped and size:
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
                if hasattr(m, "madvise"):
                    m.madvise(mmap.MADV_SEQUENTIAL)
                h.update(m)
            return h.hexdigest()
        buf = memoryview(bytearray(min(_CHUNK, max(size, 1))))
        while n := f.readinto(buf):
            h.update(buf[:n])
    return h.hexdigest()


def hash_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def files_of(root: Path, process: int, prefix: str = "") -> dict[str, list]:
    """{relative path: [size, xxh3]} of the files under `root` that `process` wrote, each
    fsynced first; hashed on threads, from the page cache in place (the files were just
    written, so hashing them costs no disk read and no copy)."""
    mine = [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*")) if p.is_file()]
    mine = [(rel, p) for rel, p in mine if owner(rel) == process]
    with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS) as pool:
        digests = list(pool.map(lambda item: hash_file(item[1], sync=True, mapped=True), mine))
    return {prefix + rel: [p.stat().st_size, digest]
            for (rel, p), digest in zip(mine, digests, strict=True)}


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One step directory: `status` valid / incomplete / corrupt, and why when not valid."""

    step: int
    status: Status
    reason: str = ""
    bytes: int = 0

    @property
    def valid(self) -> bool:
        return self.status == "valid"


def read_commit(data: bytes | None, step: int) -> tuple[dict | None, CheckpointInfo | None]:
    """(commit record, None) or (None, the reason it is unusable)."""
    if data is None:
        return None, CheckpointInfo(step, "incomplete", "no commit record: the save was "
                                    "interrupted (or is still running)")
    try:
        record = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, CheckpointInfo(step, "corrupt", f"{COMMIT} is not valid JSON ({e})")
    if not isinstance(record, dict) or record.get("format") != FORMAT \
            or record.get("step") != step or not isinstance(record.get("files"), dict):
        return None, CheckpointInfo(step, "corrupt", f"{COMMIT} is not a {FORMAT} record "
                                    f"for step {step}")
    return record, None


def check_files(record: dict, step: int, sizes: dict[str, int],
                hashes: dict[str, str] | None = None) -> CheckpointInfo:
    """Compare what is on storage (sizes, and checksums when read) with the commit record."""
    total = 0
    for rel, (size, digest) in sorted(record["files"].items()):
        total += size
        if rel not in sizes:
            return CheckpointInfo(step, "corrupt", f"{rel} is missing")
        if sizes[rel] != size:
            return CheckpointInfo(step, "corrupt", f"{rel} has {sizes[rel]} bytes, the commit "
                                  f"record says {size} (truncated or overwritten)")
        if hashes is not None and hashes.get(rel) != digest:
            return CheckpointInfo(step, "corrupt", f"{rel} does not match its checksum (the "
                                  "bytes changed after the save)")
    return CheckpointInfo(step, "valid", bytes=total)


def commit_record(step: int, files: dict[str, list], processes: int, extra: dict[str, Any]
                  ) -> bytes:
    return (json.dumps({"format": FORMAT, "step": step, "processes": processes,
                        **extra, "files": files}, indent=1, sort_keys=True) + "\n").encode()


def jsonable(value: Any) -> Any:
    """json.dumps's `default` for a step's records (meta, data-iterator state): numpy scalars
    and arrays as Python values, anything else as its text."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
