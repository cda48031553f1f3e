"""Shared by the tests: the seed model, a step-loss recorder, a free port, input workers,
`podkit` commands started and finished."""

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

import podkit as pk


def seed_model(**compile_kwargs):
    model = pk.Sequential(
        [pk.layers.Dense(128, activation="relu"), pk.layers.Dense(10, activation="softmax")]
    )
    kwargs = dict(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    kwargs.update(compile_kwargs)
    model.compile(**kwargs)
    return model


class StepLosses(pk.Callback):
    """Records the window loss at every log point (log_every=1 logs every execution)."""

    def __init__(self):
        self.losses = []

    def on_log(self, step, logs):
        self.losses.append(logs["window/loss"])


class StopAt(pk.Callback):
    """Leaves fit() once the model reaches a step (a crash at a chosen point)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.state.step) >= self.step:
            raise KeyboardInterrupt(f"stopped at step {self.step}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers_of(pid=None, names=("pk-data-worker",)):
    """The input worker processes below a process (they name themselves pk-data-worker; the
    server that forks them is pk-data-server)."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if p.name() in names:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_gone(procs, within=15.0):
    _, alive = psutil.wait_procs(procs, timeout=within)
    assert not alive, f"input workers still running: {[p.pid for p in alive]}"


def warm_workers():
    """Return once input workers really compute (the worker server has started), so that a
    test's own pipeline gets its elements from workers right away."""
    before = {p.pid for p in workers_of()}
    with iter(pk.data.Dataset.range(10**6).map(abs, num_parallel_calls=1)) as it:
        while it.stats().worker_s == 0:
            next(it)
        mine = [p for p in workers_of() if p.pid not in before]
    assert_gone(mine, within=5)  # and its own worker has gone again


class Lines:
    """A process's output, read line by line by a thread: wait for a line with a deadline
    (a silent process fails the test, it does not hang it), then for the exit.

        out = Lines(popen)              # stdout=PIPE, text=True
        out.until("ready", timeout=60)  # the first line (after the ones seen) starting so
        text = out.finish(timeout=30)   # everything, once the process exited
    """

    def __init__(self, proc):
        self.proc, self.lines, self._seen = proc, [], 0
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    @property
    def text(self):
        with self._cond:
            return "".join(self.lines)

    def until(self, prefix, timeout=120, strip="[0123456789] "):
        """The next line that starts with `prefix` (ignoring a launcher's `[i] `)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                while self._seen < len(self.lines):
                    line = self.lines[self._seen]
                    self._seen += 1
                    if line.lstrip(strip).startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    why = "exited" if self._done else f"nothing more within {timeout}s"
                    raise AssertionError(f"no line starting with {prefix!r} ({why}):\n"
                                         f"{''.join(self.lines)[-3000:]}")
                self._cond.wait(left)

    def finish(self, timeout):
        """All output, after the process exited; kills it and fails after `timeout`."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._thread.join(5)
            raise AssertionError(f"still running after {timeout}s:\n{self.text[-3000:]}") from None
        self._thread.join(10)
        return self.text


# XLA:CPU's cheapest code generation, for tests whose CLI runs train tiny models: compiling is
# most of such a run (ResNet-18's step: ~6.8 s of CPU at XLA's defaults, ~1.8 s so; each
# config's programs 50-75% less). What these tests compare is podkit's work (its programs,
# data, collectives, files) between runs compiled alike, not how XLA optimized them.
FAST_XLA = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def fast_xla_env() -> dict:
    """XLA_FLAGS with FAST_XLA added to this process's, for a child's environment."""
    flags = os.environ.get("XLA_FLAGS", "")
    return {"XLA_FLAGS": flags if FAST_XLA in flags else f"{flags} {FAST_XLA}".strip()}


def start_cli(*args, cwd, **env):
    """`podkit ARGS` started, without this process's PODKIT_* variables, with `env` added:
    finish() it. Commands that do not depend on each other run at once: they overlap on the
    cores."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}, **env}
    return subprocess.Popen([sys.executable, "-m", "podkit.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)


def _finish_one(proc, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def finish(*procs, timeout=300):
    """The started processes' CompletedProcesses, in order, once every one exited; every one
    killed after `timeout` s, or when another failed to end. Every pipe is read as it fills
    (one thread each): a process whose output nobody reads stalls once its pipe is full."""
    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            return list(pool.map(lambda p: _finish_one(p, timeout), procs))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
