"""The persistent compilation cache of a run: XLA executables kept on disk, so that a restart
(after a failure, a preemption, a resume) loads its programs instead of compiling them again.

    compile_cache.enable("runs/gpt/compile_cache")   # before the first compile of the process
    ...                                              # fit() compiles, or loads
    compile_cache.counts()                           # {"hits": 3, "misses": 0}

JAX's cache keys an executable by the program (its HLO, shardings and donation included),
the compile options, the JAX/XLA version and the devices, so a changed program or another
platform never reads a stale executable: it misses and compiles. Every process of a job may
point at the same directory (JAX's writes are atomic renames). podkit caches every program
that takes 1 s or more to compile (JAX's `jax_persistent_cache_min_compile_time_secs`, left at
its default: a run's train and evaluation steps; the many tiny programs are not worth a file
each).
"""

from __future__ import annotations

import threading
from pathlib import Path

from podkit.errors import ConfigError

_EVENTS = {"/jax/compilation_cache/cache_hits": "hits",
           "/jax/compilation_cache/cache_misses": "misses"}
_counts = {"hits": 0, "misses": 0}
_lock = threading.Lock()
_state: dict[str, str | None] = {"dir": None}


def _listen(name: str, **_: object) -> None:
    kind = _EVENTS.get(name)
    if kind is not None:
        with _lock:
            _counts[kind] += 1


def enable(directory: str | Path) -> Path:
    """Cache this process's compiled programs in `directory` (created if missing). Call it
    before the process compiles anything: JAX fixes its cache at the first compile."""
    import jax
    from jax import monitoring

    text = str(directory)
    if "://" in text:
        raise ConfigError(f"run.compile_cache = {text!r}: the compilation cache is a local or "
                          "shared-filesystem directory (gs:// and s3:// are not read by JAX's "
                          "cache here); give a path every process of the job can reach, or "
                          "leave it unset for one under the run directory.")
    path = Path(text).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"run.compile_cache = {text!r}: cannot create it ({e}); give a "
                          "writable directory, or 'none' to compile every time.") from None
    if _state["dir"] is None:
        monitoring.register_event_listener(_listen)
    _state["dir"] = str(path)
    jax.config.update("jax_compilation_cache_dir", str(path))
    return path


def directory() -> str | None:
    """The directory `enable` set in this process, or None."""
    return _state["dir"]


def counts() -> dict[str, int]:
    """Executables this process loaded from the cache ("hits") and compiled and offered to
    it ("misses") since `enable`."""
    with _lock:
        return dict(_counts)
