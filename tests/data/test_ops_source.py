"""Source (tensor slices, range, sequence, text, ArrayRecord) and Generator."""

import numpy as np
import pytest
from op_checks import by_index, by_iterator, by_own_stream

import podkit as pk

D = pk.data.Dataset


def test_slices_and_range_have_random_access_and_their_length():
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    ds = D.from_tensor_slices((x, np.arange(6)))
    assert ds.plan.random_access and ds.cardinality() == 6
    assert by_index(ds.plan) == by_iterator(ds)
    assert by_iterator(ds)[2] == ([4.0, 5.0], 2)
    spec = ds.element_spec
    assert spec[0].shape == (2,) and spec[0].dtype == np.float32 and spec[1].shape == ()
    r = D.range(3, 20, 4)
    assert r.cardinality() == 5 and by_iterator(r) == [3, 7, 11, 15, 19]
    assert r.plan.describe() == "range(source=Range[5])|"


def test_sequence_and_text_sources(tmp_path):
    seq = D.from_sequence([b"a", b"bc"])
    assert seq.cardinality() == 2 and by_iterator(seq) == [b"a", b"bc"]
    assert seq.plan.describe() == "sequence(source=[b'a', b'bc'])|"
    (tmp_path / "f.txt").write_text("one\ntwo\n")
    text = pk.data.TextLineDataset(str(tmp_path / "f.txt"))
    assert text.cardinality() == 2 and by_iterator(text) == [b"one", b"two"]
    assert text.plan.name == "text"


def test_sources_split_only_under_a_batch():
    with pytest.raises(pk.errors.InputError, match=r"found range\(\) above it"):
        D.range(8).for_process(2, 0)
    assert D.range(8).for_process(1, 0).cardinality() == 8


def test_generator_is_a_stream_of_unknown_length_that_replays_on_resume():
    ds = D.from_generator(lambda: iter(range(5)))
    assert not ds.plan.random_access
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    assert by_own_stream(ds.plan) == by_iterator(ds) == [0, 1, 2, 3, 4]
    assert ds.element_spec.shape == ()
    it = ds._iterator(workers=False)
    next(it), next(it)
    again = ds._iterator(workers=False)
    again.set_state(it.get_state())
    assert [int(v) for v in again] == [2, 3, 4]
