"""Bad input gets an error that names the value and the fix; worker processes never outlive
their iterator — at the end, on close, on an error, or when the consumer is killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import podkit as pk
from helpers import seed_model

D = pk.data.Dataset


def workers_of(pid=None):
    me = psutil.Process(pid)
    return [p for p in me.children(recursive=True)
            if "spawn_main" in " ".join(p.cmdline())]


def assert_gone(procs, within=15.0):
    _, alive = psutil.wait_procs(procs, timeout=within)
    assert not alive, f"input workers still running: {[p.pid for p in alive]}"


def slow_square(x):
    time.sleep(0.002)
    return x * x


def fails_on_13(x):
    if x == 13:
        raise ValueError(f"cannot decode record {x}")
    return x


def test_mismatched_leading_dims_name_the_shapes():
    with pytest.raises(pk.InputError, match=r"leading dims.*\(5, 3\).*\(4,\)"):
        D.from_tensor_slices((np.zeros((5, 3)), np.zeros(4)))


def test_missing_files_name_the_pattern(tmp_path):
    with pytest.raises(pk.InputError, match="no file matches .*nothing-\\*.txt"):
        pk.data.TextLineDataset(str(tmp_path / "nothing-*.txt"))
    with pytest.raises(pk.InputError, match="no file matches .*missing.array_record"):
        pk.data.ArrayRecordDataset([str(tmp_path / "missing.array_record")])


def test_not_an_array_record_file(tmp_path):
    bad = tmp_path / "x.array_record"
    bad.write_bytes(b"not an array record")
    with pytest.raises(pk.InputError, match="ArrayRecord"):
        pk.data.ArrayRecordDataset(str(bad))


def test_ragged_batch_suggests_padded_batch():
    ds = D.range(1, 4).map(lambda n: np.arange(n)).batch(3)
    with pytest.raises(pk.InputError, match="padded_batch"):
        list(ds)


def test_state_of_another_pipeline_is_refused():
    it = iter(D.range(10).shuffle(10, seed=1).batch(2))
    next(it)
    state = it.get_state()
    other = iter(D.range(10).shuffle(10, seed=1).batch(3))
    with pytest.raises(pk.InputError, match="different pipeline"):
        other.set_state(state)
    with pytest.raises(pk.InputError, match="not a state"):
        other.set_state({"index": 3})


@pytest.mark.parametrize("make, match", [
    (lambda: D.range(3).batch(0), "batch_size=0"),
    (lambda: D.range(3).shard(2, 2), "shard index=2"),
    (lambda: D.range(3).map(abs, num_parallel_calls=0), "num_parallel_calls=0"),
    (lambda: D.range(3).shuffle(0), "buffer_size=0"),
    (lambda: D.range(3).take(-5), "count=-5"),
    (lambda: D.range(3).map("abs"), "map needs a function"),
    (lambda: D.range(1, 2, 0), "step must not be 0"),
    (lambda: D.range(3).bucket_by_sequence_length(len, [5, 3], [1, 1, 1]),
     "bucket_boundaries"),
    (lambda: D.range(3).bucket_by_sequence_length(len, [3], [1]), "bucket_batch_sizes"),
])
def test_bad_arguments(make, match):
    with pytest.raises(pk.ConfigError, match=match):
        make()


def test_bad_pipelines_raise_when_iterated():
    with pytest.raises(pk.InputError, match="must return a pk.data.Dataset"):
        list(D.range(3).interleave(lambda x: [x]))
    with pytest.raises(pk.InputError, match="endless"):
        list(D.range(3).repeat().cache())
    with pytest.raises(pk.InputError, match="not bytes"):
        pk.data.write_array_record(D.range(3), "/tmp/podkit-never-written", 1)


def test_fit_rejects_what_cannot_work():
    model = seed_model()
    x = np.zeros((64, 8), np.float32)
    y = np.zeros(64, np.int32)
    ds = D.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(pk.ConfigError, match="steps_per_epoch"):
        model.fit(ds.repeat(), epochs=1, verbose=0)
    with pytest.raises(pk.InputError, match="batch_size does not apply"):
        model.fit(ds, batch_size=8, verbose=0)
    with pytest.raises(pk.ConfigError, match="not divisible by the 3 processes"):
        ds._for_process(3, 0)
    with pytest.raises(pk.InputError, match="batch the dataset last"):
        ds.unbatch()._for_process(2, 0)


def test_map_error_reaches_the_consumer_with_index_and_traceback():
    ds = D.range(40).map(fails_on_13, num_parallel_calls=2).batch(4)
    it = iter(ds)
    start = time.monotonic()
    with pytest.raises(pk.DataError) as info:
        for _ in it:
            pass
    assert time.monotonic() - start < 60  # nothing hangs
    err = info.value
    assert err.index == 13
    assert "fails_on_13 raised ValueError: cannot decode record 13 on element 13" in str(err)
    assert 'raise ValueError(f"cannot decode record {x}")' in err.traceback
    assert it._stream is None  # the iterator closed itself ...
    assert_gone(workers_of())  # ... and its workers are gone


def test_workers_end_with_the_iterator():
    ds = D.range(400).map(slow_square, num_parallel_calls=2).batch(8)
    it = iter(ds)
    next(it)
    procs = workers_of()
    assert len(procs) == 2 and it._stream.plan.workers == 2
    list(it)  # exhausted
    assert_gone(procs)
    with iter(ds) as it:  # closed early
        next(it)
        procs = workers_of()
        assert len(procs) == 2
    assert_gone(procs)


def test_workers_exit_when_the_consumer_is_killed(tmp_path):
    script = tmp_path / "consumer.py"
    script.write_text(textwrap.dedent("""
        import time
        import podkit as pk

        def slow(x):
            time.sleep(0.01)
            return x

        if __name__ == "__main__":
            it = iter(pk.data.Dataset.range(10**6).map(slow, num_parallel_calls=2))
            next(it)
            print("ready", flush=True)
            time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] != "ready":  # skip anything else a library prints
            line = proc.stdout.readline()
            assert line, f"consumer died before it was ready: {proc.stderr.read()[-2000:]}"
            lines.append(line.strip())
        procs = workers_of(proc.pid)
        assert len(procs) == 2, [" ".join(p.cmdline()) for p in psutil.Process(
            proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert_gone(procs, within=10)
    finally:
        proc.kill()
