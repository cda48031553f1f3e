"""Bad input gets an error that names the value and the fix, before anything runs where it
can; a failing map function reaches the consumer with its element and traceback."""

import time

import numpy as np
import pytest

import podkit as pk
from helpers import assert_gone, seed_model, workers_of

D = pk.data.Dataset


def fails_on_13(x):
    if x == 13:
        raise ValueError(f"cannot decode record {x}")
    return x


def test_mismatched_leading_dims_name_the_shapes():
    with pytest.raises(pk.InputError, match=r"leading dims.*\(5, 3\).*\(4,\)"):
        D.from_tensor_slices((np.zeros((5, 3)), np.zeros(4)))


def test_missing_files_name_the_pattern(tmp_path):
    with pytest.raises(pk.InputError, match="no file matches .*nothing-\\*.txt"):
        pk.data.TextLineDataset(str(tmp_path / "nothing-*.txt"))
    with pytest.raises(pk.InputError, match="no file matches .*missing.array_record"):
        pk.data.ArrayRecordDataset([str(tmp_path / "missing.array_record")])


def test_not_an_array_record_file(tmp_path):
    bad = tmp_path / "x.array_record"
    bad.write_bytes(b"not an array record")
    with pytest.raises(pk.InputError, match="ArrayRecord"):
        pk.data.ArrayRecordDataset(str(bad))


def test_ragged_batch_suggests_padded_batch():
    ds = D.range(1, 4).map(lambda n: np.arange(n)).batch(3)
    with pytest.raises(pk.InputError, match="padded_batch"):
        list(ds)


def test_state_of_another_pipeline_is_refused():
    it = iter(D.range(10).shuffle(10, seed=1).batch(2))
    next(it)
    state = it.get_state()
    other = iter(D.range(10).shuffle(10, seed=1).batch(3))
    with pytest.raises(pk.InputError, match="different pipeline"):
        other.set_state(state)
    with pytest.raises(pk.InputError, match="not a state"):
        other.set_state({"index": 3})


@pytest.mark.parametrize("make, match", [
    (lambda: D.range(3).batch(0), "batch_size=0"),
    (lambda: D.range(3).shard(2, 2), "shard index=2"),
    (lambda: D.range(3).map(abs, num_parallel_calls=0), "num_parallel_calls=0"),
    (lambda: D.range(3).shuffle(0), "buffer_size=0"),
    (lambda: D.range(3).take(-5), "count=-5"),
    (lambda: D.range(3).map("abs"), "map needs a function"),
    (lambda: D.range(1, 2, 0), "step must not be 0"),
    (lambda: D.range(3).bucket_by_sequence_length(len, [5, 3], [1, 1, 1]),
     "bucket_boundaries"),
    (lambda: D.range(3).bucket_by_sequence_length(len, [3], [1]), "bucket_batch_sizes"),
])
def test_bad_arguments(make, match):
    with pytest.raises(pk.ConfigError, match=match):
        make()


def test_bad_pipelines_raise_when_iterated():
    with pytest.raises(pk.InputError, match="must return a pk.data.Dataset"):
        list(D.range(3).interleave(lambda x: [x]))
    with pytest.raises(pk.InputError, match="endless"):
        list(D.range(3).repeat().cache())
    with pytest.raises(pk.InputError, match="not bytes"):
        pk.data.write_array_record(D.range(3), "/tmp/podkit-never-written", 1)


def test_fit_rejects_what_cannot_work():
    model = seed_model()
    x = np.zeros((64, 8), np.float32)
    y = np.zeros(64, np.int32)
    ds = D.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(pk.ConfigError, match="steps_per_epoch"):
        model.fit(ds.repeat(), epochs=1, verbose=0)
    with pytest.raises(pk.InputError, match="batch_size does not apply"):
        model.fit(ds, batch_size=8, verbose=0)
    with pytest.raises(pk.ConfigError, match="not divisible by the 3 processes"):
        ds.for_process(3, 0)
    with pytest.raises(pk.InputError, match="batch the dataset last"):
        ds.unbatch().for_process(2, 0)


def test_map_error_reaches_the_consumer_with_index_and_traceback():
    ds = D.range(40).map(fails_on_13, num_parallel_calls=2).batch(4)
    it = iter(ds)
    start = time.monotonic()
    with pytest.raises(pk.DataError) as info:
        for _ in it:
            pass
    assert time.monotonic() - start < 60  # nothing hangs
    err = info.value
    assert err.index == 13
    assert "fails_on_13 raised ValueError: cannot decode record 13 on element 13" in str(err)
    assert 'raise ValueError(f"cannot decode record {x}")' in err.traceback
    assert it._stream is None  # the iterator closed itself ...
    assert_gone(workers_of())  # ... and its workers are gone


def test_sample_weight_beside_a_dataset_is_refused_not_ignored():
    model = seed_model()
    x = np.zeros((64, 8), np.float32)
    y = np.zeros(64, np.int32)
    ds = D.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(pk.InputError, match=r"sample_weight applies to arrays only.*"
                       r"\(x, y, sample_weight\)"):
        model.fit(ds, sample_weight=np.ones(64), verbose=0)
    with pytest.raises(pk.InputError, match="sample_weight applies to arrays only"):
        model.fit([(x[:16], y[:16])], sample_weight=np.ones(16), verbose=0)


def test_write_array_record_leaves_nothing_behind_on_error(tmp_path):
    def record(i):
        if i == 7:
            raise ValueError("cannot serialize 7")
        return b"%d" % i

    ds = D.range(10).map(record)
    with pytest.raises(pk.DataError, match="cannot serialize 7"):
        pk.data.write_array_record(ds, tmp_path / "out", num_shards=3)
    assert list(tmp_path.iterdir()) == []  # no .tmp file, no partial set of shards
    files = pk.data.write_array_record(D.range(10).map(lambda i: b"%d" % i), tmp_path / "ok", 3)
    assert [int(r) for r in pk.data.ArrayRecordDataset(files)] == list(range(10))


@pytest.mark.parametrize("bad", ["yes", 3, -1, None])
def test_verbose_values_outside_keras_are_refused(bad):
    model = seed_model()
    x, y = np.zeros((32, 8), np.float32), np.zeros(32, np.int32)
    for call in (lambda: model.fit(x, y, verbose=bad), lambda: model.evaluate(x, y, verbose=bad),
                 lambda: model.predict(x, verbose=bad)):
        with pytest.raises(pk.ConfigError, match=r"verbose=.*pass 0 \(silent\), 1"):
            call()


def test_verbose_is_honoured(capsys):
    model = seed_model()
    x, y = np.zeros((32, 8), np.float32), np.zeros(32, np.int32)
    model.fit(x, y, epochs=2, batch_size=8, verbose=2)
    out = capsys.readouterr().out
    assert out.count("Epoch 1/2") == 1 and out.count("Epoch 2/2") == 1 and "loss:" in out
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    model.evaluate(x, y, batch_size=8, verbose=0)
    model.predict(x, batch_size=8, verbose=0)
    assert capsys.readouterr().out == ""
    model.evaluate(x, y, batch_size=8)  # "auto", as in Keras: one line of results
    model.predict(x, batch_size=8, verbose=1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("evaluate ") and "loss: " in lines[0] and "accuracy: " in lines[0]
    assert lines[1].startswith("predict ") and "examples: 32" in lines[1]


@pytest.mark.parametrize("make, match", [
    (lambda: D.range(3).map(abs, deterministic="no"), "deterministic='no'"),
    (lambda: D.range(3).batch(2, num_parallel_calls=0), "num_parallel_calls=0"),
    (lambda: D.range(3).interleave(lambda x: D.range(x), deterministic=1), "deterministic=1"),
])
def test_parallelism_arguments_are_checked(make, match):
    with pytest.raises(pk.ConfigError, match=match):
        make()
