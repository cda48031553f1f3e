"""Take, Skip, Shard and Enumerate: ops decided by position."""

import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset
INF, UNKNOWN = pk.data.INFINITE_CARDINALITY, pk.data.UNKNOWN_CARDINALITY


@pytest.mark.parametrize("make, length, first", [
    (lambda d: d.take(4), 4, [0, 1, 2, 3]),
    (lambda d: d.take(-1), 10, list(range(10))),
    (lambda d: d.skip(7), 3, [7, 8, 9]),
    (lambda d: d.skip(-1), 0, []),
    (lambda d: d.shard(3, 1), 3, [1, 4, 7]),
    (lambda d: d.enumerate(5), 10, [(5, 0), (6, 1), (7, 2)]),
])
def test_random_access_and_stream_agree(make, length, first):
    ds = make(D.range(10))
    assert ds.cardinality() == length
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds)
    assert by_iterator(ds)[:3] == first[:3]


def test_cardinality_over_endless_and_unknown_parents():
    endless, unknown = D.range(3).repeat(), D.range(3).filter(bool)
    assert endless.take(5).cardinality() == 5 and endless.skip(2).cardinality() == INF
    assert endless.shard(2, 0).cardinality() == INF
    assert unknown.take(2).cardinality() == UNKNOWN and unknown.skip(1).cardinality() == UNKNOWN
    assert by_iterator(endless.shard(2, 1).take(3)) == [1, 0, 2]


def test_which_split_below_them():
    ds = D.range(16).batch(4)
    assert by_iterator(ds.take(2).for_process(2, 1)) == [[1, 3], [5, 7]]
    assert ds.enumerate().for_process(2, 0).cardinality() == 4
    with pytest.raises(pk.errors.InputError, match=r"found shard\(\) above it"):
        ds.shard(2, 0).for_process(2, 0)
    assert [n.describe() for n in (D.range(2).take(1).plan, D.range(2).shard(2, 1).plan)] == [
        "take(count=1)|", "shard(index=1, num=2)|"]
