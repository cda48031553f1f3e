"""Zip and Concatenate."""

import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset
INF, UNKNOWN = pk.data.INFINITE_CARDINALITY, pk.data.UNKNOWN_CARDINALITY


def test_zip_is_as_long_as_the_shortest_and_keeps_the_structure():
    ds = D.zip({"a": D.range(5), "b": D.range(10, 13)})
    assert ds.cardinality() == 3 and ds.plan.random_access
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds)
    assert by_iterator(ds)[1] == {"a": 1, "b": 11}
    assert set(ds.element_spec) == {"a", "b"}
    assert ds.plan.describe() == "zip(structure={'a': None, 'b': None})|"
    assert D.zip((D.range(2).repeat(), D.range(4))).cardinality() == 4
    assert D.zip((D.range(2).repeat(), D.range(4).repeat())).cardinality() == INF
    assert D.zip((D.range(2), D.range(4).filter(bool))).cardinality() == UNKNOWN


def test_concatenate_one_after_the_other():
    ds = D.range(3).concatenate(D.range(10, 12))
    assert ds.cardinality() == 5
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds) == [0, 1, 2, 10, 11]
    assert D.range(3).concatenate(D.range(2).repeat()).cardinality() == INF
    stream = D.range(3).filter(bool).concatenate(D.range(2))
    assert by_iterator(stream) == [1, 2, 0, 1] and stream.cardinality() == UNKNOWN


def test_neither_splits_across_processes():
    with pytest.raises(pk.errors.InputError, match=r"found concatenate\(\)"):
        D.range(4).batch(2).concatenate(D.range(4).batch(2)).for_process(2, 0)
    with pytest.raises(pk.errors.InputError, match=r"found zip\(\)"):
        D.zip((D.range(4).batch(2), D.range(4).batch(2))).for_process(2, 0)
