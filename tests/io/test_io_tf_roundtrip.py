"""What podkit writes, TensorFlow reads: TFRecord files (plain, GZIP, ZLIB), Examples and
SequenceExamples of every kind, PNGs and JPEGs. Runs where tensorflow is installed (the bench
extra); CI, without it, skips it."""

import numpy as np
import pytest

import podkit as pk

tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_tensorflow_reads_podkits_tfrecord_files(tmp_path, compression):
    records = [b"", b"a", bytes(range(256)) * 40] + [b"%d" % i for i in range(50)]
    path = str(tmp_path / "x.tfrecord")
    with pk.io.TFRecordWriter(path, compression) as w:
        for r in records:
            w.write(r)
    ds = tf.data.TFRecordDataset(path, compression_type=compression or "")
    assert [r for r in ds.as_numpy_iterator()] == records


def test_tensorflow_parses_podkits_examples_as_podkit_does():
    values = {"i": 5, "f": 2.5, "b": b"\x01", "il": np.arange(6), "fl": [0.25, -1.0],
              "bl": ["x", b"yz"], "ef": np.zeros(0, np.float32)}
    record = pk.io.serialize_example(values)
    tf_spec = {"i": tf.io.FixedLenFeature([], tf.int64), "f": tf.io.FixedLenFeature([], tf.float32),
               "b": tf.io.FixedLenFeature([], tf.string),
               "il": tf.io.FixedLenFeature([2, 3], tf.int64), "fl": tf.io.VarLenFeature(tf.float32),
               "bl": tf.io.VarLenFeature(tf.string), "ef": tf.io.VarLenFeature(tf.float32)}
    pk_spec = {"i": pk.io.FixedLenFeature([], "int64"), "f": pk.io.FixedLenFeature([], "float32"),
               "b": pk.io.FixedLenFeature([], "string"),
               "il": pk.io.FixedLenFeature([2, 3], "int64"), "fl": pk.io.VarLenFeature("float32"),
               "bl": pk.io.VarLenFeature("string"), "ef": pk.io.VarLenFeature("float32")}
    theirs = tf.io.parse_single_example(record, tf_spec)
    ours = pk.io.parse_single_example(record, pk_spec)
    for key, value in theirs.items():
        value = (value.values if isinstance(value, tf.SparseTensor) else value).numpy()
        if isinstance(value, bytes):  # a scalar string: bytes, as tf.data's numpy gives it
            assert ours[key] == value
            continue
        np.testing.assert_array_equal(np.asarray(ours[key]), value)
        assert np.asarray(ours[key]).dtype == value.dtype, key
    seq = pk.io.serialize_sequence_example({"n": 2}, {"t": [[1, 2], [3, 4]]})
    context, sequence = tf.io.parse_single_sequence_example(
        seq, {"n": tf.io.FixedLenFeature([], tf.int64)},
        {"t": tf.io.FixedLenSequenceFeature([2], tf.int64)})
    assert int(context["n"]) == 2 and sequence["t"].numpy().tolist() == [[1, 2], [3, 4]]


def test_tensorflow_decodes_podkits_images():
    rng = np.random.default_rng(0)
    for c in (1, 3, 4):
        img = rng.integers(0, 256, (13, 17, c), dtype=np.uint8)
        np.testing.assert_array_equal(tf.io.decode_png(pk.io.encode_png(img)).numpy(), img)
    img = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
    jpeg = pk.io.encode_jpeg(img, quality=80)
    np.testing.assert_array_equal(tf.io.decode_jpeg(jpeg).numpy(), pk.io.decode_jpeg(jpeg))
    assert jpeg == tf.io.encode_jpeg(img, quality=80).numpy()
