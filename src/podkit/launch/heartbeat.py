"""Heartbeats: how a process under `podkit launch` says it is still making progress.

The launcher gives each process a file, named by PODKIT_HEARTBEAT_FILE, and reads its
modification time. A process beats by touching that file; the launcher declares a process hung
when the file is older than --heartbeat-timeout. A file is the whole protocol on purpose: no
socket, no thread the launcher depends on, nothing to reconnect after a restart, and a stat()
per process per poll on the launcher's side.

Two ways to beat:

- `beat()` after each unit of real progress (the training loop calls it after each execution).
  It is rate-limited to one syscall per 0.5 s, so calling it every step costs a clock read.
- `Beater`, a daemon thread that beats every second, for phases where the loop is not running
  but the process is known to be busy (start-up, compilation, restoring a checkpoint).
  `connect()` starts the process-wide one (`beater()`) when PODKIT_HEARTBEAT_FILE is set; the
  training loop pauses it while it runs, so that a hung loop stops the beats and is detected,
  and resumes it afterwards.

Outside `podkit launch` (PODKIT_HEARTBEAT_FILE unset) all of this is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

ENV_HEARTBEAT_FILE = "PODKIT_HEARTBEAT_FILE"

MIN_INTERVAL_S = 0.5
"""At most one beat syscall per this many seconds from `beat()`."""

_last_beat = float("-inf")
_beat_lock = threading.Lock()


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
            try:
                with open(path, "a"):
                    pass
            except OSError:
                pass
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

    One per process so that `connect()`, which starts it, and the training loop, which pauses
    and resumes it, act on the same thread.
    """
    global _BEATER
    with _BEATER_LOCK:
        if _BEATER is None:
            _BEATER = Beater()
        return _BEATER
