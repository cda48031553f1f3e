"""Map and Filter."""

import numpy as np
import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


def square(x):
    return x * x


def test_map_keeps_random_access_length_and_order():
    ds = D.range(10).map(square)
    assert ds.plan.random_access and ds.cardinality() == 10
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds)
    assert by_iterator(ds) == [i * i for i in range(10)]
    assert ds.element_spec.dtype == np.int64
    assert ds.plan.describe() == "map(deterministic=None, fn=square, parallel=None)|"


def test_map_over_a_stream_is_a_stream():
    ds = D.from_generator(lambda: iter(range(4))).map(square)
    assert not ds.plan.random_access and ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    assert by_iterator(ds) == [0, 1, 4, 9]


def test_map_splits_below_itself():
    ds = D.range(8).batch(4).map(lambda b: b + 100)
    share = ds.for_process(2, 1)
    assert share.cardinality() == 2
    assert by_iterator(share) == [[101, 103], [105, 107]]


def test_filter_has_unknown_length_and_cannot_be_split_above():
    ds = D.range(10).filter(lambda x: x % 3 == 0)
    assert not ds.plan.random_access and ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    assert by_own_stream(ds.plan) == by_iterator(ds) == [0, 3, 6, 9]
    assert ds.plan.describe().startswith("filter(fn=")
    with pytest.raises(pk.errors.InputError, match=r"found filter\(\)"):
        ds.batch(2).filter(lambda b: True).for_process(2, 0)
