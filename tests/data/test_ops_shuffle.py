"""Shuffle: a permutation with random access, a buffer shuffle as a stream."""

import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


def test_shuffle_is_a_seeded_permutation_new_each_iteration():
    ds = D.range(30).shuffle(30, seed=3)
    assert ds.cardinality() == 30 and ds.plan.random_access and ds.plan.varies()
    first, second = by_iterator(ds), by_iterator(ds)
    assert sorted(first) == sorted(second) == list(range(30)) and first != second
    assert by_index(ds.plan, (0,)) == first and by_index(ds.plan, (1,)) == second
    fixed = D.range(30).shuffle(30, seed=3, reshuffle_each_iteration=False)
    assert not fixed.plan.varies() and by_iterator(fixed) == by_iterator(fixed)


def test_a_small_buffer_keeps_elements_in_their_window():
    ds = D.range(40).shuffle(10, seed=1)
    out = by_iterator(ds)
    assert all(i // 10 == v // 10 for i, v in enumerate(out))  # windows of the buffer size


def test_the_stream_form_is_a_buffer_shuffle_of_the_same_elements():
    ds = D.range(25).shuffle(8, seed=4)
    stream = by_own_stream(ds.plan)
    assert sorted(stream) == list(range(25)) and stream != list(range(25))
    assert by_own_stream(ds.plan) == stream  # the seed and the path decide it
    on_stream = D.range(25).filter(lambda v: True).shuffle(8, seed=4)
    assert not on_stream.plan.random_access
    assert sorted(by_iterator(on_stream)) == list(range(25))


def test_shuffle_seeds_describe_and_split():
    ds = D.range(8).shuffle(8, seed=5).batch(4)
    assert ds.plan.parent.describe() == ("shuffle(auto_seed=False, buffer=8, reshuffle=True, "
                                         "seed=5)|")
    assert "seed=None" in D.range(8).shuffle(8).plan.describe()  # drawn: not in the fingerprint
    share = ds.for_process(2, 0)
    assert share.plan.parent.name == "shard" and share.plan.parent.parent.name == "shuffle"
    assert share.shuffle_seeds() == [5]
    with pytest.raises(pk.errors.ConfigError, match="seed=-1"):
        D.range(3).shuffle(3, seed=-1)
