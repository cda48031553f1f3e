"""Exact resume: an iterator restored from a saved state yields exactly what an uninterrupted
one would have yielded next — through shuffle, repeat, interleave, bucketing and parallel map,
with or without worker processes, in a new pipeline object or a new process."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import podkit as pk

D = pk.data.Dataset


def square(x):
    return np.full(3, x, np.int64) ** 2


def tagged(x):
    return {"x": np.asarray(x), "odd": np.asarray(x % 2)}


PIPELINES = {
    # random access all the way: the state is one index
    "shuffle_map_batch_repeat": lambda: (
        D.range(37).shuffle(37, seed=3).map(square).batch(4).repeat(3)),
    "window_shuffle_skip_shard": lambda: (
        D.range(200).shuffle(16, seed=9).skip(5).shard(3, 1).enumerate().take(50)),
    # streams: filter, stream shuffle (replayed), unbatch, prefetch thread
    "filter_shuffle_unbatch": lambda: (
        D.range(90).filter(lambda x: x % 4 != 0).shuffle(10, seed=2).batch(5).unbatch()
        .repeat(2).prefetch(3)),
    "interleave": lambda: (
        D.range(1, 13).shuffle(12, seed=4).interleave(
            lambda n: D.range(n).map(lambda v: v * 100 + n), cycle_length=3, block_length=2)
        .map(tagged)),
    "interleave_read_ahead": lambda: (
        D.range(1, 9).interleave(lambda n: D.range(n * 3).map(lambda v: v * 10 + n),
                                 cycle_length=3, block_length=2, num_parallel_calls=3)),
    "bucket_zip_concat": lambda: (
        D.zip((D.range(40).map(lambda n: np.arange(n % 7 + 1)), D.range(40)))
        .bucket_by_sequence_length(lambda a, b: len(a), [3, 5], [2, 3, 2])
        .concatenate(D.range(3).map(lambda v: (np.zeros((1, 1), np.int64),
                                               np.full(1, v))))),
    "generator_cache": lambda: (
        D.from_generator(lambda: iter(range(25))).cache().shuffle(25, seed=5).repeat(2)),
}


def run_with_states(ds, workers=True):
    """All elements, and the state before each one (and at the end)."""
    it = ds._iterator(workers=workers)
    elements, states = [], []
    while True:
        states.append(json.loads(json.dumps(it.get_state())))  # a checkpoint is JSON
        try:
            elements.append(next(it))
        except StopIteration:
            break
    return elements, states


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        xs, ys = pk.data.structure.leaves(x), pk.data.structure.leaves(y)
        assert len(xs) == len(ys)
        for u, v in zip(xs, ys, strict=True):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_resume_at_every_cut_point(name):
    make = PIPELINES[name]
    elements, states = run_with_states(make())
    assert len(elements) > 20
    for cut in range(len(elements) + 1):
        it = make()._iterator()  # a new pipeline object, as after a restart
        it.set_state(states[cut])
        assert_same(list(it), elements[cut:])


def test_resume_with_worker_processes():
    make = lambda: (D.range(60).shuffle(60, seed=11)
                    .map(square, num_parallel_calls=2).batch(4).repeat(2))
    elements, states = run_with_states(make(), workers=True)
    plain, _ = run_with_states(make(), workers=False)
    assert_same(elements, plain)  # workers change nothing but speed
    for cut in (0, 7, len(elements) - 1):
        with make()._iterator() as it:
            it.set_state(states[cut])
            assert it._stream.plan.workers == 2
            assert_same(list(it), elements[cut:])
    for cut in range(len(elements) + 1):  # the state does not depend on the worker count
        it = make()._iterator(workers=False)
        it.set_state(states[cut])
        assert_same(list(it), elements[cut:])


def test_drawn_seed_travels_in_the_state():
    ds = D.range(50).shuffle(50)  # seed=None: drawn at random
    it = iter(ds)
    head = [int(next(it)) for _ in range(10)]
    state = it.get_state()
    other = D.range(50).shuffle(50)._iterator()  # draws a different seed
    other.set_state(state)
    rest = [int(v) for v in other]
    assert sorted(head + rest) == list(range(50))
    assert head + rest == [int(v) for v in
                           D.range(50).shuffle(50, seed=state["seeds"][0])]


def test_resume_in_a_new_process(tmp_path):
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        import podkit as pk

        def pipeline():
            return (pk.data.Dataset.range(40).shuffle(40, seed=1)
                    .map(lambda x: x * 3, num_parallel_calls=2).batch(3).repeat(2))

        if __name__ == "__main__":
            it = iter(pipeline())
            if sys.argv[1] == "save":
                for _ in range(9):
                    next(it)
                json.dump(it.get_state(), open(sys.argv[2], "w"))
                it.close()
            else:
                it.set_state(json.load(open(sys.argv[2])))
                print(json.dumps([b.tolist() for b in it]))
    """)
    path = tmp_path / "resume.py"
    path.write_text(script)
    state = tmp_path / "state.json"
    subprocess.run([sys.executable, str(path), "save", str(state)], check=True, timeout=120)
    out = subprocess.run([sys.executable, str(path), "load", str(state)], check=True,
                         timeout=120, capture_output=True, text=True).stdout
    expected = [b.tolist() for b in D.range(40).shuffle(40, seed=1).map(lambda x: x * 3)
                .batch(3).repeat(2)][9:]
    assert json.loads(out.strip().splitlines()[-1]) == expected


def test_interleave_read_ahead_keeps_tf_order_and_unordered_resumes_exactly():
    def make(**kw):
        return D.range(1, 9).interleave(lambda n: D.range(n * 3).map(lambda v: v * 10 + n),
                                        cycle_length=3, block_length=2, **kw)

    plain = [int(v) for v in make()]
    assert [int(v) for v in make(num_parallel_calls=3)] == plain  # read ahead, same order
    unordered = make(num_parallel_calls=3, deterministic=False)
    elements, states = run_with_states(unordered)
    assert sorted(int(v) for v in elements) == sorted(plain)
    for cut in (0, 5, 17, len(elements)):
        it = unordered._iterator()
        it.set_state(states[cut])
        rest = [int(v) for v in it]
        assert sorted(rest) == sorted(int(v) for v in elements[cut:])
