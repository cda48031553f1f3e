"""The loop's timeline (podkit.train.timeline): device-busy time from a thread that watches
executions finish, and the devices' idle time split by what the host was doing."""

import threading
import time

import jax
import jax.numpy as jnp
import pytest

from podkit.train import timeline as tl


def test_interval_arithmetic():
    assert tl._merge([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert tl._complement([(1, 2), (3, 4)], 0, 5) == [(0, 1), (2, 3), (4, 5)]
    assert tl._intersect([(0, 2), (3, 5)], [(1, 4)]) == [(1, 2), (3, 4)]
    assert tl._subtract([(0, 5)], [(1, 2), (3, 4)]) == [(0, 1), (2, 3), (4, 5)]
    assert tl._clip([(-1, 1), (2, 3), (4, 9)], 0, 5) == [(0, 1), (2, 3), (4, 5)]


def test_a_window_splits_wall_time_into_busy_and_idle_by_cause():
    """Each part of the split is the time the test measured for it, not a remainder: the
    host's intervals are the test's own clock readings, the execution runs until the test
    finishes it, and "other" is exactly the gaps the test left unlabelled (so a part
    claimed twice, or lost, would not add up to those)."""
    timeline = tl.Timeline()
    outputs = Outputs()
    t0 = timeline.cursor
    time.sleep(0.02)
    a = time.perf_counter()
    timeline.add("input", t0, a)  # waiting for input, devices idle
    time.sleep(0.02)  # Python nobody labelled: "other"
    b = time.perf_counter()
    middle, overlap_end = (t0 + a) / 2, (a + b) / 2
    timeline.add("checkpoint", middle, overlap_end)  # claims before input does
    with timeline.host("validation"):
        time.sleep(0.02)
    (v0, v1), = timeline.intervals["validation"]
    try:
        ex = timeline.dispatched(outputs, steps=1, samples=8)
        busy_from = time.perf_counter()
        time.sleep(0.02)
        timeline.add("input", busy_from, time.perf_counter())  # the devices were busy
    finally:
        outputs.finish()
    finished = timeline.finished(ex)
    split = timeline.window(finished)
    assert split["productive"] == pytest.approx(finished - ex.dispatched, abs=1e-9)
    assert split["checkpoint"] == pytest.approx(overlap_end - middle, abs=1e-9)
    assert split["input"] == pytest.approx(middle - t0, abs=1e-9)
    assert split["validation"] == pytest.approx(v1 - v0, abs=1e-9)
    assert split["compile"] == 0
    unlabelled = (b - overlap_end) + (v0 - b) + (ex.dispatched - v1)
    assert split["other"] == pytest.approx(unlabelled, abs=1e-9)
    assert split["other"] >= 0.01  # at least half the unlabelled sleep
    assert sum(split.values()) == pytest.approx(finished - t0, abs=1e-9)
    assert timeline.totals == split  # the first window: the totals are its parts
    assert timeline.executions == [] and timeline.cursor == finished  # forgotten once counted
    timeline.close()


def test_a_real_execution_is_busy_from_its_dispatch_to_its_finish():
    timeline = tl.Timeline()
    x = jnp.ones((512, 512))
    f = jax.jit(lambda x: x @ x @ x)
    f(x).block_until_ready()  # compiled before: only its run is timed
    out = f(x)
    ex = timeline.dispatched(out, steps=1, samples=512)
    finished = timeline.finished(ex)
    assert out.is_ready() and finished >= ex.dispatched
    split = timeline.window(finished)
    assert split["productive"] == pytest.approx(finished - ex.dispatched, abs=1e-9)
    assert split["compile"] > 0  # f's compile, on this thread, inside the window
    assert sum(split.values()) == pytest.approx(finished - timeline.start, abs=1e-9)
    timeline.close()


class Outputs:
    """An execution's outputs that are computed when the test says so: the timeline waits on
    them as on jax.Arrays (jax.block_until_ready calls any leaf's block_until_ready; the
    watching thread may also poll is_ready), so "still running" is not left to the speed of
    the machine."""

    def __init__(self) -> None:
        self._ready = threading.Event()

    def is_ready(self) -> bool:
        return self._ready.is_set()

    def block_until_ready(self) -> "Outputs":
        self._ready.wait()
        return self

    def finish(self) -> None:
        self._ready.set()


def test_an_execution_still_running_counts_as_busy_up_to_the_window_end():
    timeline = tl.Timeline()
    outputs = Outputs()
    try:
        ex = timeline.dispatched(outputs, steps=1, samples=1)
        time.sleep(0.05)
        end = time.perf_counter()
        split = timeline.window(end)
        assert ex.finished is None  # it was still running at the window's end
        assert split["productive"] == pytest.approx(end - ex.dispatched, abs=1e-9)
        assert split["productive"] >= 0.05
        assert split["other"] == pytest.approx(ex.dispatched - timeline.start, abs=1e-9)
        assert timeline.executions == [ex]  # kept: the rest of its run is the next window's
    finally:
        outputs.finish()
    finished = timeline.finished(ex)
    assert finished >= end
    rest = timeline.window(finished)
    assert rest["productive"] == pytest.approx(finished - end, abs=1e-9)
    assert timeline.totals["productive"] == pytest.approx(finished - ex.dispatched, abs=1e-9)
    assert timeline.executions == []
    timeline.close()
