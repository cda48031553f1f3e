"""The loop's timeline (podkit.train.timeline): device-busy time from a thread that watches
executions finish, and the devices' idle time split by what the host was doing."""

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
    timeline = tl.Timeline()
    t0 = timeline.cursor
    # The host "waits for input" 50 ms with the devices idle, then a real execution runs.
    time.sleep(0.05)
    timeline.add("input", t0, time.perf_counter())
    x = jnp.ones((512, 512))
    f = jax.jit(lambda x: x @ x @ x)
    f(x).block_until_ready()  # compiled before: only its run is timed
    out = f(x)
    ex = timeline.dispatched(out, steps=1, samples=512)
    finished = timeline.finished(ex)
    split = timeline.window(finished)
    wall = finished - t0
    assert sum(split.values()) == pytest.approx(wall, rel=1e-6)
    assert split["input"] == pytest.approx(0.05, abs=0.02)
    assert split["productive"] > 0
    assert finished >= ex.dispatched
    assert timeline.totals["input"] == split["input"]
    assert timeline.executions == [] and timeline.cursor == finished  # forgotten once counted
    timeline.close()


def test_an_execution_still_running_counts_as_busy_up_to_the_window_end():
    timeline = tl.Timeline()
    x = jnp.ones((1024, 1024))
    f = jax.jit(lambda x: jnp.linalg.matrix_power(x, 64))
    f(x).block_until_ready()
    ex = timeline.dispatched(f(x), steps=1, samples=1)
    now = time.perf_counter()
    split = timeline.window(now)  # before it finished (probably): busy from its dispatch
    assert split["productive"] == pytest.approx(now - max(ex.dispatched, timeline.start),
                                                abs=0.05) or ex.finished is not None
    timeline.finished(ex)
    timeline.close()
