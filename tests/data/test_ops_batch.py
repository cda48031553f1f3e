"""Batch (batch, padded_batch), Unbatch and Bucket."""

import numpy as np
import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


@pytest.mark.parametrize("drop", [False, True])
def test_batch_length_spec_and_both_forms(drop):
    ds = D.range(10).batch(4, drop_remainder=drop)
    assert ds.cardinality() == (2 if drop else 3)
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds)
    assert by_iterator(ds)[-1] == ([4, 5, 6, 7] if drop else [8, 9])
    assert ds.element_spec.shape == ((4,) if drop else (None,))
    assert ds.prefetch(2).take(1).element_spec.shape == ds.element_spec.shape  # seen through
    assert ds.map(lambda b: b).element_spec.shape == (4,)  # a map may change the batch


def test_batch_for_process_shards_below_and_divides_the_batch():
    ds = D.range(12).map(lambda v: v * 10).batch(4)
    shares = [ds.for_process(2, p) for p in range(2)]
    assert [s.cardinality() for s in shares] == [3, 3]
    assert shares[0].plan.parent.name == "shard" and shares[0].plan.size == 2
    merged = [sorted(a + b) for a, b in zip(*(by_iterator(s) for s in shares), strict=True)]
    assert merged == by_iterator(ds)
    with pytest.raises(pk.errors.ConfigError, match="batch size 4 is not divisible by the 3"):
        ds.for_process(3, 0)


def test_padded_batch_pads_and_describes_its_padding():
    ds = D.range(1, 5).map(lambda n: np.arange(n)).padded_batch(2, padding_values=-1)
    assert ds.plan.name == "padded_batch" and not ds.plan.stacks
    assert by_index(ds.plan) == by_own_stream(ds.plan) == by_iterator(ds)
    assert by_iterator(ds)[0] == [[0, -1], [0, 1]]
    assert "fn=pad(None,-1)" in ds.plan.describe()
    assert "parallel" not in ds.plan.describe()


def test_unbatch_is_a_stream_of_rows_that_resumes_inside_a_batch():
    ds = D.range(7).batch(3).unbatch()
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY and not ds.plan.random_access
    assert by_own_stream(ds.plan) == by_iterator(ds) == list(range(7))
    it = ds._iterator(workers=False)
    for _ in range(4):
        next(it)
    again = ds._iterator(workers=False)
    again.set_state(it.get_state())
    assert [int(v) for v in again] == [4, 5, 6]


def test_bucket_groups_by_length():
    ds = D.range(1, 9).map(lambda n: np.arange(n)).bucket_by_sequence_length(
        len, [4], [2, 3])
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    batches = by_iterator(ds)
    assert [len(b) for b in batches] == [2, 3, 1, 2]
    assert batches[0] == [[0, 0], [0, 1]]  # padded to the longest of the batch
    assert ds.plan.describe().startswith("bucket(bounds=[4], drop=False, length_fn=len")
