"""train/feeds/batches.py, datasets.py and prefetch.py: iterables of batches stacked k at a time
in order, the short batch padded and masked, the data position, and the prefetch thread."""

import threading
import time

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.train.feeds import BatchFeed, BatchInputs, DataPosition, make_feed, prefetch


def _batches(n_batches, size=8, last=None):
    out = []
    for b in range(n_batches):
        m = last if (last is not None and b == n_batches - 1) else size
        start = b * size
        out.append((np.arange(start, start + m, dtype=np.float32)[:, None] * np.ones((1, 2)),
                    np.arange(start, start + m) % 3))
    return out


def test_batches_are_stacked_k_at_a_time_in_order_with_the_short_one_masked():
    feed = make_feed(_batches(5, last=3), strategy=pk.DataParallel(), training=True,
                     steps_per_execution=2)
    assert isinstance(feed, BatchFeed)
    executions = list(feed.epoch(0))
    assert [e.steps for e in executions] == [2, 2, 1]
    assert all(isinstance(e.inputs, BatchInputs) for e in executions)
    xs = np.concatenate([np.asarray(e.inputs.x)[..., 0].reshape(-1) for e in executions])
    mask = np.concatenate([np.asarray(e.inputs.mask).reshape(-1) for e in executions])
    np.testing.assert_array_equal(xs[mask > 0], np.arange(35))  # every example once, in order
    assert mask.sum() == 35 and sum(e.samples for e in executions) == 35
    assert [e.position for e in executions] == [
        DataPosition(0, 1, 2), DataPosition(0, 2, 4), DataPosition(0, 3, 5)]
    feed.close()


def test_a_list_is_read_again_each_epoch_and_a_resume_skips_what_was_taken():
    feed = make_feed(_batches(4), strategy=pk.DataParallel(), training=True)
    first = [np.asarray(e.inputs.x) for e in feed.epoch(0)]
    feed.resume(DataPosition(epoch=1, execution=1, steps_in_epoch=1))
    again = list(feed.epoch(1))
    assert len(again) == 3 and again[0].position == DataPosition(1, 2, 2)
    for a, b in zip(first[1:], again, strict=True):
        np.testing.assert_array_equal(a, np.asarray(b.inputs.x))


def test_a_pk_data_iterator_state_is_the_position_and_resumes_exactly():
    def make():
        ds = pk.data.Dataset.from_tensor_slices(
            (np.arange(64, dtype=np.float32)[:, None], np.arange(64) % 2))
        return ds.shuffle(64, seed=1).map(lambda x, y: (x * 1.0, y)).batch(8)

    kw = dict(strategy=pk.DataParallel(), training=True, steps_per_execution=1)
    feed = make_feed(make(), **kw)
    run = list(feed.epoch(0))
    feed.close()
    assert all(e.position.iterator is not None for e in run)
    at = run[2].position
    other = make_feed(make(), **kw)
    other.resume(at)
    rest = list(other.epoch(0))
    other.close()
    assert len(rest) == len(run) - 3
    for a, b in zip(run[3:], rest, strict=True):
        np.testing.assert_array_equal(np.asarray(a.inputs.x), np.asarray(b.inputs.x))
        assert b.position.execution == a.position.execution


def test_prefetch_keeps_the_order_and_runs_ahead_on_its_thread():
    threads = set()

    def place(i):
        threads.add(threading.current_thread().name)
        return i * 10

    assert list(prefetch(iter(range(7)), place, depth=2)) == [0, 10, 20, 30, 40, 50, 60]
    assert threads == {"podkit-prefetch"}


def test_prefetch_hands_an_error_to_the_consumer_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise ValueError("source broke")

    out = prefetch(items(), lambda i: i)
    assert next(out) == 1 and next(out) == 2
    with pytest.raises(ValueError, match="source broke"):
        next(out)


def test_a_consumer_that_stops_early_ends_the_source_through_on_stop():
    stopped = threading.Event()

    def endless():
        i = 0
        while not stopped.is_set():
            yield i
            i += 1
            time.sleep(0.001)

    out = prefetch(endless(), lambda i: i, on_stop=stopped.set)
    assert next(out) == 0
    out.close()
    assert stopped.is_set()


def test_a_batch_that_grows_is_refused():
    feed = make_feed([_batches(1)[0], _batches(2, size=16)[1]], strategy=pk.DataParallel(),
                     training=True)
    with pytest.raises(pk.InputError, match="more than the first batch"):
        list(feed.epoch(0))
    feed.close()


def test_several_processes_need_steps_per_epoch(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(pk.ConfigError, match="steps_per_epoch"):
        BatchFeed(_batches(2), steps_per_execution=1, steps_per_epoch=None,
                  batch_sharding=pk.DataParallel().batch_sharding(leading=1))


def test_large_groups_are_stacked_on_the_devices_as_a_host_stack_would_be():
    """k large batches go over one by one and are stacked on the devices (no host copy into
    fresh pages); the result is the host stack's values, dtype and sharding, for k = 1 too."""
    import ml_dtypes

    from podkit.train.feeds import placement

    rng = np.random.default_rng(0)
    rows = 8  # 8 x 192 x 1024 bfloat16: 3 MB a batch; a group of 4 on the devices, of 2 not
    batches = [(rng.normal(size=(rows, 192, 1024)).astype(ml_dtypes.bfloat16),
                np.arange(rows) + 100 * b) for b in range(6)]
    assert 4 * batches[0][0].nbytes >= placement.DEVICE_STACK_BYTES > 2.1 * batches[0][0].nbytes
    for k in (4, 1):
        feed = make_feed(batches, strategy=pk.DataParallel(), training=True,
                         steps_per_execution=k)
        executions = list(feed.epoch(0))
        assert [e.steps for e in executions] == ([4, 2] if k == 4 else [1] * 6)
        x = np.concatenate([np.asarray(e.inputs.x) for e in executions])
        y = np.concatenate([np.asarray(e.inputs.y) for e in executions])
        assert x.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(x.view(np.uint16),
                                      np.stack([b[0] for b in batches]).view(np.uint16))
        np.testing.assert_array_equal(y, np.stack([b[1] for b in batches]))
        for e in executions:  # the feed's sharding whichever side stacked them
            assert e.inputs.x.sharding == e.inputs.mask.sharding == e.inputs.y.sharding
            assert len(e.inputs.x.sharding.device_set) == jax.device_count()
        feed.close()


def _counting(batches):
    """An endless generator of `batches` in turn, counting what it has given."""
    pulled = []

    def gen():
        i = 0
        while True:
            pulled.append(i)
            yield batches[i % len(batches)]
            i += 1

    return gen(), pulled


def test_the_read_ahead_goes_on_into_the_next_epoch_only_when_one_follows():
    it, pulled = _counting(_batches(3))
    feed = make_feed(it, strategy=pk.DataParallel(), training=True, steps_per_execution=2,
                     steps_per_epoch=4)
    assert len(list(feed.epoch(0, more=True))) == 2
    deadline = time.monotonic() + 10
    while len(pulled) < 6 and time.monotonic() < deadline:  # epoch 1's first execution
        time.sleep(0.01)
    assert len(pulled) >= 6, "epoch 1's batches were not read before it began"
    second = list(feed.epoch(1, more=False))  # the last epoch: it continues the same stream
    assert [e.position for e in second] == [DataPosition(1, 1, 2), DataPosition(1, 2, 4)]
    xs = np.concatenate([np.asarray(e.inputs.x)[..., 0].reshape(-1) for e in second])
    np.testing.assert_array_equal(xs, np.concatenate([np.arange(8, 24), np.arange(16)]))
    time.sleep(0.3)
    assert len(pulled) == 8  # nothing read past the last epoch
    feed.close()


def test_fit_reads_the_next_epochs_first_batches_before_it_begins():
    it, pulled = _counting(_batches(5))
    seen = {}

    class Probe(pk.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            deadline = time.monotonic() + 10
            while len(pulled) <= 4 * epoch and time.monotonic() < deadline:
                time.sleep(0.01)
            seen[epoch] = len(pulled)

    model = pk.Sequential([pk.layers.Dense(3)])
    model.compile(optimizer="sgd", steps_per_execution=2,
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(it, steps_per_epoch=4, epochs=3, verbose=0, callbacks=[Probe()])
    assert seen[1] > 4 and seen[2] > 8, seen
    assert len(pulled) == 12  # the fit's 3 x 4 batches, none beyond
