"""fit() with a pk.data.Dataset: same training as arrays, per-process shares, input wait."""

import json

import numpy as np
import pytest

import podkit as pk
from helpers import StepLosses, seed_model
from podkit.train.feeds import dataset_input

D = pk.data.Dataset


def test_fit_on_a_dataset_equals_fit_on_arrays(digits):
    (x, y), _ = digits
    losses = []
    for source in ("arrays", "dataset", "mapped"):  # staged rows, and the iterator path
        model = seed_model()
        rec = StepLosses()
        if source == "arrays":
            model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0, callbacks=[rec],
                      log_every=1, seed=0)
        else:
            ds = D.from_tensor_slices((x, y))
            if source == "mapped":
                ds = ds.map(lambda a, b: (a, b))
            ds = ds.batch(64).prefetch(pk.data.AUTOTUNE)
            model.fit(ds, epochs=2, verbose=0, callbacks=[rec], log_every=1, seed=0)
        losses.append(rec.losses)
    assert len(losses[0]) == 2 * 23
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    np.testing.assert_allclose(losses[0], losses[2], rtol=1e-5)


def test_fit_converges_and_logs_input_wait(digits, tmp_path):
    (x, y), (vx, vy) = digits
    ds = (D.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
          .map(lambda a, b: (a.astype(np.float32), b)).batch(32))
    val = D.from_tensor_slices((vx, vy)).batch(128)
    with pk.DataParallel().scope():
        model = seed_model(steps_per_execution=8)
    history = model.fit(ds, epochs=6, validation_data=val, verbose=0, log_every=15,
                        run_dir=tmp_path)
    assert history.history["val_accuracy"][-1] > 0.93
    waits = history.history["input_wait"]
    assert len(waits) == 6 and all(0.0 <= w <= 1.0 for w in waits)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert all(0.0 <= r["input_wait"] <= 1.0 for r in records if "input_wait" in r)
    assert model.evaluate(val, verbose=0, return_dict=True)["accuracy"] > 0.93
    assert model.predict(D.from_tensor_slices(vx).batch(120)).shape == (len(vx), 10)


def test_unknown_length_runs_one_pass_per_epoch(digits):
    (x, y), _ = digits
    ds = D.from_tensor_slices((x, y)).filter(lambda a, b: b != 3).batch(50)
    history = seed_model().fit(ds, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


@pytest.mark.parametrize("n, batch, processes", [(9, 4, 2), (100, 12, 4), (37, 6, 3),
                                                 (64, 8, 2)])
def test_process_shares_are_disjoint_and_cover_every_batch(n, batch, processes):
    ds = D.range(n).shuffle(n, seed=3).batch(batch)
    reference = [set(b.tolist()) for b in ds._iterator(workers=False)]
    ds = D.range(n).shuffle(n, seed=3).batch(batch)  # a fresh iteration counter
    shares = []
    for p in range(processes):
        local, steps = dataset_input(ds, None, training=False, process=(processes, p))
        assert steps == len(reference)
        shares.append(list(local))
    seen = []
    for k, expected in enumerate(reference):
        got = set()
        for share in shares:
            b = share[k]
            if isinstance(b, tuple):  # a top-up batch: weight 0, no examples
                assert not b[2].any()
                continue
            got |= set(b.tolist())
            seen.extend(b.tolist())
        assert got == expected
    assert sorted(seen) == list(range(n))  # every element exactly once


@pytest.mark.parametrize("drop", [False, True])
def test_in_memory_plans_are_staged_in_the_datasets_order(drop):
    """from_tensor_slices -> shuffle/take/shard -> batch is fed like arrays (row ids only),
    and the rows of every epoch are those the Dataset's own iterator yields."""
    from podkit.train.feeds import InMemoryDatasetFeed, make_feed

    n = 203
    ids = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 4), np.float32)
    y = np.arange(n) % 10
    make = lambda: (D.from_tensor_slices((ids, y)).shuffle(64, seed=3).skip(5).shard(2, 1)
                    .batch(16, drop_remainder=drop).prefetch(2))
    strategy = pk.DataParallel()
    feed = make_feed(make(), strategy=strategy, training=True, steps_per_execution=4)
    assert isinstance(feed, InMemoryDatasetFeed) and feed.staged
    expected = make().repeat()._iterator(workers=False)
    for epoch in range(3):
        rows = feed._step_rows(epoch)
        assert rows.shape == (len(make()), 16)
        for r in rows:
            batch_x, _ = next(expected)
            np.testing.assert_array_equal(r[r >= 0], batch_x[:, 0].astype(int))
    # a map in the plan: fed through the general iterator path instead
    mapped = make().map(lambda a, b: (a * 2, b))
    assert not isinstance(make_feed(mapped, strategy=strategy, training=True),
                          InMemoryDatasetFeed)


def test_a_sequential_takes_a_datasets_one_input_as_a_dict_or_a_tuple():
    """Keras takes {"name": x}, [x] and (x,) for a one-input model, from arrays and from a
    Dataset alike (a Dataset's batches used to reach the first layer as the dict)."""
    x = np.random.default_rng(0).normal(size=(32, 4, 4, 3)).astype(np.float32)
    y = np.arange(32) % 4
    for wrap in (lambda a: {"image": a}, lambda a: (a,)):
        model = pk.Sequential([pk.layers.Flatten(), pk.layers.Dense(4)])
        model.compile(optimizer="sgd",
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        ds = pk.data.Dataset.from_tensor_slices((wrap(x), y)).batch(8)
        history = model.fit(ds, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        np.testing.assert_allclose(model.predict(ds.map(lambda a, b: a), verbose=0),
                                   model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
