"""Prefetch: read-ahead that never changes the elements."""

from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


def test_prefetch_changes_nothing_but_timing():
    base = D.range(20).shuffle(20, seed=3).batch(3)
    ds = base.prefetch(4)
    assert ds.cardinality() == base.cardinality() and ds.plan.random_access
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds) == by_iterator(base)
    assert ds.element_spec.shape == (None,)
    assert ds.plan.prefetch_buffer() == 4 and ds.plan.demand().prefetch == (4,)
    assert ds.plan.describe() == "prefetch(buffer=4)|"


def test_prefetch_over_a_stream_and_its_split():
    ds = D.range(10).filter(lambda v: v % 2).prefetch(pk.data.AUTOTUNE)
    assert by_iterator(ds) == [1, 3, 5, 7, 9]
    share = D.range(8).batch(4).prefetch(2).for_process(2, 0)
    assert share.plan.name == "prefetch" and by_iterator(share) == [[0, 2], [4, 6]]
