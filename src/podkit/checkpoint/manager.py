"""CheckpointManager: when and how a training state is saved and found again.

    manager = CheckpointManager("runs/exp/checkpoints", every_steps=500, keep=3)
    manager.save(step, {"state": state, "sums": sums}, meta={...}, data_state=...)
    restored = manager.restore({"state": layout.abstract, "sums": ...})   # newest valid

Saving is asynchronous and transactional. `save()` returns once Orbax has copied the arrays
off the devices (the loop goes on, and may donate those buffers); a background thread then
waits for the bytes to land, uploads them when the storage is remote, checksums what this
process wrote into its manifest, and — on process 0, once every process's manifest exists —
writes the commit record. Only then is the step visible (format.py). A failure in the
background (storage errors after retries) is raised by the next `save()` or `wait()`, and the
step it was writing never becomes valid: the previous checkpoints are untouched.

Restoring reads the newest valid step, verifies every file against its checksum before Orbax
reads it, and reads into the abstract state it is given — shapes, dtypes and the current
shardings — so a checkpoint written on 8 devices or 2 processes restores on 4, 1, or another
process count. A corrupt newest step is reported and the previous valid one is used.

(Over 500 lines: the save transaction and the restore that reads it back are one
protocol, best read together; the array I/O is in arrays.py, the bytes' places in podkit.paths.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
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

from podkit import agree
from podkit.checkpoint import arrays, local_tier
from podkit.checkpoint import format as fmt
from podkit.checkpoint.local_tier import LocalTier
from podkit.errors import ConfigError, InputError, StorageError
from podkit.paths import RetryPolicy, Storage, open_storage

_DOWNLOADS = 8  # files of a remote step downloaded at a time
_POLL_S = (0.01, 0.5)  # first and longest wait between looks for the other manifests


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `restore()` found: the arrays (in the requested abstract tree), process 0's
    meta record, and every saving process's data-iterator state (index = process)."""

    step: int
    tree: Any
    meta: dict
    data_states: list


def _positive(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"CheckpointManager({name}={value!r}): must be a positive number"
                          + (" or None" if allow_none else "") + ".")


class CheckpointManager:
    """Transactional, asynchronous checkpoints of a TrainState (see the module docstring).

    every_steps / every_seconds: when `due()` says yes (either; neither means only when the
    loop asks, at the end of training or on preemption). keep: the newest valid steps kept;
    keep_every: also keep every step that is a multiple of it. async_save=False makes `save()`
    return only once the step is committed. retry: the storage's retry policy.
    local_every_steps: also save a local tier every this many steps (`local_tier.py`: each
    process's shards on its own disk under `local_dir`, default a directory under the temp
    dir named after `directory`, copied to a peer process; the `local_keep` newest kept);
    `manager.local` is that tier, None without it.
    """

    def __init__(self, directory: Any, every_steps: int | None = None,
                 every_seconds: float | None = None, keep: int | None = 3,
                 keep_every: int | None = None, async_save: bool = True,
                 retry: RetryPolicy | None = None, commit_timeout_s: float = 600.0,
                 local_every_steps: int | None = None, local_dir: Any = None,
                 local_keep: int = 2) -> None:
        _positive("every_steps", every_steps)
        _positive("every_seconds", every_seconds)
        _positive("keep", keep)
        _positive("keep_every", keep_every)
        _positive("commit_timeout_s", commit_timeout_s, allow_none=False)
        for name, v in (("every_steps", every_steps), ("keep", keep),
                        ("keep_every", keep_every)):
            if v is not None and not isinstance(v, int):
                raise ConfigError(f"CheckpointManager({name}={v!r}): must be an int.")
        self.storage: Storage = open_storage(directory, retry)
        self.directory = self.storage.url
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.keep, self.keep_every, self.async_save = keep, keep_every, async_save
        self.commit_timeout_s = commit_timeout_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._checkpointer: Any = None
        self._last_time = time.monotonic()
        self.last_saved: int | None = None  # the newest step this manager committed
        self.last_requested: int | None = None  # the newest step save() was called for
        # Timings of the last save, for benchmarks and logs: seconds save() blocked the
        # caller, and seconds until the step was committed.
        self.last_blocking_s = 0.0
        self.last_commit_s = 0.0
        self.local: LocalTier | None = None
        if local_every_steps is not None:
            self.local = LocalTier(local_dir or local_tier.default_dir(self.directory),
                                   local_every_steps, keep=local_keep,
                                   timeout_s=commit_timeout_s)

    @classmethod
    def coerce(cls, value: Any, every_steps: int | None = None, keep: int | None = 3,
               said: str | None = None) -> CheckpointManager:
        """`value` as a manager: a CheckpointManager as it is (with its own schedule); a
        directory (a path, s3:// or gs:// URL) as a new manager saving `every_steps` and
        keeping `keep`. `said`: how the user wrote `value`, for the error (fit's
        `checkpoint=...` by default; a callback names itself).

            CheckpointManager.coerce("runs/exp/checkpoints")
        """
        if isinstance(value, CheckpointManager):
            return value
        if isinstance(value, str | os.PathLike):
            return cls(value, every_steps=every_steps, keep=keep)
        raise ConfigError(f"{said or f'checkpoint={value!r}'}: pass a directory (a path, s3:// "
                          "or gs:// URL) or a pk.checkpoint.CheckpointManager.")

    def __repr__(self) -> str:
        return (f"CheckpointManager({self.directory!r}, every_steps={self.every_steps}, "
                f"every_seconds={self.every_seconds}, keep={self.keep})")

    # -- when --------------------------------------------------------------------------------
    def due(self, step: int, previous_step: int) -> bool:
        """Whether a save is due after training from `previous_step` to `step`."""
        return self.due_by_steps(step, previous_step) or self.due_by_time()

    def due_by_steps(self, step: int, previous_step: int) -> bool:
        return self.every_steps is not None and \
            step // self.every_steps > previous_step // self.every_steps

    def due_by_time(self) -> bool:
        return (self.every_seconds is not None
                and time.monotonic() - self._last_time >= self.every_seconds)

    # -- what is there -----------------------------------------------------------------------
    def _step_names(self) -> dict[int, list[str]]:
        steps: dict[int, list[str]] = {}
        for key in self.storage.list(""):
            head, _, rest = key.partition("/")
            step = fmt.parse_step(head)
            if step is not None:
                steps.setdefault(step, []).append(rest)
        return steps

    def _read(self, key: str) -> bytes | None:
        return self.storage.read_bytes(key) if self.storage.exists(key) else None

    def _info(self, step: int, deep: bool) -> tuple[CheckpointInfo, dict | None]:
        d = fmt.step_dir(step)
        record, bad = fmt.read_commit(self._read(f"{d}/{fmt.COMMIT}"), step)
        if bad is not None:
            return bad, None
        local = self.storage.local_dir()
        sizes, hashes = {}, None
        if local is None:  # one listing of the step, not a HEAD per file
            listed = {e.key: e.size for e in self.storage.entries(f"{d}/")}
        for rel in record["files"]:
            key = f"{d}/{rel}"
            if local is not None:
                p = local / key
                if p.is_file():
                    sizes[rel] = p.stat().st_size
            elif key in listed:
                sizes[rel] = listed[key]
        if deep and local is not None:
            hashes = {rel: fmt.hash_file(local / d / rel) for rel in record["files"]
                      if rel in sizes and sizes[rel] == record["files"][rel][0]}
        return fmt.check_files(record, step, sizes, hashes), record

    def _require_step(self, step: int) -> None:
        """Raise InputError when there is no directory for `step`, naming the steps there are
        (valid ones, then incomplete and corrupt ones apart)."""
        names = sorted(self._step_names())
        if step in names:
            return
        by_status: dict[str, list[str]] = {}
        for s in names:
            by_status.setdefault(self._info(s, deep=False)[0].status, []).append(str(s))
        there = "; ".join(f"{', '.join(by_status[status])} ({status})"
                          for status in ("valid", "incomplete", "corrupt") if status in by_status)
        if not names:
            there = "it holds no checkpoints."
        elif "valid" not in by_status:
            there = f"its steps are {there}, and none is valid."
        else:
            which = "one of them" if len(by_status) == 1 else "a valid one"
            there = (f"its steps are {there}. Pass {which}, or leave --step out for the newest "
                     "valid one.")
        raise InputError(f"{self.directory} has no checkpoint step {step}; {there}")

    def steps(self, deep: bool = True) -> list[fmt.CheckpointInfo]:
        """Every step directory with its status, oldest first. `deep` reads and checksums
        every file of a local checkpoint (remote ones: sizes; restore checks their bytes)."""
        return [self._info(step, deep)[0] for step in sorted(self._step_names())]

    def latest(self) -> int | None:
        """The newest step with a commit record whose files are all there (sizes checked;
        `restore` checks their bytes)."""
        for step in sorted(self._step_names(), reverse=True):
            if self._info(step, deep=False)[0].valid:
                return step
        return None

    # -- save --------------------------------------------------------------------------------
    def _orbax(self) -> Any:
        if self._checkpointer is None:
            self._checkpointer = arrays.async_checkpointer()
        return self._checkpointer

    def _staging(self, step: int) -> Path:
        """Where Orbax writes this step: the step directory itself on a local path; for an
        object store, a directory on this machine (the same one for every process here)."""
        local = self.storage.local_dir()
        if local is not None:
            return local / fmt.step_dir(step)
        tag = hashlib.sha256(self.directory.encode()).hexdigest()[:16]
        return _staging_root() / tag / fmt.step_dir(step)

    def save(self, step: int, tree: Any, meta: dict | None = None,
             data_state: Any = None) -> None:
        """Save `tree` (a pytree of jax.Arrays) as `step`; returns once the arrays are off the
        devices (async_save) or once the step is committed. Every process calls it."""

        # One save in flight; its error surfaces here — on every process together, so none
        # is left waiting in a barrier the failing one never reaches.
        try:
            self.wait()
            failed = None
        except Exception as e:  # re-raised below, after agreeing
            failed = e
        if not agree.all_true(failed is None):
            raise failed if failed is not None else StorageError(
                f"another process failed to save a checkpoint to {self.directory}; its "
                "error is in its log. Earlier checkpoints are intact.")
        t0 = time.perf_counter()
        self.last_requested = step
        target = self._staging(step)
        if self.storage.local_dir() is None and jax.process_count() > 1:
            self._check_shared_staging(target)
        if jax.process_index() == 0:  # a step left half-written by an earlier run
            self._discard(step, target)
        agree.barrier(f"podkit-ckpt-{step}")  # nobody writes into the step before it is cleared
        try:
            # Fail here, with a named cause, on a directory that cannot be written (Orbax
            # would otherwise time out in its threads waiting for the directory).
            target.mkdir(parents=True, exist_ok=True)
        except Exception as e:  # named and classified for the user
            raise _storage_error(e, step, self.directory) from e
        flat = arrays.flatten(tree)
        # One process: Orbax runs on the save thread, and the loop waits for no copy. (With
        # several, Orbax's save synchronizes the processes by collectives on the devices,
        # which a thread must not issue while the loop issues its own: it runs here.)
        offload = self.async_save and jax.process_count() == 1
        if offload and arrays.on_host(flat):
            # Device memory is host memory here: the arrays are kept as they are now (pinned
            # in place when computed, else a device copy dispatched like a step: the loop never
            # waits), and Orbax's "device to host" transfer of them is free.
            flat = arrays.snapshot(flat)
        elif offload and arrays.host_copy_possible(flat):
            # An accelerator: the copy into host memory is started now and awaited on the save
            # thread (it used to be awaited here: ~15% of a save on a TPU v5e).
            flat = arrays.copy_to_host(flat)
        else:
            offload = False
            self._orbax_save(target, flat, step)  # copies the arrays off the devices now
        self.last_blocking_s = time.perf_counter() - t0
        self._last_time = time.monotonic()
        # The record is fixed now: the loop goes on changing what it was made from (History).
        meta_bytes = json.dumps(dict(meta or {}, step=step), indent=1, sort_keys=True,
                                default=fmt.jsonable).encode()
        data_bytes = json.dumps(data_state, default=fmt.jsonable)
        self._thread = threading.Thread(target=self._finish, name=f"podkit-ckpt-{step}",
                                        args=(step, target, meta_bytes, data_bytes, t0,
                                              flat if offload else None),
                                        daemon=True)
        self._thread.start()
        if not self.async_save:
            self.wait()
            if jax.process_index() != 0:  # process 0 writes the commit record
                self._await(f"{fmt.step_dir(step)}/{fmt.COMMIT}", 0, step)

    def _check_shared_staging(self, target: Path) -> None:
        """Orbax finalizes a step from process 0, which must see every process's files: with
        an object store the staging directory must be one file system for all processes."""
        token = agree.process0_decides(os.getpid())
        probe = target.parent / f".shared-{token}"
        if jax.process_index() == 0:
            probe.parent.mkdir(parents=True, exist_ok=True)
            probe.touch()
        agree.barrier("podkit-ckpt-staging")
        seen = probe.exists()
        agree.barrier("podkit-ckpt-staging-seen")
        if jax.process_index() == 0:
            probe.unlink(missing_ok=True)
        if not agree.all_true(seen):
            raise ConfigError(
                f"checkpoints to {self.directory} from {jax.process_count()} processes stage "
                f"their files in {target.parent}, which the processes do not share (they run "
                "on different machines). Set PODKIT_CHECKPOINT_STAGING to a directory on a "
                "shared file system, or write the checkpoints to a shared path instead.")

    def _discard(self, step: int, target: Path) -> None:
        self.storage.delete_prefix(fmt.step_dir(step) + "/")
        if self.storage.local_dir() is None:
            shutil.rmtree(target, ignore_errors=True)

    def _orbax_save(self, target: Path, flat: dict, step: int) -> None:
        import orbax.checkpoint as ocp

        try:
            self._orbax().save((target / fmt.STATE).absolute(), args=ocp.args.PyTreeSave(flat),
                               force=True)
        except Exception as e:  # named and classified for the user
            raise _storage_error(e, step, self.directory) from e

    def _finish(self, step: int, target: Path, meta: bytes, data_state: str,
                t0: float, flat: dict | None = None) -> None:
        try:
            if flat is not None:
                self._orbax_save(target, flat, step)
                del flat
            self._orbax().wait_until_finished()
            self._commit(step, target, meta, data_state)
            self.last_saved = step
            self.last_commit_s = time.perf_counter() - t0
        except BaseException as e:  # handed to the caller by wait()
            self._error = _storage_error(e, step, self.directory) \
                if isinstance(e, Exception) else e

    def _commit(self, step: int, target: Path, meta_bytes: bytes, data_state: str) -> None:
        p, n = jax.process_index(), jax.process_count()
        d = fmt.step_dir(step)
        remote = self.storage.local_dir() is None
        files = fmt.files_of(target / fmt.STATE, p, prefix=f"{fmt.STATE}/")
        if remote:
            for rel in files:
                self.storage.upload_file(target / rel, f"{d}/{rel}")
        manifest = json.dumps({"process": p, "files": files,
                               "data_state": json.loads(data_state)}, sort_keys=True).encode()
        self.storage.write_bytes(f"{d}/{fmt.manifest_name(p)}", manifest)
        if p != 0:
            return
        self.storage.write_bytes(f"{d}/{fmt.META}", meta_bytes)
        everything = {fmt.META: [len(meta_bytes), fmt.hash_bytes(meta_bytes)]}
        for q in range(n):
            data = manifest if q == p else self._await(f"{d}/{fmt.manifest_name(q)}", q, step)
            everything[fmt.manifest_name(q)] = [len(data), fmt.hash_bytes(data)]
            everything.update(json.loads(data)["files"])
        self.storage.write_bytes(f"{d}/{fmt.COMMIT}", fmt.commit_record(
            step, everything, n, {"created": time.time()}))
        if remote:
            shutil.rmtree(target, ignore_errors=True)
        self._collect(step)

    def _await(self, key: str, process: int, step: int) -> bytes:
        deadline = time.monotonic() + self.commit_timeout_s
        pause = _POLL_S[0]
        while not self.storage.exists(key):
            if time.monotonic() > deadline:
                raise StorageError(
                    f"process {process} did not finish writing step {step} within "
                    f"{self.commit_timeout_s:.0f} s ({key} never appeared in {self.directory}); "
                    "the step stays uncommitted and the previous checkpoint is still valid.")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
        return self.storage.read_bytes(key)

    def _collect(self, newest: int) -> None:
        """Delete what `keep` and `keep_every` do not keep; broken steps older than the newest
        committed one go too (a newer broken one may be a save in progress elsewhere)."""
        infos = [self._info(s, deep=False)[0] for s in sorted(self._step_names())]
        valid = [i.step for i in infos if i.valid]
        kept = set(valid if self.keep is None else valid[-self.keep:])
        if self.keep_every:
            kept |= {s for s in valid if s % self.keep_every == 0}
        for info in infos:
            if info.step < newest and info.step not in kept:
                self.storage.delete_prefix(fmt.step_dir(info.step) + "/")

    def wait(self) -> None:
        """Block until the save in flight is committed; raise what made it fail."""
        if self.local is not None:
            self.local.wait()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        self.wait()
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None

    # -- restore -----------------------------------------------------------------------------
    def meta(self, step: int | None = None) -> tuple[int, dict] | None:
        """(step, meta record) of the newest valid step (or `step`), without reading its
        arrays; None when there is none."""
        self.wait()
        names = sorted(self._step_names(), reverse=True)
        if step is not None and step not in names:
            valid = sorted(s for s in names if self._info(s, deep=False)[0].valid)
            raise InputError(f"{self.directory} has no checkpoint step {step}; its valid "
                             f"steps are {valid or 'none'}.")
        candidates = [step] if step is not None else names
        for s in candidates:
            info, _ = self._info(s, deep=False)
            if info.valid:
                return s, json.loads(self.storage.read_bytes(f"{fmt.step_dir(s)}/{fmt.META}"))
            if step is not None:
                raise InputError(f"checkpoint step {step} in {self.directory} is "
                                 f"{info.status}: {info.reason}; `podkit checkpoint ls "
                                 f"{self.directory}` lists the valid ones.")
        return None

    def restore(self, abstract: Any, step: int | None = None,
                optional: tuple[str, ...] = (), partial: bool = False) -> Restored | None:
        """Read the newest valid step (or `step`) into `abstract`; None when there is none.
        `optional`: name prefixes of arrays a checkpoint of an older podkit may lack (read
        as zeros). `partial`: `abstract` names part of what was saved (a model's variables
        without its optimizer state, say); the rest is left unread.

        Every file is checked against the commit record first. A damaged step is reported
        (a warning naming what is wrong) and the next older valid one is tried; an explicit
        `step` that is damaged is an error. With several processes they agree on the step.
        """
        self.wait()
        candidates = [step] if step is not None else sorted(self._step_names(), reverse=True)
        for s in candidates:
            if not agree.all_true(agree.process0_decides(s) == s):
                raise InputError("the processes see different checkpoints in "
                                 f"{self.directory}; every process must read the same storage.")
            try:
                restored = self._restore_step(s, abstract, optional, partial)
                failure = None
            except _Damaged as e:
                restored, failure = None, e
            if not agree.all_true(failure is None):  # every process takes the same step, or none
                e = failure if failure is not None else _Damaged(fmt.CheckpointInfo(
                    s, "corrupt", "another process could not read it"))
                if step is not None:
                    raise InputError(f"checkpoint step {step} in {self.directory} is "
                                     f"{e.info.status}: {e.info.reason}.") from None
                if e.info.status == "corrupt":
                    warnings.warn(f"podkit: skipping checkpoint step {s} in {self.directory}: "
                                  f"{e.info.reason}; trying the previous one.", stacklevel=2)
                continue
            return restored
        return None

    def _restore_step(self, step: int, abstract: Any, optional: tuple[str, ...] = (),
                      partial: bool = False) -> Restored:
        d = fmt.step_dir(step)
        info, record = self._info(step, deep=False)
        if not info.valid:
            raise _Damaged(info)
        local = self.storage.local_dir()
        root = local / d if local is not None else self._download(step, record)
        # A local step is read and checked at once: the checksums are computed on threads
        # while Orbax reads the same files (one pass over the disk, shared page cache), and the
        # arrays are handed out only when every file matched. Downloads were checked already.
        checking = None
        if local is not None:
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
            checking = {rel: pool.submit(_hash_if_there, root / rel) for rel in record["files"]}
            pool.shutdown(wait=False)
        try:
            meta = json.loads((root / fmt.META).read_bytes())
            states = [json.loads((root / fmt.manifest_name(q)).read_bytes())["data_state"]
                      for q in range(record["processes"])]
            flat = arrays.read_flat(root / fmt.STATE, arrays.abstract_targets(abstract)[0],
                                    partial=partial, optional=optional)
        except (OSError, ValueError, KeyError) as e:
            if checking is None:
                raise
            failed = e  # a damaged file may break the read itself: the checksums say which
        else:
            failed = None
        if checking is not None:
            hashes = {rel: f.result() for rel, f in checking.items()}
            checked = fmt.check_files(record, step, {r: v[0] for r, v in record["files"].items()},
                                      hashes)
            if not checked.valid:
                raise _Damaged(checked)
            if failed is not None:
                raise failed
        else:
            shutil.rmtree(root, ignore_errors=True)
        return Restored(step, arrays.unflatten(abstract, flat), meta, states)

    def _download(self, step: int, record: dict) -> Path:
        """The step's files on this machine, each checked against the commit record."""
        d = fmt.step_dir(step)
        tag = hashlib.sha256(self.directory.encode()).hexdigest()[:16]
        root = (Path(tempfile.gettempdir()) / "podkit-checkpoints" / tag
                / f"restore-{jax.process_index()}" / d)
        shutil.rmtree(root, ignore_errors=True)

        def fetch(rel: str) -> str | None:
            """Download one file; its name when it does not match the record."""
            size, digest = record["files"][rel]
            path = root / rel
            self.storage.download_file(f"{d}/{rel}", path)
            return rel if path.stat().st_size != size or fmt.hash_file(path) != digest else None

        # On threads: a step is tens of files (Orbax's chunks), each a request-bound transfer.
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=_DOWNLOADS) as pool:
                bad = [rel for rel in pool.map(fetch, sorted(record["files"])) if rel]
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        if bad:
            shutil.rmtree(root, ignore_errors=True)
            raise _Damaged(fmt.CheckpointInfo(step, "corrupt", f"{bad[0]} does not match its "
                                              "size or checksum"))
        return root

    def digest(self, step: int | None = None) -> tuple[int, str]:
        """(step, one xxh3-128 over the parameters and optimizer state of a valid step),
        independent of the mesh it was saved on."""
        if step is None:
            step = self.latest()
            if step is None:
                raise InputError(f"{self.directory} holds no valid checkpoint.")
        else:
            self._require_step(step)
        info, record = self._info(step, deep=True)
        if not info.valid:
            raise InputError(f"checkpoint step {step} in {self.directory} is {info.status}: "
                             f"{info.reason}.")
        local = self.storage.local_dir()
        root = local / fmt.step_dir(step) if local is not None else self._download(step, record)
        return step, arrays.digest_arrays(root / fmt.STATE)


_CAUSES = (("No space left", "the disk is full: free space, or point the checkpoints elsewhere"),
           ("Read-only file system", "the file system is read-only: point the checkpoints at a "
            "writable directory"),
           ("Permission denied", "this process may not write there: fix the directory's "
            "permissions or point the checkpoints elsewhere"),
           ("Disk quota", "the disk quota is used up: free space or raise the quota"))


def _storage_error(e: Exception, step: int, directory: str) -> Exception:
    """Orbax and TensorStore report a failed write as a bare ValueError or OSError; podkit
    names the step, the cause and the fix (and that older checkpoints are untouched)."""
    if isinstance(e, StorageError):
        return e
    text = f"{type(e).__name__}: {e}"
    for needle, fix in _CAUSES:
        if needle.lower() in text.lower():
            err = StorageError(f"saving checkpoint step {step} to {directory} failed: {fix} "
                               f"({needle}). The step stays uncommitted; earlier checkpoints "
                               "are intact.")
            err.transient = False
            return err
    return e


def _hash_if_there(path: Path) -> str | None:
    try:
        return fmt.hash_file(path)
    except OSError:
        return None


class _Damaged(Exception):
    def __init__(self, info: fmt.CheckpointInfo) -> None:
        super().__init__(info.reason)
        self.info = info


CheckpointInfo = fmt.CheckpointInfo


def _staging_root() -> Path:
    """Where remote checkpoints are staged: PODKIT_CHECKPOINT_STAGING, else the temp dir."""
    return Path(os.environ.get("PODKIT_CHECKPOINT_STAGING")
                or Path(tempfile.gettempdir()) / "podkit-checkpoints")
