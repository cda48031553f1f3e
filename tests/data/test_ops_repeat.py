"""Repeat: each repetition is a new path, so shuffles below reshuffle."""

import numpy as np
import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


@pytest.mark.parametrize("count, expect", [(None, pk.data.INFINITE_CARDINALITY), (0, 0),
                                           (3, 12)])
def test_cardinality(count, expect):
    assert D.range(4).repeat(count).cardinality() == expect
    assert D.range(0).repeat(count).cardinality() == 0
    assert D.range(4).filter(bool).repeat(3).cardinality() == pk.data.UNKNOWN_CARDINALITY


def test_repetitions_reshuffle_and_both_forms_agree():
    ds = D.range(6).shuffle(6, seed=2).repeat(3)
    out = by_iterator(ds)
    assert by_index(ds.plan) == by_own_stream(ds.plan) == out
    epochs = [out[i:i + 6] for i in (0, 6, 12)]
    assert all(sorted(e) == list(range(6)) for e in epochs) and epochs[0] != epochs[1]


def test_repeat_passes_batches_and_splits_below():
    ds = D.range(8).batch(4, drop_remainder=False).repeat(2)
    assert ds.element_spec.shape == (None,)
    share = ds.for_process(2, 0)
    assert share.cardinality() == 4 and by_iterator(share)[:2] == [[0, 2], [4, 6]]
    assert ds.plan.describe() == "repeat(count=2)|"


def test_epoch_rows_of_a_staged_plan():
    ds = D.from_tensor_slices(np.arange(10)).shuffle(10, seed=1).batch(5)
    plan = ds.in_memory_plan()
    assert plan.batch_size == 5
    assert sorted(plan.epoch_rows(0).tolist()) == list(range(10))
    assert plan.epoch_rows(0).tolist() != plan.epoch_rows(1).tolist()
