"""Heartbeats: how a process under `podkit launch` says it is alive, and what it is doing.

The process's side (layer 2, beside cluster.py and termination.py, which use it; standard
library only): `beat`, `Beater`, `arm`, `loop(name)`, `phase(label)` and the status it
writes. The launcher reads the same file with `read_status` (podkit.launch.heartbeat
re-exports all of it under its old name).

The launcher gives each process a file, named by PODKIT_HEARTBEAT_FILE. Its modification time
is the last beat; its content, rewritten whenever the process changes phase, is one JSON object:

    {"pid": 4242, "phase": "after training: text sample", "watch": "exit",
     "since": 1764841000.5, "run_dir": "/abs/runs/gpt_small", "stacks": "<file>.stacks"}

How the launcher judges a process by it (see supervisor.py), from start to exit:

- `watch = "beats"`: hung when the file is older than --heartbeat-timeout. From `connect()`
  until a loop runs, and while a loop compiles its first execution, a thread (`Beater`) beats
  every second; once the loop's first execution ran, only the loop beats (after every
  execution), so a step that hangs stops the beats. Loops are fit(), evaluate() and predict()
  (`loop(name)`), nested loops (validation inside fit) included.
- `watch = "exit"`: the process left its last loop at `since` and is doing what comes after
  (a text sample, a final save, the program's own code). Nothing beats then: the launcher
  allows --exit-timeout seconds from `since` until the process exits or starts another loop.
  `phase(label)` names such work ("after training: text sample") for the report.
- `stacks`: `connect()` registers Python's faulthandler for SIGUSR1 on this file, so the
  launcher can have every thread's stack written before it stops a hung process; it copies
  them into `run_dir` (set by fit(run_dir=...)).

A file is the whole protocol on purpose: no socket, nothing to reconnect after a restart, and
a stat() per process per poll on the launcher's side (the content is read when it changed).
Outside `podkit launch` (PODKIT_HEARTBEAT_FILE unset) all of this is a no-op.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

ENV_HEARTBEAT_FILE = "PODKIT_HEARTBEAT_FILE"

MIN_INTERVAL_S = 0.5
"""At most one beat syscall per this many seconds from `beat()`."""

STACKS_SIGNAL = signal.SIGUSR1
"""The signal on which a process under the launcher writes every thread's stack."""

_last_beat = float("-inf")
_beat_lock = threading.Lock()


def enabled() -> bool:
    """Whether this process beats (PODKIT_HEARTBEAT_FILE is set: under `podkit launch`)."""
    return bool(os.environ.get(ENV_HEARTBEAT_FILE))


def beat(force: bool = False) -> None:
    """Tell the launcher this process is alive: touch the heartbeat file.

    Cheap enough to call after every step: unless `force`, a call within MIN_INTERVAL_S of the
    previous beat returns after one clock read. A no-op when PODKIT_HEARTBEAT_FILE is unset
    (not under `podkit launch`). Never raises: a failed beat must not fail training; at worst
    the launcher sees a stale file and restarts the job.
    """
    global _last_beat
    path = os.environ.get(ENV_HEARTBEAT_FILE)
    if not path:
        return
    now = time.monotonic()
    if not force and now - _last_beat < MIN_INTERVAL_S:
        return
    with _beat_lock:  # the Beater thread and the loop may beat at once
        _last_beat = now
        try:
            os.utime(path)
        except FileNotFoundError:
            # The first beat creates the file: its existence is what arms the launcher's
            # heartbeat check for this process.
            _write_status()
        except OSError:
            pass


class Beater:
    """A daemon thread that calls `beat()` every `interval_s` seconds until stopped.

    For phases where nothing else beats but the process is busy on purpose (start-up,
    compilation, checkpoint restore). Pause it while a loop that beats by itself runs: a
    thread that keeps beating would hide a hung loop from the launcher.

        beater = Beater().start()
        ...                        # long compilation: beats continue
        with beater.paused():
            run_training_loop()    # calls beat() itself; a hang here is detected
        beater.stop()

    When PODKIT_HEARTBEAT_FILE is unset `start()` starts no thread and every method is a no-op.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s} must be > 0.")
        self.interval_s = interval_s
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._running = threading.Event()  # set: beating; clear: paused
        self._running.set()

    @property
    def active(self) -> bool:
        """True while the thread runs and is not paused."""
        return self._thread is not None and self._thread.is_alive() and self._running.is_set()

    def start(self) -> Beater:
        """Start beating (at once, then every interval). Idempotent; returns self."""
        if self._thread is not None or not os.environ.get(ENV_HEARTBEAT_FILE):
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="podkit-heartbeat", daemon=True)
        self._thread.start()
        return self

    def pause(self) -> None:
        """Stop beating until `resume()`; the thread stays."""
        self._running.clear()

    def resume(self) -> None:
        """Beat again (at once, then every interval)."""
        if not self._running.is_set():
            self._running.set()
            if self._thread is not None:
                beat(force=True)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Pause for the block, then resume: `with beater.paused(): loop()`."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def stop(self) -> None:
        """End the thread (waits for it at most one interval)."""
        self._stop.set()
        self._running.set()  # wake a paused thread so it can see the stop
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval_s + 1.0)

    def __enter__(self) -> Beater:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.is_set():
                return
            beat(force=True)
            self._stop.wait(self.interval_s)


_BEATER: Beater | None = None
_BEATER_LOCK = threading.Lock()


def beater() -> Beater:
    """The process-wide Beater (created on first call, not started).

    One per process so that `connect()`, which starts it, and the loops, which pause and
    resume it, act on the same thread.
    """
    global _BEATER
    with _BEATER_LOCK:
        if _BEATER is None:
            _BEATER = Beater()
        return _BEATER


def read_status(path: str | os.PathLike) -> dict[str, Any] | None:
    """The status a process last wrote to its heartbeat file (the launcher's side), or None
    when there is none yet or it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.loads(f.read() or "null")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


# -- phases ---------------------------------------------------------------------------------

_status: dict[str, Any] = {"phase": "starting", "watch": "beats", "since": None,
                           "run_dir": None, "stacks": None}
_loops: list[tuple[str, bool]] = []  # open loops: (name, whether the Beater was active)
_status_lock = threading.RLock()
_stacks_file: IO[str] | None = None


def _write_status() -> None:
    """Rewrite the file's content (atomically: the launcher never reads half of it)."""
    path = os.environ.get(ENV_HEARTBEAT_FILE)
    if not path:
        return
    with _status_lock:
        record = {"pid": os.getpid(), **_status}
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            os.replace(tmp, path)
        except OSError:
            pass


def _set(**fields: Any) -> None:
    with _status_lock:
        _status.update(fields)
        _write_status()


def arm() -> None:
    """Under `podkit launch`: beat from a thread until a loop takes over, and write every
    thread's stack to the launcher's file on STACKS_SIGNAL. `connect()` calls it; idempotent."""
    global _stacks_file
    path = os.environ.get(ENV_HEARTBEAT_FILE)
    if not path:
        return
    with _status_lock:
        if _stacks_file is None:
            try:
                _stacks_file = open(f"{path}.stacks", "w", encoding="utf-8")
                faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True,
                                      chain=False)
                _status["stacks"] = _stacks_file.name
            except (OSError, RuntimeError, ValueError):
                _stacks_file = None
        _write_status()
    beater().start()


def report_stall(stall: dict[str, Any] | None) -> None:
    """The watchdog (podkit.monitor.watchdog) saw no step complete for its limit: `stall`
    ({"step", "silent_s", "file"}) goes into the status for the launcher to name; None when
    steps complete again. A no-op outside `podkit launch`."""
    if os.environ.get(ENV_HEARTBEAT_FILE):
        _set(stalled=stall)


def set_run_dir(path: str | os.PathLike) -> None:
    """Where the launcher puts this process's stacks when it reports it hung."""
    if os.environ.get(ENV_HEARTBEAT_FILE):
        _set(run_dir=os.path.abspath(os.fspath(path)))


class Loop:
    """One open loop (see `loop`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._running = False

    def running(self) -> None:
        """The loop's first execution has run (it compiled): from now on only the loop's own
        beats count, so a hang in it is seen."""
        if not self._running:
            self._running = True
            beater().pause()


@contextlib.contextmanager
def loop(name: str) -> Iterator[Loop]:
    """A loop that beats after every execution: `with heartbeat.loop("training") as hb: ...
    hb.running()` once its first execution ran. On leaving the outermost loop the process is
    "after {name}" and the launcher's --exit-timeout applies."""
    b = beater()
    with _status_lock:
        _loops.append((name, b.active))
        _set(phase=name, watch="beats", since=None)
    b.resume()  # compiling the first execution: beats from the thread meanwhile
    try:
        yield Loop(name)
    finally:
        with _status_lock:
            _, was_active = _loops.pop()
            if _loops:  # back in the outer loop, as it was
                _set(phase=_loops[-1][0], watch="beats", since=None)
                if was_active:
                    b.resume()
                else:
                    b.pause()
            else:
                b.pause()
                _set(phase=f"after {name}", watch="exit", since=time.time())


@contextlib.contextmanager
def phase(label: str) -> Iterator[None]:
    """Name the work of a block for the launcher's hang report: after training,
    `with heartbeat.phase("text sample"):` reads "after training: text sample". Changes
    nothing else (the time allowed is still counted from the end of the last loop)."""
    with _status_lock:
        before = _status["phase"]
        base = before.split(": ", 1)[0]
        _set(phase=f"{base}: {label}")
    try:
        yield
    finally:
        _set(phase=before)
