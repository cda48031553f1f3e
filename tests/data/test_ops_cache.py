"""Cache: the first pass kept, with random access whatever the parent."""

import numpy as np
import pytest
from op_checks import by_index, by_iterator

import podkit as pk

D = pk.data.Dataset


def test_a_cached_stream_has_random_access_and_computes_once():
    calls = []

    def gen():
        calls.append(1)
        return iter(range(6))

    ds = D.from_generator(gen).cache()
    assert ds.plan.random_access and not ds.plan.varies()
    assert by_iterator(ds) == by_iterator(ds) == by_index(ds.plan) == list(range(6))
    assert len(calls) == 1
    assert ds.plan.describe() == "cache(filename='')|"


def test_a_file_cache_is_reused_by_a_new_pipeline(tmp_path):
    name = str(tmp_path / "c")
    assert by_iterator(D.range(4).map(lambda v: v + 1).cache(name)) == [1, 2, 3, 4]
    assert (tmp_path / "c.podkit_cache.array_record").exists()
    # the fingerprint names a function, not its code: a run whose lambda differs reads the
    # file written before (a pipeline of another structure is refused, below)
    assert by_iterator(D.range(4).map(lambda v: v * 0).cache(name)) == [1, 2, 3, 4]


def test_cache_keeps_a_shuffle_below_fixed_and_splits_below():
    ds = D.range(8).shuffle(8, seed=1).cache()
    assert by_iterator(ds) == by_iterator(ds)
    assert D.range(8).batch(4, drop_remainder=False).cache().element_spec.shape == (None,)
    share = D.range(8).batch(4).cache().for_process(2, 1)
    assert by_iterator(share) == [[1, 3], [5, 7]]


def test_an_endless_cache_is_an_error():
    with pytest.raises(pk.errors.InputError, match="endless dataset would never finish"):
        by_iterator(D.range(2).repeat().cache().take(3))


# -- the file format: records of arrays, a header naming the pipeline ------------------------
def test_a_file_cache_keeps_every_kind_of_leaf_exactly(tmp_path):
    import numpy as np

    from podkit.data import codec

    element = {"img": np.arange(6, dtype=np.uint8).reshape(2, 3), "f": np.float16(1.5),
               "pair": (np.array([1.0, 2.0], np.float64), [b"ab\x00", "t\u00e9"]),
               "names": np.array([b"x", b"yz"], dtype=object), "flag": np.bool_(True),
               "s": np.array([b"a\x00"], dtype="S2"), "n": 7, "x": 0.25}
    back = codec.decode(codec.encode(element))
    assert back.keys() == element.keys()
    assert back["img"].dtype == np.uint8 and back["img"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["img"].flags.writeable
    assert back["f"].dtype == np.float16 and back["f"] == 1.5
    assert isinstance(back["pair"], tuple) and isinstance(back["pair"][1], list)
    assert back["pair"][1] == [b"ab\x00", "t\u00e9"]
    assert back["names"].dtype == object and back["names"].tolist() == [b"x", b"yz"]
    assert back["flag"].dtype == np.bool_ and back["s"].tolist() == [b"a"]
    assert back["n"].dtype == np.int64 and back["x"].dtype == np.float64  # as numpy scalars

    ds = D.from_tensor_slices({"x": np.arange(6, dtype=np.int32).reshape(3, 2),
                               "t": np.array([b"a", b"bb", b"c"], dtype=object)})
    name = str(tmp_path / "k")
    first = by_iterator(ds.cache(name))
    assert by_iterator(ds.cache(name)) == first  # the second read is from the file
    assert first[1] == {"x": [2, 3], "t": b"bb"}


def test_a_cache_file_holds_no_pickle(tmp_path):
    from array_record.python.array_record_module import ArrayRecordReader

    name = str(tmp_path / "c")
    by_iterator(D.range(3).map(lambda v: (v, str(v))).cache(name))
    reader = ArrayRecordReader(name + ".podkit_cache.array_record")
    records = reader.read(list(range(reader.num_records())))
    reader.close()
    assert len(records) == 4  # the header, then one record per element
    assert not any(r.startswith(b"\x80") for r in records)  # a pickle starts with PROTO


def test_a_cache_file_of_another_pipeline_is_refused(tmp_path):
    name = str(tmp_path / "c")
    by_iterator(D.range(4).cache(name))
    with pytest.raises(pk.errors.InputError, match=r"written by another pipeline.*"
                       r"[Dd]elete it, or pass cache\(\) another filename"):
        by_iterator(D.range(5).cache(name))
    assert by_iterator(D.range(4).cache(name)) == [0, 1, 2, 3]  # the same one still reads


def test_a_pickle_cache_file_is_refused_without_being_unpickled(tmp_path):
    import pickle

    from array_record.python.array_record_module import ArrayRecordWriter

    class Boom:
        def __reduce__(self):
            return (open, (str(tmp_path / "ran"), "w"))

    path = str(tmp_path / "c.podkit_cache.array_record")  # what an older podkit wrote
    writer = ArrayRecordWriter(path, "group_size:1")
    writer.write(pickle.dumps(Boom()))
    writer.close()
    with pytest.raises(pk.errors.InputError, match=r"c.podkit_cache.array_record' is not a "
                       r"podkit cache file.*delete it"):
        by_iterator(D.range(1).cache(str(tmp_path / "c")))
    assert not (tmp_path / "ran").exists()


def test_an_object_element_is_an_error_naming_its_type_and_leaves_no_file(tmp_path):
    class Point:
        pass

    name = str(tmp_path / "c")
    with pytest.raises(pk.errors.InputError, match=r"cache\(filename\) stores numpy arrays.*"
                       r"Point.*map the element to arrays first"):
        by_iterator(D.from_sequence([Point(), Point()]).cache(name))
    assert list(tmp_path.iterdir()) == []
    assert len(by_iterator(D.from_sequence([Point()]).cache())) == 1  # in memory: any object


def test_each_process_share_caches_to_its_own_file(tmp_path):
    name = str(tmp_path / "c")
    ds = D.range(8).batch(4).cache(name)
    assert by_iterator(ds.for_process(2, 0)) == [[0, 2], [4, 6]]
    assert by_iterator(ds.for_process(2, 1)) == [[1, 3], [5, 7]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "c.process-00000-of-00002.podkit_cache.array_record",
        "c.process-00001-of-00002.podkit_cache.array_record"]


def test_records_the_codec_cannot_carry_or_read_are_podkit_errors():
    from podkit.data import codec

    with pytest.raises(pk.InputError, match="an int beyond 64 bits"):
        codec.encode({"a": 2**70})  # not a RecursionError
    good = codec.encode({"a": np.arange(3)})
    for damaged in (good[:5], b"\xc1", codec.encode([1])[:0] + b"\x92\xa1z\x01"):
        with pytest.raises(pk.DataError, match="damaged or was not written by podkit"):
            codec.decode(damaged)
