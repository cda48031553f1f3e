"""Interleave: datasets made from elements, read in turn."""

import pytest
from op_checks import by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


def inner(n):
    return D.range(n).map(lambda v: v * 10 + n)


def test_tf_data_order_and_unknown_length():
    ds = D.range(1, 4).interleave(inner, cycle_length=2, block_length=2)
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY and not ds.plan.random_access
    assert by_own_stream(ds.plan) == by_iterator(ds) == [1, 2, 12, 3, 13, 23]
    assert ds.plan.describe() == ("interleave(block=2, cycle=2, deterministic=None, "
                                  "fn=inner, parallel=None)|")


def test_read_ahead_gives_the_same_order():
    plain = D.range(1, 6).interleave(inner, cycle_length=3)
    ahead = D.range(1, 6).interleave(inner, cycle_length=3, num_parallel_calls=3)
    assert by_iterator(ahead) == by_iterator(plain)


def test_the_function_must_return_a_dataset():
    ds = D.range(3).interleave(lambda n: [n])
    with pytest.raises(pk.errors.InputError, match="returned a list; it must return a "
                                                   "pk.data.Dataset"):
        by_iterator(ds)
    with pytest.raises(pk.errors.InputError, match=r"found interleave\(\)"):
        D.range(3).batch(2).interleave(lambda b: D.range(1)).for_process(2, 0)
