"""What runs inside input worker processes: the server that forks them, and their loop.

Every process here starts from a clean interpreter (`python -c BOOT`), never from a fork of
the user's process (which may be running JAX's threads) and never by importing the user's
`__main__`, so a flat script without an `if __name__ == "__main__":` guard, `python -c`,
standard input and notebooks all work alike. The server imports numpy, Grain and podkit.data
once; each worker is then a fork of that quiet, single-threaded server, ready in milliseconds.
The pipeline reaches a worker by value (cloudpickle), functions defined in `__main__`
included.

A process here ends as soon as its consumer is gone, whatever way it went: each one has a
lifeline (the read end of a pipe whose write end only the consumer holds; end of file means the
consumer closed it or died) and watches that its parent is still the process that started it.
SIGINT is ignored: a Ctrl-C in a terminal reaches the whole process group, and only the
consumer should answer it (with KeyboardInterrupt); its workers then go quietly.

Consumer side: podkit.data.pool. Wire format: podkit.data.transfer.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import sys
import threading
import time
import traceback
from typing import Any

# Run as `python -c BOOT podkit-data-server PARENT_PID LIFELINE_FD CONTROL_FD`. It starts the
# watch before anything slow is imported, so a consumer killed while its server is still
# starting leaves nothing behind either.
BOOT = """
import os, select, signal, sys, threading
signal.signal(signal.SIGINT, signal.SIG_IGN)
_parent, _life, _control = (int(a) for a in sys.argv[2:5])
_stop = threading.Event()
def _watch():
    while not _stop.is_set():
        ready = select.select([_life], [], [], 0.2)[0]
        if (ready and not os.read(_life, 1)) or os.getppid() != _parent:
            os._exit(0)
_watcher = threading.Thread(target=_watch, daemon=True)
_watcher.start()
if os.getppid() != _parent:
    os._exit(0)
import json
_path = json.loads(os.environ.pop("PODKIT_SYS_PATH", "[]"))
sys.path[:] = _path + [p for p in sys.path if p not in _path]
from podkit.data import worker
_stop.set()
_watcher.join()
worker.serve(_parent, _life, _control)
"""

SERVER_NAME = b"pk-data-server"
WORKER_NAME = b"pk-data-worker"
POLL_S = 0.2


def _set_name(name: bytes) -> None:
    """The name `ps`, `top` and psutil show (Linux; elsewhere the command line tells)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _consumer_gone(life: int, parent: int, timeout: float) -> bool:
    ready = select.select([life], [], [], timeout)[0]
    return bool(ready and not os.read(life, 1)) or os.getppid() != parent


# -- the server ---------------------------------------------------------------------------------
def serve(parent: int, life: int, control_fd: int) -> None:
    """Fork workers on request; report their exits; exit with the consumer."""
    from podkit.data import random_access, transfer  # noqa: F401 - loaded once, shared by forks

    _set_name(SERVER_NAME)
    control = transfer.Channel(socket.socket(fileno=control_fd))
    try:
        control.send(("ready", os.getpid()))
        while True:
            ready = select.select([control.sock, life], [], [], POLL_S)[0]
            _report_exits(control)
            if life in ready or os.getppid() != parent:
                os._exit(0)
            if control.sock not in ready:
                continue
            message, fds = control.recv()
            if message[0] == "fork":
                data_fd, worker_life = fds
                pid = os.fork()
                if pid == 0:
                    control.sock.close()
                    os.close(life)
                    _worker(data_fd, worker_life, os.getppid())
                os.close(data_fd)
                os.close(worker_life)
                control.send(("forked", message[1], pid))
    except transfer.Closed:
        os._exit(0)


def _report_exits(control: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(("exited", pid, status))


# -- a worker -----------------------------------------------------------------------------------
def _worker(data_fd: int, life: int, server: int) -> None:
    """A forked worker: never returns into the server's loop."""
    code = 0
    try:
        _set_name(WORKER_NAME)
        threading.Thread(target=_watch_lifeline, args=(life, server), daemon=True).start()
        import numpy as np

        np.random.seed(int.from_bytes(os.urandom(4), "little"))  # forks must not share draws
        _work(data_fd)
    except BaseException:  # the consumer has been told, or is gone
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _watch_lifeline(life: int, server: int) -> None:
    while not _consumer_gone(life, server, POLL_S):
        pass
    os._exit(0)


def _work(data_fd: int) -> None:
    from podkit.data import sources, transfer

    sources.BATCHED_READS = False  # every core computes: read one record at a time
    channel = transfer.Channel(socket.socket(fileno=data_fd))
    init, _ = channel.recv()
    try:
        _adopt(init)
        dataset = pickle.loads(init["plan"])
    except BaseException as e:  # reported to the consumer
        channel.send(("error", _describe_start_failure(e)))
        raise
    channel.send(("ready", os.getpid()))
    slots: dict[int, transfer.Slot] = {}
    while True:
        try:
            message, _ = channel.recv()
        except transfer.Closed:
            return
        if message[0] == "drop":  # a slot the consumer no longer needs (it had lent it)
            dropped = slots.pop(message[1], None)
            if dropped is not None:
                dropped.close()
            continue
        _, seq, start, stop, slot = message
        t0 = time.perf_counter()
        items, error = _compute(dataset, start, stop)
        seconds = time.perf_counter() - t0
        target = slots.setdefault(slot, transfer.Slot())
        try:
            layout, fd = transfer.pack(items, target)
        except Exception as e:  # an element pickle cannot carry
            items, error = [], _as_error(e, f"an element of items {start}..{stop - 1} could "
                                           "not be sent from the input worker")
            layout, fd = transfer.pack(items, target)
        channel.send(("chunk", seq, layout, seconds, _portable(error)),
                     fds=() if fd is None else (fd,))
        if fd is not None:
            os.close(fd)  # the consumer holds its own descriptor; our map keeps the memory


def _adopt(init: dict) -> None:
    """The consumer's view of the world: module search path, working directory, environment."""
    sys.path[:] = init["sys_path"]
    os.chdir(init["cwd"])
    for key in set(os.environ) - set(init["env"]):
        del os.environ[key]
    os.environ.update(init["env"])


def _compute(dataset: Any, start: int, stop: int) -> tuple[list, BaseException | None]:
    """Items [start, stop): read together (batched reads), or one by one after a failure, so
    that the items before a failing one still arrive, as they would in one process."""
    import numpy as np

    from podkit.data import random_access

    try:
        return list(random_access.read(dataset, np.arange(start, stop))), None
    except Exception:  # redone one by one to find the item
        pass
    items = []
    for i in range(start, stop):
        try:
            items.append(dataset[i])
        except Exception as e:  # raised in the consumer, after items
            return items, _as_error(e, f"the input pipeline failed on item {i}")
    return items, None


def _as_error(e: BaseException, what: str) -> BaseException:
    from podkit.errors import DataError, PodkitError

    if isinstance(e, PodkitError):
        return e
    return DataError(f"{what}: {type(e).__name__}: {e}", None, traceback.format_exc())


def _portable(error: BaseException | None) -> BaseException | None:
    if error is None:
        return None
    try:
        pickle.dumps(error)
        return error
    except Exception:  # an exception that does not pickle: keep its text
        from podkit.errors import DataError

        return DataError(str(error), getattr(error, "index", None),
                         getattr(error, "traceback", ""))


def _describe_start_failure(e: BaseException) -> str:
    text = "".join(traceback.format_exception(e))
    hint = ""
    if isinstance(e, ModuleNotFoundError | AttributeError | ImportError):
        hint = ("\nA function the pipeline uses is pickled by reference to its module, and the "
                "worker could not import it. Define it in the script itself (it then travels "
                "by value) or in a module on sys.path.")
    return text + hint

