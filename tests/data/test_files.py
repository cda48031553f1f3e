"""tf.data's file verbs as tf.data has them: Dataset.list_files, TextLineDataset's
compression_type / buffer_size / num_parallel_reads, write_array_record of a dataset of unknown
length, and padded_batch's element_spec."""

import gzip
import zlib

import numpy as np
import pytest
from op_checks import by_iterator

import podkit as pk
from podkit.data.iterator import DatasetIterator

D = pk.data.Dataset


@pytest.fixture
def texts(tmp_path):
    for name, data in {"p1.txt": b"a1\na2\na3\n", "p2.txt": b"b1\nb2\n", "p3.txt": b"c1\n",
                       "z.zz": zlib.compress(b"l1\nl2\r\n\nl4"),
                       "m.gz": gzip.compress(b"m1\nm2\n") + gzip.compress(b"m3\n"),
                       "big.gz": gzip.compress(b"".join(b"%d\n" % i for i in range(5000)))
                       }.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


def test_list_files_shuffles_by_default_as_tf_data(texts):
    pattern = str(texts / "*.txt")
    names = [str(texts / f"p{i}.txt").encode() for i in (1, 2, 3)]
    ds = D.list_files(pattern)
    assert ds.element_spec.dtype == object and ds.cardinality() == 3
    orders = {tuple(ds) for _ in range(20)}
    assert all(sorted(o) == names for o in orders) and len(orders) > 1  # reshuffled
    seeded = D.list_files(pattern, seed=3)
    assert list(seeded) == list(D.list_files(pattern, seed=3))
    assert list(D.list_files(pattern, shuffle=False)) == names
    with pytest.raises(pk.errors.InputError, match=r"no files matched pattern: .*\*\.nope, "
                       r".*missing.txt"):
        D.list_files([str(texts / "*.nope"), str(texts / "missing.txt")])
    with pytest.raises(pk.errors.ConfigError, match="shuffle='yes'"):
        D.list_files(pattern, shuffle="yes")


def test_text_line_dataset_reads_gzip_and_zlib_as_tf_data(texts):
    zz = pk.data.TextLineDataset(str(texts / "z.zz"), compression_type="ZLIB")
    assert list(zz) == [b"l1", b"l2", b"", b"l4"]  # TensorFlow's lines of this file
    assert zz.cardinality() == pk.data.UNKNOWN_CARDINALITY
    gz = pk.data.TextLineDataset([str(texts / "m.gz")], "GZIP", buffer_size=4)
    assert list(gz) == [b"m1", b"m2", b"m3"]  # concatenated members: one stream, as TF
    plain = pk.data.TextLineDataset(str(texts / "p1.txt"), compression_type="")
    assert list(plain) == [b"a1", b"a2", b"a3"] and plain.plan.random_access
    with pytest.raises(pk.errors.ConfigError, match=r"compression_type='gzip'.*\"GZIP\""):
        pk.data.TextLineDataset(str(texts / "m.gz"), compression_type="gzip")
    with pytest.raises(pk.errors.DataError, match=r"p1.txt' is not a valid GZIP file"):
        list(pk.data.TextLineDataset(str(texts / "p1.txt"), compression_type="GZIP"))
    cut = texts / "cut.gz"
    cut.write_bytes((texts / "big.gz").read_bytes()[:-40])
    with pytest.raises(pk.errors.DataError, match=r"cut.gz' ends before its GZIP stream"):
        list(pk.data.TextLineDataset(str(cut), compression_type="GZIP"))


def test_a_compressed_text_stream_resumes_exactly(texts):
    files = [str(texts / "m.gz"), str(texts / "big.gz")]
    ds = pk.data.TextLineDataset(files, compression_type="GZIP").batch(7)
    whole = by_iterator(ds)
    it = DatasetIterator(ds.plan, iteration=0, workers=False)
    head = [next(it).tolist() for _ in range(300)]
    state = it.get_state()
    it.close()
    again = DatasetIterator(ds.plan, iteration=0, workers=False)
    again.set_state(state)
    rest = [b.tolist() for b in again]
    assert head + rest == whole and whole[0] == [b"m1", b"m2", b"m3", b"0", b"1", b"2", b"3"]


def test_num_parallel_reads_interleaves_lines_as_tf_data(texts):
    files = [str(texts / f"p{i}.txt") for i in (1, 2, 3)]
    ds = pk.data.TextLineDataset(files, num_parallel_reads=2)
    # tf.data's order for these files (cycle of 2 files, one line from each in turn)
    assert list(ds) == [b"a1", b"b1", b"a2", b"b2", b"a3", b"c1"]
    from_names = pk.data.TextLineDataset(D.list_files(str(texts / "p*.txt"), shuffle=False),
                                         num_parallel_reads=2)
    assert list(from_names) == list(ds)  # a Dataset of file names, as tf.data takes
    with pytest.raises(pk.errors.ConfigError, match="num_parallel_reads=0"):
        pk.data.TextLineDataset(files, num_parallel_reads=0)


def test_write_array_record_of_a_generator(tmp_path):
    def gen():
        yield from (b"r%d" % i for i in range(7))

    ds = D.from_generator(gen)
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    one = pk.data.write_array_record(ds, str(tmp_path / "one" / "g"))
    assert list(pk.data.ArrayRecordDataset(one)) == list(gen())
    three = pk.data.write_array_record(ds.filter(lambda r: True), str(tmp_path / "g"), 3)
    sizes = [len(pk.data.ArrayRecordDataset(n)) for n in three]
    assert sizes == [2, 2, 3]  # contiguous runs, as for a dataset of known length
    assert list(pk.data.ArrayRecordDataset(three)) == list(gen())
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        f"g-0000{i}-of-00003.array_record" for i in range(3)]  # no spool file left
    with pytest.raises(pk.errors.InputError, match=r"endless dataset .*\.take\(n\)"):
        pk.data.write_array_record(ds.repeat(), str(tmp_path / "e"))


def test_padded_batch_element_spec_has_none_for_padded_dims():
    ds = D.from_generator(lambda: iter([np.arange(n, dtype=np.int64) for n in (1, 3, 2)]))
    spec = ds.padded_batch(2).element_spec
    assert spec.shape == (None, None) and spec.dtype == np.int64
    assert ds.padded_batch(2, drop_remainder=True).element_spec.shape == (2, None)
    assert ds.padded_batch(2, padded_shapes=[5]).prefetch(1).element_spec.shape == (None, 5)
    pairs = D.from_generator(lambda: iter([(np.ones((n, 2)), np.int32(n)) for n in (1, 3)]))
    x, n = pairs.padded_batch(2, padded_shapes=([None, 2], []), drop_remainder=True
                              ).element_spec
    assert (x.shape, n.shape) == ((2, None, 2), (2,))
    assert D.range(4).batch(2, drop_remainder=True).element_spec.shape == (2,)  # unchanged
