"""Shared by the tests: the seed model, a step-loss recorder, a free port, input workers."""

import socket

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
