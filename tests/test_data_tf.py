"""The same deterministic pipelines in pk.data and in tf.data give the same elements in the
same order. TensorFlow (the CPU build) is a dev dependency (requirements-dev.lock, installed by
`make setup` and so by `make test`): without it this file fails to import rather than skip;
test_data.py holds the expected values written out, for reading without TensorFlow."""

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import podkit as pk

D, T = pk.data.Dataset, tf.data.Dataset


def pk_values(ds):
    return [_plain(e) for e in ds]


def tf_values(ds):
    return [_plain(e) for e in ds.as_numpy_iterator()]


def _plain(e):
    if isinstance(e, tuple):
        return tuple(_plain(x) for x in e)
    if isinstance(e, dict):
        return {k: _plain(v) for k, v in e.items()}
    return e if isinstance(e, bytes) else np.asarray(e).tolist()


def _ragged(lib):
    if lib is D:
        return D.range(1, 8).map(lambda x: np.full(x, x))
    return T.range(1, 8).map(lambda x: tf.fill([x], x))


PIPELINES = {
    "batch": lambda L: L.range(11).batch(4),
    "batch_drop": lambda L: L.range(11).batch(4, drop_remainder=True),
    "padded_batch": lambda L: _ragged(L).padded_batch(3),
    "padded_batch_shape": lambda L: _ragged(L).padded_batch(2, padded_shapes=[9],
                                                            padding_values=np.int64(-1)),
    "unbatch": lambda L: L.range(10).batch(3).unbatch(),
    "interleave": lambda L: L.range(1, 7).interleave(
        lambda x: L.range(x * 10, x * 10 + x), cycle_length=3, block_length=2),
    "interleave_1": lambda L: L.range(1, 5).interleave(lambda x: L.range(x), cycle_length=2),
    "shard": lambda L: L.range(23).shard(4, 3),
    "repeat_skip_take": lambda L: L.range(7).repeat(3).skip(5).take(9),
    "filter_repeat": lambda L: L.range(9).filter(lambda x: x % 3 != 1).repeat(2),
    "enumerate": lambda L: L.range(4).enumerate(start=3),
    "zip": lambda L: L.zip((L.range(5), L.range(10, 13))),
    "concatenate": lambda L: L.range(3).concatenate(L.range(7, 9)),
    "map_tuple": lambda L: L.zip((L.range(4), L.range(4))).map(lambda a, b: a * 10 + b),
    "take_batch_skip": lambda L: L.range(40).take(30).batch(7).skip(1),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_same_elements_as_tf_data(name):
    make = PIPELINES[name]
    assert pk_values(make(D)) == tf_values(make(T))
    assert make(D).cardinality() == int(make(T).cardinality())


def test_bucket_by_sequence_length_as_tf():
    lengths = [3, 1, 7, 4, 2, 6, 5, 1, 8, 3, 2]
    args = dict(bucket_boundaries=[3, 6], bucket_batch_sizes=[2, 3, 2])
    ours = D.from_generator(lambda: (np.arange(n) + 1 for n in lengths)) \
        .bucket_by_sequence_length(len, **args)
    theirs = T.from_generator(lambda: (np.arange(n) + 1 for n in lengths),
                              output_signature=tf.TensorSpec([None], tf.int64)) \
        .bucket_by_sequence_length(lambda e: tf.shape(e)[0], **args)
    assert pk_values(ours) == tf_values(theirs)


def test_text_lines_as_tf(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"alpha\nbeta\r\n\ngamma")
    (tmp_path / "b.txt").write_bytes(b"delta\n")
    files = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert pk_values(pk.data.TextLineDataset(files)) == tf_values(tf.data.TextLineDataset(files))


def _ragged_spec(lib):
    return _ragged(lib).bucket_by_sequence_length(
        len if lib is D else (lambda e: tf.shape(e)[0]), [3], [2, 2])


def _unknown(L):
    return L.range(9).filter(lambda x: x % 2 == 0)


CARDINALITIES = {
    "range": lambda L: L.range(10),
    "slices": lambda L: L.from_tensor_slices(np.arange(7)),
    "batch": lambda L: L.range(10).batch(3),
    "batch_drop": lambda L: L.range(10).batch(3, drop_remainder=True),
    "padded_batch": lambda L: _ragged(L).padded_batch(3),
    "filter": _unknown,
    "filter_repeat": lambda L: _unknown(L).repeat(),
    "filter_repeat_0": lambda L: _unknown(L).repeat(0),
    "filter_take": lambda L: _unknown(L).take(2),
    "filter_concatenate": lambda L: _unknown(L).concatenate(L.range(2)),
    "repeat": lambda L: L.range(3).repeat(),
    "repeat_2": lambda L: L.range(3).repeat(2),
    "repeat_0": lambda L: L.range(3).repeat(0),
    "empty_repeat": lambda L: L.range(0).repeat(),
    "take": lambda L: L.range(10).take(3),
    "take_all": lambda L: L.range(10).take(-1),
    "take_of_infinite": lambda L: L.range(3).repeat().take(5),
    "skip": lambda L: L.range(10).skip(3),
    "skip_past_end": lambda L: L.range(10).skip(30),
    "skip_all": lambda L: L.range(10).skip(-1),
    "skip_of_infinite": lambda L: L.range(3).repeat().skip(2),
    "shard": lambda L: L.range(10).shard(3, 1),
    "shard_last": lambda L: L.range(10).shard(3, 2),
    "shard_of_infinite": lambda L: L.range(3).repeat().shard(2, 0),
    "batch_of_infinite": lambda L: L.range(3).repeat().batch(2),
    "interleave": lambda L: L.range(3).interleave(lambda x: L.range(x), cycle_length=2),
    "unbatch": lambda L: L.range(10).batch(3).unbatch(),
    "bucket": _ragged_spec,
    "zip": lambda L: L.zip((L.range(3), L.range(5))),
    "zip_with_infinite": lambda L: L.zip((L.range(3).repeat(), L.range(5))),
    "concatenate": lambda L: L.range(3).concatenate(L.range(4)),
    "concatenate_infinite": lambda L: L.range(3).repeat().concatenate(L.range(2)),
    "enumerate_shuffle_cache_prefetch": lambda L: L.range(4).enumerate().shuffle(2).cache()
    .prefetch(-1),
    "map": lambda L: L.range(5).map(lambda x: x + 1, num_parallel_calls=2),
    "ignore_errors": lambda L: L.range(3).ignore_errors(),
    "generator": lambda L: L.from_generator(lambda: iter([1, 2]), output_signature=(
        tf.TensorSpec([], tf.int64) if L is T else None)),
}


@pytest.mark.parametrize("name", sorted(CARDINALITIES))
def test_cardinality_as_tf(name):
    make = CARDINALITIES[name]
    assert make(D).cardinality() == int(make(T).cardinality())


GOLDEN = Path(__file__).parent / "golden" / "tf"


@pytest.mark.parametrize("name", ["corrupt", "truncated", "bad_length"])
def test_cardinality_of_a_damaged_tfrecord_file_is_tfs(name, tmp_path, monkeypatch):
    """tf.data's TFRecordDataset never knows its length. podkit's index knows an intact
    file's (docs/data.md), but a file with a bad record has no element count (iterating
    raises there, ignore_errors() ends the file there): then podkit says what TF says, also
    when the index comes from the cache, and when the damaged file is one of several."""
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    files = [str(GOLDEN / "plain.tfrecord"), str(GOLDEN / f"{name}.tfrecord")]
    for _ in range(2):  # built, then read from the index cache
        for given in (files[1], files, files[::-1]):
            for reads in (None, 2):
                ours = pk.data.TFRecordDataset(given, num_parallel_reads=reads)
                theirs = tf.data.TFRecordDataset(given, num_parallel_reads=reads)
                assert ours.cardinality() == int(theirs.cardinality()) \
                    == pk.data.UNKNOWN_CARDINALITY
                assert ours.batch(2).cardinality() == int(theirs.batch(2).cardinality())
    intact = pk.data.TFRecordDataset(files[0])
    assert int(tf.data.TFRecordDataset(files[0]).cardinality()) == pk.data.UNKNOWN_CARDINALITY
    assert intact.cardinality() == len(list(intact)) == 25  # podkit's documented difference


def test_text_lines_cardinality_is_known_where_tfs_is_not(tmp_path):
    """podkit's documented difference (docs/data.md): plain text files are indexed."""
    (tmp_path / "a.txt").write_bytes(b"x\ny\n")
    assert int(tf.data.TextLineDataset(str(tmp_path / "a.txt")).cardinality()) == \
        pk.data.UNKNOWN_CARDINALITY
    assert pk.data.TextLineDataset(str(tmp_path / "a.txt")).cardinality() == 2


def test_list_files_and_file_patterns_match_as_tf(tmp_path):
    """tf.io.matching_files' answers: a wildcard matches dot names, directories are listed,
    a name two patterns match comes twice; a reader opens an existing name as given, glob
    characters and all."""
    for name in ["a.rec", ".b.rec", "s/c.rec", ".h/d.rec", "e[1].rec"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        with tf.io.TFRecordWriter(str(tmp_path / name)) as w:
            w.write(name.encode())
    patterns = [str(tmp_path / p) for p in ["*.rec", "*/*.rec", "a*", "*"]]
    theirs = [bytes(x) for x in T.list_files(patterns, shuffle=False).as_numpy_iterator()]
    assert list(D.list_files(patterns, shuffle=False)) == theirs
    files = [str(tmp_path / "e[1].rec"), str(tmp_path / ".b.rec")]
    assert list(pk.data.TFRecordDataset(files)) == tf_values(tf.data.TFRecordDataset(files))
