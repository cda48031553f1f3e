"""Where a podkit checkpoint save spends its time: timers around each phase, against the raw disk.

    PYTHONPATH=src .venv/bin/python bench/checkpoint_phases.py --gb 1.2 --repeats 5

The same state as bench/checkpoint.py (Dense MLP + Adam after one step, one CPU device). Each
repeat writes the raw file (bench/checkpoint.py's `raw`: the arrays to one file, write +
fsync), then saves with a fresh CheckpointManager and times, by wrapping the manager's steps
(whichever of them the podkit on PYTHONPATH has, so an older commit can be measured too):

  snapshot          save(): keeping the arrays as they are now (a device copy, or pinning)
  save() blocked    everything save() did before returning
  orbax save call   Orbax's save(): its device-to-host transfer and the start of its writes
  orbax writes      wait_until_finished(): TensorStore writing the chunk files (each fsynced)
                    and Orbax's metadata and finalization (the rename of its temporary dir)
  checksums         format.files_of(): each file fsynced again and hashed (xxh3-128)
    its fsyncs      the os.fsync calls inside it (summed over the hashing threads)
  records           the manifest, meta.json and COMMIT.json (atomic writes, fsynced)
  retention         deleting what `keep` does not keep
  total             save() called -> step committed

Medians over the repeats; the first repeat also pays Orbax's one-time set-up in the process.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoint as bench  # bench/checkpoint.py: the model and the raw write

T: dict[str, float] = collections.defaultdict(float)
_LOCK = threading.Lock()


def _add(label: str, seconds: float) -> None:
    with _LOCK:
        T[label] += seconds


def _wrap(owner, name: str, label: str) -> None:
    fn = getattr(owner, name, None)
    if fn is None:
        return

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(label, time.perf_counter() - t0)

    setattr(owner, name, timed)


def instrument() -> None:
    from jax._src.array import ArrayImpl

    from podkit.checkpoint import arrays, manager
    from podkit.checkpoint import format as fmt
    from podkit.paths import local

    if hasattr(arrays, "snapshot"):
        _wrap(arrays, "snapshot", "snapshot")
    else:  # before: save() copied every array on its device (jax.Array.copy)
        _wrap(ArrayImpl, "copy", "snapshot")
    _wrap(manager.CheckpointManager, "_orbax_save", "orbax save call")
    _wrap(fmt, "files_of", "checksums")
    _wrap(local.LocalStorage, "write_bytes", "records")
    _wrap(manager.CheckpointManager, "_collect", "retention")
    real_fsync = os.fsync

    def fsync(fd):
        t0 = time.perf_counter()
        real_fsync(fd)
        if sys._getframe(1).f_code.co_name == "hash_file":
            _add("  its fsyncs", time.perf_counter() - t0)

    os.fsync = fsync
    make = manager.CheckpointManager._orbax

    def orbax(self):
        checkpointer = make(self)
        if not getattr(checkpointer, "_phases_timed", False):
            _wrap(checkpointer, "wait_until_finished", "orbax writes")
            checkpointer._phases_timed = True
        return checkpointer

    manager.CheckpointManager._orbax = orbax


ORDER = ["snapshot", "save() blocked", "orbax save call", "orbax writes", "checksums",
         "  its fsyncs", "records", "retention", "total", "raw write+fsync"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    import jax

    import podkit as pk

    pk.connect(cpu_devices=1)
    instrument()
    from podkit.checkpoint import CheckpointManager

    model, _ = bench.build_model(args.gb)
    state = model.state
    sums = jax.device_put({"loss": {"total": jax.numpy.zeros(()),
                                    "count": jax.numpy.zeros(())}})
    where = Path(tempfile.mkdtemp(prefix="podkit-bench-phases-", dir=args.dir))
    print(f"checkpoint phases: state {bench.nbytes(state) / 1e9:.2f} GB, disk {where}")
    runs = []
    for r in range(args.repeats):
        raw, _ = bench.bench_raw(state, where)
        T.clear()
        manager = CheckpointManager(where / "podkit", keep=1)
        t0 = time.perf_counter()
        manager.save(r + 1, {"state": state, "sums": sums}, meta={"position": {}})
        T["save() blocked"] = time.perf_counter() - t0
        manager.wait()
        T["total"] = time.perf_counter() - t0
        manager.close()
        T["raw write+fsync"] = raw
        runs.append(dict(T))
        shutil.rmtree(where / "podkit")
        print(f"  repeat {r}: " + ", ".join(f"{k.strip()} {T.get(k, 0):.3f}" for k in ORDER),
              flush=True)
    print(f"medians of {len(runs)} (s):")
    for k in ORDER:
        print(f"  {k:<20} {statistics.median(x.get(k, 0.0) for x in runs):7.3f}")
    shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
