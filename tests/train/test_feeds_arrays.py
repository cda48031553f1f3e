"""train/feeds/arrays.py and staging.py: in-memory arrays staged on the devices (row ids per
execution), the staging cache's hits and misses, host batches when over budget, conversions."""

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.train.feeds import (
    ArrayFeed,
    BatchInputs,
    DataPosition,
    StagedInputs,
    StagingCache,
    as_arrays,
    class_weights,
    global_batch,
    make_feed,
)


def _arrays(n=50):
    x = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    return x, np.arange(n) % 4


def test_staged_arrays_ship_row_ids_and_report_their_position():
    x, y = _arrays(50)
    feed = make_feed(x, y, strategy=pk.DataParallel(), training=True, batch_size=16,
                     steps_per_execution=2, shuffle=False)
    assert isinstance(feed, ArrayFeed) and feed.staged and feed.steps_per_epoch == 4
    executions = list(feed.epoch(0))
    assert [e.steps for e in executions] == [2, 2]
    assert all(isinstance(e.inputs, StagedInputs) for e in executions)
    assert executions[0].inputs.steps == 2 and executions[0].inputs.idx.shape == (2, 16)
    # every row once, in order (no shuffle); the padding of the last batch is -(r + 1)
    ids = np.concatenate([np.asarray(e.inputs.idx).reshape(-1) for e in executions])
    np.testing.assert_array_equal(ids[:50], np.arange(50))
    assert (ids[50:] < 0).all() and sum(e.samples for e in executions) == 50
    assert [e.position for e in executions] == [DataPosition(0, 1, 2), DataPosition(0, 2, 4)]
    # both executions share the one staged copy of the data
    assert executions[0].inputs.data is executions[1].inputs.data
    np.testing.assert_array_equal(np.asarray(executions[0].inputs.data["x"]), x)


def test_the_next_epochs_order_made_early_is_the_order_it_would_have():
    # An epoch's generator makes the next epoch's row ids after its last execution (while
    # the devices still run it): they must be the ones a fresh feed makes for that epoch,
    # across passes (steps_per_epoch 5 of a 4-step pass) and after a resume in between.
    x, y = _arrays(64)
    kw = dict(strategy=pk.DataParallel(), training=True, batch_size=16,
              steps_per_execution=1, seed=3, steps_per_epoch=5)

    def ids(feed, epoch):
        return np.stack([np.asarray(e.inputs.idx) for e in feed.epoch(epoch)])

    fresh = {e: ids(make_feed(x, y, **kw), e) for e in range(4)}
    assert not np.array_equal(fresh[1], fresh[2])  # shuffled anew
    feed = make_feed(x, y, **kw)
    for e in range(3):
        np.testing.assert_array_equal(ids(feed, e), fresh[e])
    feed.resume(DataPosition(epoch=1, execution=2, steps_in_epoch=2))  # back, not on
    np.testing.assert_array_equal(ids(feed, 1), fresh[1][2:])
    np.testing.assert_array_equal(ids(feed, 3), fresh[3])  # not the one made after 1


def test_a_resumed_epoch_starts_where_the_position_says_and_counts_on():
    x, y = _arrays(64)
    feed = make_feed(x, y, strategy=pk.DataParallel(), training=True, batch_size=8,
                     steps_per_execution=1, seed=5)
    whole = [np.asarray(e.inputs.idx) for e in feed.epoch(1)]
    feed.resume(DataPosition(epoch=1, execution=3, steps_in_epoch=3))
    resumed = list(feed.epoch(1))
    assert len(resumed) == 5
    for a, b in zip(whole[3:], resumed, strict=True):
        np.testing.assert_array_equal(a, np.asarray(b.inputs.idx))
    assert resumed[0].position == DataPosition(1, 4, 4)
    assert resumed[-1].position == DataPosition(1, 8, 8)
    assert len(list(feed.epoch(2))) == 8  # the resume applied once


def test_the_staging_cache_hits_on_the_same_contents_and_misses_on_a_change():
    x, y = _arrays(40)
    cache = StagingCache()
    sharding = pk.DataParallel().replicated()
    first = cache.stage("train", {"x": x, "y": y}, sharding)
    assert cache.stage("train", {"x": x.copy(), "y": y.copy()}, sharding) is first
    assert (cache.hits, cache.misses) == (1, 1)
    x[0, 0] = -1.0  # a change in place is seen
    changed = cache.stage("train", {"x": x, "y": y}, sharding)
    assert changed is not first and (cache.hits, cache.misses) == (1, 2)
    assert float(changed["x"][0, 0]) == -1.0
    cache.stage("validation", {"x": x[:8], "y": y[:8]}, sharding)
    assert set(cache._slots) == {"train", "validation"}
    cache.release("train")
    assert set(cache._slots) == {"validation"}


def test_the_staging_budget_evicts_the_least_recently_used():
    a, b = np.ones((10, 10), np.float32), np.zeros((10, 10), np.float32)
    cache = StagingCache(budget=a.nbytes + b.nbytes // 2)
    sharding = pk.DataParallel().replicated()
    cache.stage("train", a, sharding)
    cache.stage("validation", b, sharding)
    assert list(cache._slots) == ["validation"]


def test_two_feeds_of_one_model_reuse_the_staged_copy():
    x, y = _arrays(32)
    cache = StagingCache()
    kw = dict(strategy=pk.DataParallel(), training=True, batch_size=8, cache=cache)
    one = next(iter(make_feed(x, y, **kw).epoch(0))).inputs.data
    two = next(iter(make_feed(x, y, **kw).epoch(0))).inputs.data
    assert one is two and (cache.hits, cache.misses) == (1, 1)


def test_arrays_over_the_budget_are_cut_on_the_host_with_a_mask():
    x, y = _arrays(20)
    w = np.linspace(0.5, 1.5, 20).astype(np.float32)
    feed = make_feed(x, y, strategy=pk.DataParallel(), training=False, batch_size=8,
                     sample_weight=w, cache=StagingCache(budget=0))
    assert not feed.staged
    executions = list(feed.epoch(0))
    inputs = executions[-1].inputs
    assert isinstance(inputs, BatchInputs) and inputs.steps == 1
    assert inputs.x.shape == (1, 8, 3) and inputs.mask.shape == (1, 8)
    np.testing.assert_array_equal(np.asarray(inputs.mask)[0], [1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_allclose(np.asarray(inputs.sw)[0, :4], w[16:])
    assert float(np.asarray(inputs.sw)[0, 4:].sum()) == 0.0
    assert sum(e.samples for e in executions) == 20


def test_conversions_and_checks_of_what_the_user_passed():
    assert as_arrays([[1, 2], [3, 4]], "x").shape == (2, 2)
    with pytest.raises(pk.InputError, match="ragged"):
        as_arrays([[1, 2], [3]], "x")
    with pytest.raises(pk.InputError, match="strings"):
        as_arrays(np.array(["a", "b"]), "y")
    np.testing.assert_array_equal(class_weights(np.array([0, 1, 1]), {1: 2.0}), [1, 2, 2])
    np.testing.assert_array_equal(class_weights(np.eye(3)[[2, 0]], {2: 3.0}), [3, 1])
    assert global_batch(None, 8, None) == 32
    assert global_batch(30, 8, "pad") == 32 and global_batch(30, 8, "drop") == 24
    with pytest.raises(pk.InputError, match="not divisible"):
        global_batch(30, 8, None)
    with pytest.raises(pk.InputError, match="x has 4 examples but y has 3"):
        make_feed(np.zeros((4, 2)), np.zeros(3), strategy=pk.DataParallel(), training=True)


def test_staged_inputs_are_a_pytree_of_their_arrays():
    inputs = StagedInputs({"x": np.zeros((4, 2)), "y": np.zeros(4)}, np.zeros((1, 4), np.int32))
    leaves, tree = jax.tree.flatten(inputs)
    assert len(leaves) == 3
    assert jax.tree.unflatten(tree, leaves).idx is leaves[-1]
    batch = BatchInputs(np.zeros((2, 4, 3)), np.zeros((2, 4)), np.ones((2, 4)), np.ones((2, 4)))
    assert len(jax.tree.leaves(batch)) == 4 and batch.steps == 2


def test_staged_arrays_take_the_layout_xla_picks_for_gathering_rows(monkeypatch):
    """On a TPU the staged arrays are laid out for the steps' row gather (asked of XLA with
    Layout.AUTO); CPU's default layout is already that one, so here the same path runs by
    adding the platform, and must keep the values, hit the cache and train."""
    from podkit.train.feeds import staging

    x = np.random.default_rng(0).standard_normal((64, 4, 4, 3)).astype(np.float32)
    y = np.arange(64) % 3
    sharding = pk.DataParallel().replicated()
    assert staging.gather_format(x.shape, x.dtype, sharding, 8) is None  # CPU: not asked
    assert staging.gather_format((64,), y.dtype, sharding, 8) is None  # one dim: no choice
    monkeypatch.setattr(staging, "RELAYOUT_PLATFORMS", {"tpu", "cpu"})
    fmt = staging.gather_format(x.shape, x.dtype, sharding, 8)
    assert fmt is not None and fmt.layout.major_to_minor[0] == 0  # rows outermost
    cache = StagingCache()
    placed = cache.stage("train", {"x": x, "y": y}, sharding, rows=8)
    assert placed["x"].format == fmt
    np.testing.assert_array_equal(np.asarray(placed["x"]), x)
    assert cache.stage("train", {"x": x, "y": y}, sharding, rows=8) is placed
    model = pk.Sequential([pk.layers.Flatten(), pk.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=pk.losses.SparseCategoricalCrossentropy(
        from_logits=True), steps_per_execution=2)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
