"""train/feeds/protocol.py: every feed make_feed returns is a Feed, and its methods do what the
loop, checkpointing and the model rely on."""

import numpy as np
import pytest

import podkit as pk
from podkit.train.feeds import (
    ArrayFeed,
    BatchFeed,
    DataPosition,
    Execution,
    Feed,
    InMemoryDatasetFeed,
    make_feed,
)


def _inputs():
    x = np.arange(48, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    y = np.arange(48) % 3
    return {
        "arrays": ((x, y), ArrayFeed, 6),
        "in_memory": ((pk.data.Dataset.from_tensor_slices((x, y)).batch(8), None),
                      InMemoryDatasetFeed, 6),
        # a plain iterable's epoch lasts until it ends
        "batches": (([(x[i:i + 8], y[i:i + 8]) for i in range(0, 48, 8)], None), BatchFeed,
                    None),
    }


@pytest.mark.parametrize("kind", ["arrays", "in_memory", "batches"])
def test_every_feed_is_a_feed(kind):
    (x, y), cls, steps = _inputs()[kind]
    feed = make_feed(x, y, strategy=pk.DataParallel(), training=True, batch_size=8 if y is not
                     None else None, shuffle=False)
    assert type(feed) is cls and isinstance(feed, Feed)
    assert feed.steps_per_epoch == steps and feed.source_s >= 0.0
    # first(): a few rows to build the model from, features and labels
    fx, fy = feed.first()
    assert fx.shape[1:] == (2,) and len(fx) == len(fy) > 0
    # check(): the model's check sees the data
    seen = []
    feed.check(lambda xs, ys: seen.append((np.shape(xs), np.shape(ys))))
    assert seen and seen[0][0][1:] == (2,)
    # epoch(): Executions, their steps and positions adding up to the epoch
    executions = list(feed.epoch(0))
    assert all(isinstance(e, Execution) for e in executions)
    assert sum(e.steps for e in executions) == 6
    assert sum(e.samples for e in executions) == 48
    assert executions[-1].position.stored() == {"epoch": 0, "execution": 6,
                                                "steps_in_epoch": 6}
    # resume(): the next epoch() starts there
    feed.resume(DataPosition(1, 4, 4))
    rest = list(feed.epoch(1))
    assert [e.position.execution for e in rest] == [5, 6]
    # close(): idempotent, and the feed can be read again after it
    feed.close()
    feed.close()
    assert len(list(feed.epoch(2))) == 6
    feed.close()


def test_inputs_without_labels_are_fed_with_placeholder_labels():
    """predict() feeds: arrays get zero labels (the step's shapes stay one); a batch feed
    reports no labels from first() and the model's check decides what to ignore."""
    x = np.ones((16, 2), np.float32)
    arrays = make_feed(x, strategy=pk.DataParallel(), training=False, with_labels=False,
                       batch_size=8)
    seen = []
    arrays.check(lambda xs, ys: seen.append(ys))
    np.testing.assert_array_equal(seen[0], np.zeros(16))
    batches = make_feed(iter([x[:8], x[8:]]), strategy=pk.DataParallel(), training=False,
                        with_labels=False)
    assert isinstance(batches, BatchFeed) and batches.first()[1] is None
    executions = list(batches.epoch(0))
    assert [float(np.asarray(e.inputs.y).sum()) for e in executions] == [0.0, 0.0]
    batches.close()


def test_make_feed_refuses_what_no_feed_takes():
    with pytest.raises(pk.InputError, match="no data"):
        make_feed(None, strategy=pk.DataParallel(), training=True)
    with pytest.raises(pk.InputError, match="neither arrays nor an iterable"):
        make_feed(3.5, strategy=pk.DataParallel(), training=True)
    with pytest.raises(pk.InputError, match="y must be None"):
        make_feed([(np.zeros((8, 2)), np.zeros(8))], np.zeros(8), strategy=pk.DataParallel(),
                  training=True)
