"""The same deterministic pipelines in pk.data and in tf.data give the same elements in the
same order. TensorFlow (the CPU build) is a dev dependency (requirements-dev.lock, installed by
`make setup` and so by `make test`): without it this file fails to import rather than skip;
test_data.py holds the expected values written out, for reading without TensorFlow."""

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
