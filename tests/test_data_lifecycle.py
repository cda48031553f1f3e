"""Input workers never outlive their consumer and never leave it hanging: they end with the
iterator, with a Ctrl-C, with a SIGKILL of the consumer at any moment; a worker that dies or
cannot start is an error in the consumer within seconds, naming the cause."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from helpers import assert_gone, warm_workers, workers_of

D = pk.data.Dataset
HARNESS = Path(__file__).with_name("kill_harness.py")


def slow_square(x):
    time.sleep(0.002)
    return x * x


def started(it):
    """Take elements until the iterator's workers compute; its worker processes."""
    before = {p.pid for p in workers_of()}
    while it.stats().worker_s == 0:
        next(it)
    return [p for p in workers_of() if p.pid not in before]


def test_workers_end_with_the_iterator():
    warm_workers()  # so that the workers exist as soon as the first element is taken
    # 2,000 elements: ~4 s of work in this process before the workers take over (they start in
    # ~0.04 s; with 400, a machine at load 10 once ran out of elements before they did).
    ds = D.range(2000).map(slow_square, num_parallel_calls=2).batch(8)
    it = iter(ds)
    procs = started(it)
    assert len(procs) == 2 and it.stats().workers == 2
    list(it)  # exhausted
    assert_gone(procs, within=5)
    with iter(ds) as it:  # closed early, in the middle of its elements
        procs = started(it)
        assert len(procs) == 2
    assert_gone(procs, within=5)
    it = iter(ds)
    procs = started(it)
    assert len(procs) == 2
    del it  # dropped: garbage collection ends them too
    assert_gone(procs, within=5)


def test_sigkill_of_the_consumer_at_random_moments_leaves_no_worker_behind():
    # Each round a fresh interpreter killed at a random moment (~3 s of a core each: the
    # consumer's and its worker server's imports). Seed 7's first 8 moments cover every
    # phase: before the server exists (below_at_kill empty), the server importing ("python"),
    # its workers computing; on a loaded machine the phases only last longer.
    rounds = 8
    out = subprocess.run([sys.executable, str(HARNESS), str(rounds), "7"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(results) == rounds
    survivors = [r for r in results if r.get("gone_after_s") is None]
    assert not survivors, survivors  # each round: nothing alive 10 s after the kill
    # The random moments covered each phase: server importing (still named "python"),
    # workers forked, workers computing.
    below = [set(r["below_at_kill"]) for r in results]
    assert any("python" in b for b in below), results
    assert sum("pk-data-worker" in b for b in below) >= rounds // 2, results


# A terminal's Python answers SIGINT with KeyboardInterrupt. A test runner started in the
# background (`make test &`) hands its children SIGINT ignored, and Python then keeps it
# ignored: the scripts restore the terminal's behaviour first.
AS_IN_A_TERMINAL = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"

CTRL_C = AS_IN_A_TERMINAL + textwrap.dedent("""
    import time
    import podkit as pk

    def slow(x):
        time.sleep(0.002)
        return x

    it = iter(pk.data.Dataset.range(10**7).map(slow, num_parallel_calls=2).batch(4))
    while it.stats().worker_s == 0:  # until the workers compute
        next(it)
    print("ready", flush=True)
    for batch in it:
        pass
""")


def test_ctrl_c_interrupts_the_consumer_and_workers_go_quietly(tmp_path):
    script = tmp_path / "flat.py"
    script.write_text(CTRL_C)  # no __main__ guard
    # Its own session: a terminal's Ctrl-C signals the whole foreground process group.
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        procs = workers_of(proc.pid, names=("pk-data-worker", "pk-data-server"))
        assert len(procs) == 3
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback (most recent call last)") == 1, err  # the consumer's only
    assert "leaked" not in err and "shared_memory" not in err, err
    assert_gone(procs, within=5)


def test_a_killed_worker_is_an_error_naming_the_signal():
    before = {p.pid for p in workers_of()}
    ds = D.range(4000).map(slow_square, num_parallel_calls=2).batch(4)
    it = iter(ds)
    while it.stats().worker_s == 0:  # the first batches may come from this process
        next(it)
    mine = [p for p in workers_of() if p.pid not in before]  # this iterator's workers
    mine[0].kill()
    start = time.monotonic()
    with pytest.raises(pk.DataError, match=r"input worker \d \(pid \d+\) died while computing "
                       r"items \d+\.\.\d+: it was killed by signal 9 \(SIGKILL\)"):
        for _ in it:
            pass
    assert time.monotonic() - start < 5
    assert_gone(mine, within=5)


def test_a_worker_that_cannot_import_the_function_is_an_error_with_the_fix(tmp_path):
    module = tmp_path / "podkit_lost_module.py"
    module.write_text("import time\n\ndef double(x):\n    time.sleep(0.001)\n    return x * 2\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import podkit_lost_module
    finally:
        sys.path.remove(str(tmp_path))  # the workers cannot import it now
    ds = D.range(1000).map(podkit_lost_module.double, num_parallel_calls=2)
    warm_workers()  # the workers start at once (this process computes only the first few)
    start = time.monotonic()
    with pytest.raises(pk.DataError, match=r"(?s)could not start.*No module named "
                       r"'podkit_lost_module'.*Define it in the script"):
        list(ds)
    assert time.monotonic() - start < 10
    del sys.modules["podkit_lost_module"]


def test_an_unpicklable_function_is_refused_or_run_here():
    lock = threading.Lock()

    def locked(x):
        with lock:
            return x + 1

    with pytest.raises(pk.InputError, match=r"(?s)cannot be sent to its input worker.*lock.*"
                       r"num_parallel_calls=None"):
        list(D.range(10).map(locked, num_parallel_calls=2))

    def slow_locked(x):
        time.sleep(0.001)
        with lock:
            return x + 1

    ds = D.range(1000).map(slow_locked, num_parallel_calls=pk.data.AUTOTUNE)
    with pytest.warns(UserWarning, match="computing it in this process instead"):
        values = [int(v) for v in ds]
    assert values == list(range(1, 1001))  # AUTOTUNE never changes whether a pipeline works


def test_errors_in_workers_keep_their_type():
    warm_workers()
    ds = D.range(1, 30).map(lambda n: np.arange(n % 4), num_parallel_calls=2).batch(3)
    with pytest.raises(pk.InputError, match="padded_batch"):  # ragged, found in a worker
        list(ds)


FIT_CTRL_C = AS_IN_A_TERMINAL + textwrap.dedent("""
    import time
    import numpy as np
    import podkit as pk

    def slow(a, b):
        time.sleep(0.002)
        return a, b

    x = np.random.default_rng(0).normal(size=(4096, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    ds = pk.data.Dataset.from_tensor_slices((x, y)).map(slow, num_parallel_calls=2).batch(64)

    class Ready(pk.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print("ready", flush=True)

    model = pk.Sequential([pk.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(ds, epochs=1000, verbose=0, callbacks=[Ready()])
""")


def test_ctrl_c_during_fit_stops_it_at_once(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(FIT_CTRL_C)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        procs = workers_of(proc.pid, names=("pk-data-worker", "pk-data-server"))
        assert len(procs) == 3
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - start
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err and "leaked" not in err, err
    assert err.count("Traceback (most recent call last)") == 1, err
    assert took < 4, took  # no thread left waiting on the input
    assert_gone(procs, within=5)
