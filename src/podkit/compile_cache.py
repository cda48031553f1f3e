"""The persistent compilation cache of a run: XLA executables kept on disk, so that a restart
(after a failure, a preemption, a resume) loads its programs instead of compiling them again.

    compile_cache.enable("runs/gpt/compile_cache")   # before the first compile of the process
    ...                                              # fit() compiles, or loads
    compile_cache.counts()                           # {"hits": 3, "misses": 0}

JAX's cache keys an executable by the program (its HLO, shardings and donation included),
the compile options, the JAX/XLA version and the devices, so a changed program or another
platform never reads a stale executable: it misses and compiles. Every process of a job may
point at the same directory (JAX writes an entry in one write, not atomically: an entry read
while another process writes it fails JAX's check, is reported as a warning and compiled
anew). podkit caches every program
that takes 1 s or more to compile (JAX's `jax_persistent_cache_min_compile_time_secs`, left at
its default: a run's train and evaluation steps; the many tiny programs are not worth a file
each).

A gs:// or s3:// cache (a directory under a run in a bucket, or a shared one) is kept in a
local copy JAX reads and writes (`$PODKIT_CACHE/compile_cache/<hash of the URL>`): `enable`
downloads the entries the copy lacks (entries are named by their key and never change, so a
name present is the entry), and a thread uploads each new entry once its size has held still
for a moment, and at the process's exit; an upload is one object PUT, so a reader sees an
entry whole or not at all.
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
        if kind == "misses" and _remotes:
            _remotes[-1].wake.set()  # JAX writes the entry right after this event


_SUFFIX = "-cache"  # JAX's entry files: KEY-cache
_STILL_S = 0.5  # an entry's size unchanged this long: JAX has finished writing it
_EXIT_WAIT_S = 60.0  # at exit, the longest wait for the last entries' uploads
_remotes: list[_Remote] = []


class _Remote:
    """A gs:// or s3:// cache's local copy, and the thread that uploads new entries."""

    def __init__(self, url: str) -> None:
        import hashlib

        from podkit import paths

        try:
            self.storage = paths.open_storage(url)
        except Exception as e:  # a malformed URL, an unknown scheme: named for the user
            raise ConfigError(f"run.compile_cache = {url!r}: {e}") from None
        self.url = url.rstrip("/")
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.local = paths.cache_root() / "compile_cache" / digest
        self.sent: set[str] = set()
        self.wake = threading.Event()

    def pull(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.local.mkdir(parents=True, exist_ok=True)
        names = [k for k in self.storage.list("") if k.endswith(_SUFFIX) and "/" not in k]
        self.sent.update(names)
        missing = [k for k in names if not (self.local / k).exists()]

        def one(key: str) -> None:
            import time

            part = self.local / f".{key}.part"
            self.storage.download_file(key, part)
            # With a size limit (jax_compilation_cache_max_size), JAX's cache keeps each
            # entry's last use beside it and fails to read an entry without one.
            atime = self.local / (key.removesuffix(_SUFFIX) + "-atime")
            atime.write_bytes(time.time_ns().to_bytes(8, "little"))
            part.rename(self.local / key)  # JAX never sees half an entry

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, missing))

    def start(self) -> None:
        import atexit

        _remotes.append(self)
        threading.Thread(target=self._run, name="podkit-compile-cache", daemon=True).start()
        atexit.register(self.push, _EXIT_WAIT_S)

    def _run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            try:
                self.push(_EXIT_WAIT_S)
            except Exception as e:  # the cache is an optimisation: say so, and go on
                import warnings

                warnings.warn(f"podkit: could not upload compiled programs to {self.url}: "
                              f"{e}", stacklevel=1)

    def push(self, wait_s: float) -> int:
        """Upload the entries not sent yet, each once its size has held still for _STILL_S
        (JAX may still be writing a new one); returns how many went up."""
        import time

        sent = 0
        deadline = time.monotonic() + wait_s
        while True:
            new = {p.name: p.stat().st_size for p in self.local.glob(f"*{_SUFFIX}")
                   if p.name not in self.sent}
            if not new:
                return sent
            time.sleep(_STILL_S)
            for name, size in new.items():
                path = self.local / name
                if path.stat().st_size == size:
                    self.storage.upload_file(path, name)
                    self.sent.add(name)
                    sent += 1
            if time.monotonic() > deadline:
                return sent


def enable(directory: str | Path) -> Path:
    """Cache this process's compiled programs in `directory` (created if missing). Call it
    before the process compiles anything: JAX fixes its cache at the first compile."""
    import jax
    from jax import monitoring

    text = str(directory)
    remote = None
    if "://" in text:
        remote = _Remote(text)
        path = remote.local
    else:
        path = Path(text).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"run.compile_cache = {text!r}: cannot create it ({e}); give a "
                          "writable directory, or 'none' to compile every time.") from None
    if remote is not None:
        remote.pull()
        remote.start()
    if _state["dir"] is None:
        monitoring.register_event_listener(_listen)
    _state["dir"] = text if remote is not None else str(path)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # JAX would also point XLA's GPU autotuning cache under this directory, and put that path
    # and the process's role (process 0 writes it, the others read) in every program's
    # compile options, which are part of the key: the same program would get another key on
    # another machine (another copy's path) and in every process but 0, and a job's
    # processes would never share an entry. Those caches are GPU autotuning results only.
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
    return path


def directory() -> str | None:
    """The directory `enable` set in this process, or None."""
    return _state["dir"]


def counts() -> dict[str, int]:
    """Executables this process loaded from the cache ("hits") and compiled and offered to
    it ("misses") since `enable`."""
    with _lock:
        return dict(_counts)
