"""Cache: the first pass kept, with random access whatever the parent."""

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
    # a new pipeline whose elements would differ reads the file, not its parent
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
