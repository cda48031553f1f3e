"""Orders that AUTOTUNE decides, against tf.data itself, live, on the machine that runs the test.

tf.data turns `cycle_length=AUTOTUNE`/None (and TFRecordDataset's and TextLineDataset's
`num_parallel_reads=AUTOTUNE`) into a number from the cores the process may run on, and that
number is the interleave's order; podkit.data.cores resolves it the same way. Each check
runs with the process's whole CPU set and again pinned to one core, both libraries asked in
the same state. TensorFlow (the CPU build) is a dev dependency, as in test_data_tf.py."""

import contextlib
import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import podkit as pk
from podkit.data import cores

A = pk.data.AUTOTUNE
assert A == tf.data.AUTOTUNE
LENGTHS = [3, 0, 5, 1, 4, 2, 6, 0, 2, 7]  # uneven, with empty inputs: slots refill


@contextlib.contextmanager
def pinned(one_core):
    """The calling thread (where both libraries read the CPU set) on one core, or as it is."""
    full = os.sched_getaffinity(0)
    if one_core:
        os.sched_setaffinity(0, {min(full)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, full)


CPU_SETS = pytest.mark.parametrize("one_core", [False, True], ids=["all_cores", "one_core"])


def tf_interleave(**kw):
    ds = tf.data.Dataset.from_tensor_slices(np.array(LENGTHS, np.int64)).enumerate().interleave(
        lambda i, n: tf.data.Dataset.range(n).map(lambda j: i * 100 + j), **kw)
    return [int(x) for x in ds.as_numpy_iterator()]


def pk_interleave(**kw):
    ds = pk.data.Dataset.from_tensor_slices(np.array(LENGTHS, np.int64)).enumerate().interleave(
        lambda i, n: pk.data.Dataset.range(int(n)).map(lambda j, i=i: i * 100 + j), **kw)
    return [int(x) for x in ds]


INTERLEAVES = [dict(cycle_length=c, block_length=b, num_parallel_calls=p, deterministic=d)
               for c in (None, A, 2) for b in (None, 2) for p in (None, A, 1, 3)
               for d in ((None, True) if p is not None and b is None else (None,))]


def _name(kw):
    return ",".join(f"{k}={'AUTOTUNE' if v == A else v}" for k, v in kw.items())


# The CPU set matters only where the cycle is left to AUTOTUNE.
@pytest.mark.parametrize("kw,one_core", [
    pytest.param(kw, one, id=f"{_name(kw)}-{'one_core' if one else 'all_cores'}")
    for kw in INTERLEAVES for one in (False, True)
    if not one or kw["cycle_length"] in (None, A)])
def test_interleave_orders_as_tf(kw, one_core):
    with pinned(one_core), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf: `deterministic` without num_parallel_calls
        try:
            expected = tf_interleave(**kw)
        except tf.errors.InvalidArgumentError as e:  # num_parallel_calls > the cycle
            assert "num_parallel_calls" in str(e)
            with pytest.raises(pk.ConfigError, match="num_parallel_calls=3.*cycle_length"):
                pk_interleave(**kw)
            return
        assert pk_interleave(**kw) == expected


@pytest.fixture(scope="module")
def record_files(tmp_path_factory):
    """Ten TFRecord and text files of uneven lengths (two empty), plain and GZIP."""
    root = tmp_path_factory.mktemp("autotune")
    made = {"plain": [], "gzip": [], "text": []}
    for i, n in enumerate(LENGTHS):
        records = [f"{i}:{j}".encode() for j in range(n)]
        for kind, options in (("plain", None), ("gzip", "GZIP")):
            path = str(root / f"f{i}.{kind}")
            with tf.io.TFRecordWriter(path, options) as w:
                for r in records:
                    w.write(r)
            made[kind].append(path)
        text = root / f"f{i}.txt"
        text.write_bytes(b"".join(r + b"\n" for r in records))
        made["text"].append(str(text))
    return made


@pytest.fixture(autouse=True)
def index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "cache"))


def tf_records(ds):
    return [bytes(x) for x in ds.as_numpy_iterator()]


@CPU_SETS
@pytest.mark.parametrize("reads", [None, 1, 2, 3, A], ids=["None", "1", "2", "3", "AUTOTUNE"])
def test_tfrecord_and_text_files_read_in_tfs_order(record_files, reads, one_core):
    with pinned(one_core):
        for kind, compression in (("plain", None), ("gzip", "GZIP")):
            files = record_files[kind]
            expected = tf_records(tf.data.TFRecordDataset(files, compression, None, reads))
            assert list(pk.data.TFRecordDataset(files, compression, None, reads)) == expected
            names = pk.data.Dataset.from_tensor_slices(np.asarray(files, dtype=object))
            by_names = pk.data.TFRecordDataset(names, compression, None, reads)
            assert list(by_names) == tf_records(tf.data.TFRecordDataset(
                tf.data.Dataset.from_tensor_slices(files), compression, None, reads))
        texts = record_files["text"]
        expected = tf_records(tf.data.TextLineDataset(texts, num_parallel_reads=reads))
        assert list(pk.data.TextLineDataset(texts, num_parallel_reads=reads)) == expected


# What TF 2.21 resolved AUTOTUNE to with sched_getaffinity made to report N CPUs (an
# LD_PRELOAD shim, 2026-12; the interleave's order identified among cycle lengths 1-20):
# N -> (interleave(), interleave(num_parallel_calls=AUTOTUNE), interleave(num_parallel_calls=3)
# with None where TF raised InvalidArgumentError).
TF_CYCLES = {1: (1, 1, None), 2: (2, 1, None), 5: (5, 2, 3), 7: (7, 3, 3), 13: (13, 5, 3)}


@pytest.mark.parametrize("n", sorted(TF_CYCLES))
def test_cycle_lengths_tf_chose_for_other_core_counts(n, monkeypatch, record_files):
    monkeypatch.setattr(cores, "schedulable_cores", lambda: n)
    sequential, autotuned, three = TF_CYCLES[n]
    make = pk.data.Dataset.range(3).interleave
    assert make(lambda x: pk.data.Dataset.range(x)).plan.cycle == sequential
    assert make(lambda x: pk.data.Dataset.range(x), num_parallel_calls=A).plan.cycle == autotuned
    if three is None:
        with pytest.raises(pk.ConfigError, match="num_parallel_calls=3"):
            make(lambda x: pk.data.Dataset.range(x), num_parallel_calls=3)
    else:
        assert make(lambda x: pk.data.Dataset.range(x), num_parallel_calls=3).plan.cycle == three
    # TFRecordDataset(num_parallel_reads=AUTOTUNE) reads as TF's explicit count would
    files = record_files["plain"]
    expected = tf_records(tf.data.TFRecordDataset(files, num_parallel_reads=autotuned)) \
        if autotuned > 1 else tf_records(tf.data.TFRecordDataset(files))
    assert list(pk.data.TFRecordDataset(files, num_parallel_reads=A)) == expected


def test_the_core_count_is_tfs_schedulable_cpus():
    assert cores.schedulable_cores() == len(os.sched_getaffinity(0))
    with pinned(True):
        assert cores.schedulable_cores() == 1


@pytest.mark.parametrize("deterministic", [None, True])
def test_parallel_map_and_batch_keep_the_order_under_autotune(deterministic):
    expected = list(tf.data.Dataset.range(300).map(
        lambda x: x * 3, num_parallel_calls=A, deterministic=deterministic)
        .batch(7, num_parallel_calls=A, deterministic=deterministic).as_numpy_iterator())
    got = list(pk.data.Dataset.range(300).map(
        lambda x: x * 3, num_parallel_calls=A, deterministic=deterministic)
        .batch(7, num_parallel_calls=A, deterministic=deterministic))
    assert [g.tolist() for g in got] == [e.tolist() for e in expected]


def test_deterministic_false_gives_tfs_elements_in_an_order_of_its_own():
    """TF defines no order then; podkit's may differ from it and from run to run: only the
    elements are the same."""
    theirs = tf_interleave(cycle_length=3, num_parallel_calls=3, deterministic=False)
    ours = pk_interleave(cycle_length=3, num_parallel_calls=3, deterministic=False)
    assert sorted(ours) == sorted(theirs)
    theirs = list(tf.data.Dataset.range(200).map(lambda x: x + 1, num_parallel_calls=A,
                                                 deterministic=False).as_numpy_iterator())
    ours = list(pk.data.Dataset.range(200).map(lambda x: x + 1, num_parallel_calls=A,
                                               deterministic=False))
    assert sorted(int(x) for x in ours) == sorted(int(x) for x in theirs)
