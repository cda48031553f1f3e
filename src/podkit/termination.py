"""What SIGTERM does in a podkit process: it ends the process, or it preempts a training loop.

A scheduler stops a job with SIGTERM, a grace period, then SIGKILL (SLURM, Kubernetes, Borg,
`podkit launch`). podkit answers SIGTERM in one of two ways, whatever the process count:

- **Outside a preemptible scope** (no fit() with checkpoints running) SIGTERM ends the process
  with exit status 143 (128 + 15, what a shell reports for a process SIGTERM killed):
  `SystemExit(143)` is raised in the main thread, so `finally` blocks and exit hooks run. When
  the process is still there EXIT_GRACE_S later — its main thread is blocked in native code, in
  a collective a peer never joins, or an exit hook waits for a peer — a watcher thread prints
  every thread's stack to stderr and ends it with `os._exit(143)`.
- **Inside a `Preemptible` scope** (a fit() that saves checkpoints) SIGTERM is a notice. The
  loop asks `reached(execution)` after each execution; every process of the job answers True
  at the same execution, saves there and leaves with status 0 (`train/checkpointing.py`).

Why podkit handles SIGTERM itself: JAX's preemption service (on by default with
`jax.distributed`) installs a C++ handler that records SIGTERM for
`multihost_utils.reached_preemption_sync_point` and nothing else, so a multi-process job that
is not inside a training loop never ends on SIGTERM and waits for SIGKILL. `connect()` turns that
service off (`jax_enable_preemption_service`) and calls `install()`; the agreement below is the
same protocol over the same coordination service:

1. the process that got SIGTERM writes a notice into every process's wake key; each process
   waits on its own key from a thread (`blocking_key_value_get`), which its scope's close
   also wakes (so no thread is left inside a call to the service when the process exits);
2. on the notice, each process's thread takes the scope's lock — so its training loop cannot
   pass the execution it is at — publishes that execution, and waits at a barrier for the others;
3. the agreed execution is the largest published one plus one: no process has passed it, and
   every process reaches it.

The watcher thread reads the signal from `signal.set_wakeup_fd`, which Python's C-level handler
writes in whatever thread the kernel delivered the signal to, so it sees SIGTERM even while the
main thread cannot run Python code.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Any

EXIT_CODE = 143
"""The exit status of a process SIGTERM ended outside a preemptible scope."""

EXIT_GRACE_S = 10.0
"""Seconds between SIGTERM and `os._exit(143)` when the process does not exit by itself;
PODKIT_EXIT_GRACE_S overrides it (a scheduler whose own grace is shorter)."""
ENV_EXIT_GRACE = "PODKIT_EXIT_GRACE_S"

AGREE_TIMEOUT_S = 60.0
"""How long a process waits for the others to publish their execution after a notice."""

_WAKE_DIR = "podkit/preemption/wake/"  # + process index: "notice" or "closed"
_COUNT_DIR = "podkit/preemption/execution/"
_BARRIER = "podkit_preemption"
_WAIT_MS = 60_000  # one wait on the wake key; it is woken by value, this is only a bound

_lock = threading.Lock()  # guards installation (never taken by a handler)
_installed = False
_scope: Preemptible | None = None
# Taken once, never released, without blocking: a handler that interrupts the main thread
# while it holds a lock must not wait for it.
_exit_once = threading.Lock()
_wakeup_read: int | None = None
# The handler has run in the main thread (and raised SystemExit): a later SIGTERM is ignored
# there, so that clean-up is not interrupted. Separate from _exit_once, which the watcher
# thread may take first: the handler must still raise then.
_handled = threading.Event()
_woke_main = False  # the watcher sent SIGTERM on to the main thread (done once)


def install() -> None:
    """Make SIGTERM end this process (see the module docstring). Idempotent; `connect()` calls
    it. Only the main thread may install a signal handler: from another thread this does
    nothing. A handler the program installed itself, or SIGTERM ignored (nohup), is kept: the
    program owns SIGTERM then (a preemptible scope still takes it while a fit() runs)."""
    global _installed
    _exit_grace()  # a bad PODKIT_EXIT_GRACE_S is an error now, not when SIGTERM comes
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if _installed:
            return
        current = signal.getsignal(signal.SIGTERM)
        # None: a handler installed from C (JAX's preemption notifier, when a program started
        # jax.distributed itself); SIG_DFL: nobody's. Both are replaced.
        if current in (None, signal.SIG_DFL):
            signal.signal(signal.SIGTERM, _on_sigterm)
        _start_wakeup_watch()
        _installed = True


def _start_wakeup_watch() -> None:
    """A thread that sees every signal Python catches, even while the main thread is stuck."""
    global _wakeup_read
    if _wakeup_read is not None:
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread after all
        os.close(read)
        os.close(write)
        return
    if previous != -1:  # someone else's (an asyncio loop): theirs stays, the handler suffices
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return
    _wakeup_read = read
    threading.Thread(target=_watch_wakeups, args=(read,), name="podkit-sigterm",
                     daemon=True).start()


def _watch_wakeups(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            scope = _scope
            if scope is not None:
                scope.notice_sigterm()
            else:
                _start_exit_deadline()
                _wake_main_thread()


def _wake_main_thread() -> None:
    """Send SIGTERM on to the main thread, once, if its handler has not run yet.

    The kernel delivers a process's signal to any thread that does not block it, and Python
    runs the handler only in the main thread, only when that thread next runs bytecode: a main
    thread asleep in a system call (time.sleep, a lock, a socket read) that was not the one
    interrupted sleeps on (seen: 10 s to exit instead of 1.5 s). A signal sent to the main
    thread itself interrupts its call (EINTR) and the handler runs now. In native code that
    never returns it changes nothing; the deadline covers that."""
    global _woke_main
    if _woke_main or _handled.is_set():
        return
    _woke_main = True
    try:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
    except (OSError, ValueError):  # the main thread is gone: the process is ending anyway
        pass


def _on_sigterm(signum: int, frame: Any) -> None:
    scope = _scope
    if scope is not None:
        scope.notice_sigterm()
        return
    if _handled.is_set():  # a second SIGTERM while exiting: let the clean-up finish
        return
    _handled.set()
    _start_exit_deadline()
    raise SystemExit(EXIT_CODE)


_OUTSIDE = f"SIGTERM received outside training: exiting with status {EXIT_CODE}"


def _start_exit_deadline(message: str = _OUTSIDE) -> None:
    """Say once that the process is ending, and end it for sure EXIT_GRACE_S from now."""
    if not _exit_once.acquire(blocking=False):
        return
    _say(message)
    try:
        grace = _exit_grace()
    except ValueError:  # changed since install(): ending matters more than the message
        grace = EXIT_GRACE_S
    threading.Thread(target=_exit_after, args=(grace,), name="podkit-exit-deadline",
                     daemon=True).start()


def _exit_grace() -> float:
    raw = os.environ.get(ENV_EXIT_GRACE, "")
    if not raw:
        return EXIT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        from podkit.errors import ConfigError

        raise ConfigError(f"{ENV_EXIT_GRACE}={raw!r} is not a number of seconds >= 0; set it "
                          f"to how long a SIGTERMed process may take to exit (default "
                          f"{EXIT_GRACE_S:g}) or unset it.")
    return value


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)
    _say(f"the process did not exit within {seconds:g} s of SIGTERM (its main thread is "
         f"blocked; every thread's stack follows); ending it with status {EXIT_CODE}")
    try:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except (ValueError, OSError):  # stderr closed
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (ValueError, OSError):
            pass
    os._exit(EXIT_CODE)


def _say(message: str) -> None:
    try:
        print(f"podkit: {message}", file=sys.stderr, flush=True)
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a handler interrupted a write
        pass


def terminate(message: str) -> SystemExit:
    """The exception that ends the process with status 143, after saying why; the deadline
    makes sure it does end. Called from the main thread: a later SIGTERM is ignored there."""
    _handled.set()
    _start_exit_deadline(message)
    return SystemExit(EXIT_CODE)


class Preemptible:
    """A stretch of training in which SIGTERM is a preemption notice, not an exit.

        scope = Preemptible()        # one per fit() that saves checkpoints
        scope.open()
        ... after each execution:  if scope.reached(executions): save, raise Preempted
        scope.close()

    `reached(n)` is True on every process at the same execution n once any process got
    SIGTERM. Alone, that is the next execution; with several processes, the one the processes
    agree on (module docstring). `received` says whether this process got SIGTERM itself; a
    SIGTERM that came after the last `reached()` call is the caller's to obey at `close()`.
    """

    def __init__(self) -> None:
        import jax

        self.processes = jax.process_count()
        self.index = jax.process_index()
        self.received = threading.Event()  # this process got SIGTERM in the scope
        self._lock = threading.Lock()  # held by the agreement; reached() waits on it
        self._count = 0  # the last execution reached() was asked about (0: none yet)
        self._target: int | None = None
        self._failed: str | None = None
        self._closed = threading.Event()
        self._restore: Any = None
        self._thread: threading.Thread | None = None
        self._published = False

    def open(self) -> None:
        """Enter the scope: SIGTERM from now on is a notice (also when the program had its own
        handler or ignored SIGTERM: a fit() with checkpoints saves on preemption)."""
        global _scope
        if _scope is not None:  # a fit() inside a fit()'s callback: the outer one preempts
            self._closed.set()
            return
        _scope = self
        if threading.current_thread() is threading.main_thread():
            install()
            if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
                self._restore = signal.signal(signal.SIGTERM, _on_sigterm)
        if self.processes > 1 and _client() is not None:
            self._thread = threading.Thread(target=self._agree, name="podkit-preemption",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Leave the scope: SIGTERM ends the process again. Waits for the agreement thread,
        which must not be inside a call to the coordination service when Python exits (a
        thread stopped there aborts the process)."""
        global _scope
        self._closed.set()
        if _scope is self:
            _scope = None
        if self._restore is not None:
            signal.signal(signal.SIGTERM, self._restore)
            self._restore = None
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            client = _client()
            key = f"{_WAKE_DIR}{self.index}"
            try:
                client.key_value_set(key, "closed", allow_overwrite=True)
                thread.join(timeout=AGREE_TIMEOUT_S + 5)
                client.key_value_delete(key)
            except Exception:  # the service is gone: the thread returns too
                pass

    def reached(self, execution: int) -> bool:
        """True when this execution is where every process saves and stops."""
        if _scope is not self:
            return False
        if self.processes == 1:
            return self.received.is_set()
        if self.received.is_set() and not self._published:
            self._publish()  # the handler tried already; a retry costs one round trip
        with self._lock:  # held while the processes agree: this loop waits there
            self._count = execution
            if self._failed is not None:
                raise terminate(f"SIGTERM during training, but the processes could not agree "
                                f"on a step to save at ({self._failed}); exiting with status "
                                f"{EXIT_CODE} without a final checkpoint")
            return self._target == execution

    # -- the notice and the agreement ---------------------------------------------------------

    def notice_sigterm(self) -> None:
        """This process got SIGTERM: the signal handler and the watcher thread call it (it
        takes no lock, so it is safe in a handler)."""
        first = not self.received.is_set()
        self.received.set()
        if first:
            _say("SIGTERM received during training: saving a final checkpoint at the next "
                 "step every process reaches")
        if self.processes > 1:
            self._publish()

    def _publish(self) -> None:
        """Wake every process's agreement thread with the notice."""
        client = _client()
        if client is None or self._published:
            return
        try:
            for index in range(self.processes):
                client.key_value_set(f"{_WAKE_DIR}{index}", "notice", allow_overwrite=True)
            self._published = True
        except Exception:  # reached() retries
            pass

    def _agree(self) -> None:
        client = _client()
        key = f"{_WAKE_DIR}{self.index}"
        while True:
            try:
                if client.blocking_key_value_get(key, _WAIT_MS) != "notice":
                    return  # "closed": the scope ended without a notice
                break
            except Exception as e:
                if "DEADLINE_EXCEEDED" in str(e) and not self._closed.is_set():
                    continue
                return  # closed, or the coordination service is gone (the job is ending)
        if self._closed.is_set():
            return
        with self._lock:
            try:
                client.key_value_set(f"{_COUNT_DIR}{self.index}", str(self._count),
                                     allow_overwrite=True)
                client.wait_at_barrier(_BARRIER, int(AGREE_TIMEOUT_S * 1000))
                counts = [int(v) for _, v in client.key_value_dir_get(_COUNT_DIR)]
                self._target = max(counts) + 1
            except Exception as e:  # a peer left or never came
                self._failed = str(e).splitlines()[0]


def _client() -> Any:
    """agree.coordination_client(), imported here: the launcher imports this module and must
    not import JAX."""
    from podkit import agree

    return agree.coordination_client()
