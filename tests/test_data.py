"""pk.data conformance: each verb's elements and order, as tf.data defines them.

Expected values are tf.data's outputs for the same pipelines (written out here; with
tensorflow installed, test_data_tf.py also checks them against tf.data itself).
"""

import json

import numpy as np
import pytest

import podkit as pk

D = pk.data.Dataset


def values(ds):
    """Elements as plain Python values (lists for arrays)."""
    def plain(e):
        if isinstance(e, tuple):
            return tuple(plain(x) for x in e)
        if isinstance(e, dict):
            return {k: plain(v) for k, v in e.items()}
        return np.asarray(e).tolist() if not isinstance(e, bytes) else e
    return [plain(e) for e in ds]


def test_batch_keeps_or_drops_the_remainder():
    assert values(D.range(10).batch(3)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert values(D.range(10).batch(3, drop_remainder=True)) == [[0, 1, 2], [3, 4, 5],
                                                                 [6, 7, 8]]
    assert D.range(10).batch(3).cardinality() == 4
    assert D.range(10).batch(3, drop_remainder=True).cardinality() == 3


def test_padded_batch_pads_to_the_batch_max_or_the_given_shape():
    ds = D.range(1, 5).map(lambda x: np.full(x, x))
    assert values(ds.padded_batch(2)) == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]]]
    assert values(ds.padded_batch(3, padded_shapes=[5], padding_values=-1)) == [
        [[1, -1, -1, -1, -1], [2, 2, -1, -1, -1], [3, 3, 3, -1, -1]],
        [[4, 4, 4, 4, -1]]]
    assert values(ds.padded_batch(3, drop_remainder=True)) == [[[1, 0, 0], [2, 2, 0],
                                                                [3, 3, 3]]]


def test_padded_batch_of_tuples_pads_each_component():
    ds = D.range(1, 4).map(lambda x: (np.arange(x), x))
    assert values(ds.padded_batch(3, padded_shapes=([4], []))) == [
        ([[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 2, 0]], [1, 2, 3])]


def test_bucket_by_sequence_length_matches_tf_example():
    elements = [[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11], [13, 14, 15, 16, 19, 20],
                [21, 22]]
    ds = D.from_generator(lambda: (np.array(e) for e in elements))
    out = ds.bucket_by_sequence_length(lambda e: len(e), [3, 5], [2, 2, 2])
    assert values(out) == [[[1, 2, 3, 4], [5, 6, 7, 0]],
                           [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]],
                           [[0, 0], [21, 22]]]


def test_bucket_to_boundary_gives_one_shape_per_bucket():
    lengths = [1, 2, 5, 6, 2, 7, 1, 3, 6, 5]
    ds = D.from_generator(lambda: (np.ones(n, np.int32) for n in lengths))
    out = list(ds.bucket_by_sequence_length(len, [4, 8], [2, 2, 2],
                                            pad_to_bucket_boundary=True, drop_remainder=True))
    assert {b.shape for b in out} <= {(2, 3), (2, 7)}
    assert sum(int(b.sum()) for b in out) == sum(lengths[:8]) + 6 - 3  # 2 leftovers dropped


def test_unbatch_is_the_inverse_of_batch():
    assert values(D.range(7).batch(3).unbatch()) == list(range(7))
    assert values(D.from_tensor_slices((np.arange(4).reshape(2, 2), np.array([[5, 6],
                                                                               [7, 8]])))
                  .unbatch()) == [(0, 5), (1, 6), (2, 7), (3, 8)]


def test_interleave_order_matches_tf_docs():
    ds = D.range(1, 6).interleave(lambda x: D.from_tensor_slices(np.full(6, x)),
                                  cycle_length=2, block_length=4)
    assert values(ds) == [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3,
                          4, 4, 5, 5, 5, 5, 5, 5]


def test_interleave_replaces_a_finished_input_in_its_slot():
    ds = D.range(1, 4).interleave(lambda x: D.range(10 * x, 10 * x + x), cycle_length=2)
    # slot 0 finishes [10]; the cycle moves on to slot 1 (21) before slot 0 opens input 3.
    assert values(ds) == [10, 20, 21, 30, 31, 32]


def test_shard_takes_every_nth_element():
    assert values(D.range(10).shard(3, 0)) == [0, 3, 6, 9]
    assert values(D.range(10).shard(3, 2)) == [2, 5, 8]
    assert D.range(10).shard(3, 1).cardinality() == 3
    union = sorted(sum((values(D.range(17).shard(4, i)) for i in range(4)), []))
    assert union == list(range(17))


def test_shard_on_a_stream_matches_random_access_shard():
    ds = D.range(20).filter(lambda x: x % 3 != 0)
    assert values(ds.shard(2, 1)) == values(ds)[1::2]


def test_repeat_take_skip_order():
    assert values(D.range(5).repeat(2).skip(3).take(4)) == [3, 4, 0, 1]
    assert values(D.range(3).repeat().take(7)) == [0, 1, 2, 0, 1, 2, 0]
    assert values(D.range(4).take(-1)) == [0, 1, 2, 3]
    assert values(D.range(4).skip(-1)) == []
    assert values(D.range(4).skip(10)) == []
    assert D.range(3).repeat().cardinality() == pk.data.INFINITE_CARDINALITY
    assert D.range(3).repeat().take(5).cardinality() == 5
    assert D.range(5).filter(bool).cardinality() == pk.data.UNKNOWN_CARDINALITY
    assert values(D.range(5).filter(lambda x: x > 1).repeat(2).skip(1).take(4)) == [3, 4, 2,
                                                                                     3]


def test_enumerate_zip_concatenate():
    assert values(D.range(3).enumerate(start=5)) == [(5, 0), (6, 1), (7, 2)]
    assert values(D.zip(D.range(3), D.range(10, 20))) == [(0, 10), (1, 11), (2, 12)]
    assert values(D.zip({"a": D.range(2), "b": D.range(5, 7)})) == [{"a": 0, "b": 5},
                                                                    {"a": 1, "b": 6}]
    assert values(D.range(2).concatenate(D.range(5, 7))) == [0, 1, 5, 6]
    stream = D.range(4).filter(lambda x: x % 2 == 0)
    assert values(stream.concatenate(D.range(9, 10))) == [0, 2, 9]
    assert values(D.zip((stream, D.range(100)))) == [(0, 0), (2, 1)]


def test_map_unpacks_tuples_and_filter_keeps_order():
    x, y = np.arange(6).reshape(3, 2), np.array([1, 2, 3])
    ds = D.from_tensor_slices((x, y)).map(lambda a, b: (a * b, b))
    assert values(ds) == [([0, 1], 1), ([4, 6], 2), ([12, 15], 3)]
    assert values(D.from_tensor_slices({"a": y}).map(lambda e: e["a"] + 1)) == [2, 3, 4]
    assert values(D.range(10).filter(lambda v: v % 3 == 0)) == [0, 3, 6, 9]


def test_from_tensor_slices_elements_and_spec():
    ds = D.from_tensor_slices((np.zeros((4, 3), np.float32), np.arange(4)))
    spec = ds.element_spec
    assert spec[0] == pk.data.TensorSpec((3,), np.dtype(np.float32))
    assert spec[1].shape == ()
    assert len(ds) == 4
    assert D.range(10).batch(4).element_spec.shape == (None,)
    assert D.range(10).batch(4, drop_remainder=True).element_spec.shape == (4,)


def test_range_sequence_generator():
    assert values(D.range(2, 10, 3)) == [2, 5, 8]
    assert values(D.range(5, 0, -2)) == [5, 3, 1]
    assert values(D.from_sequence(["a", "b"])) == ["a", "b"]

    def gen(n):
        yield from range(n)
    ds = D.from_generator(gen, args=(3,))
    assert values(ds) == [0, 1, 2] and values(ds) == [0, 1, 2]  # called anew each time


def test_text_lines(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\ntwo\r\n\nthree")
    (tmp_path / "b.txt").write_bytes(b"four\n")
    ds = pk.data.TextLineDataset([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    assert list(ds) == [b"one", b"two", b"", b"three", b"four"]
    assert list(pk.data.TextLineDataset(str(tmp_path / "*.txt"))) == list(ds)


def test_text_lines_are_found_in_blocks_not_by_reading_the_file_whole(tmp_path, monkeypatch):
    """Line ends are found block by block (a file never read whole into memory): lines that
    cross a block's edge, an empty file and a file without a final newline stay whole."""
    from podkit.data import sources

    lines = [b"x" * n for n in (0, 1, 5, 6, 7, 13, 2, 0, 40)]
    (tmp_path / "a.txt").write_bytes(b"\n".join(lines))
    (tmp_path / "empty.txt").write_bytes(b"")
    reads = []
    real_open = open

    def spying_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        if "b" in mode and str(path).endswith(".txt"):
            read = f.read
            f.read = lambda n=-1: reads.append(n) or read(n)
        return f

    monkeypatch.setattr(sources, "SCAN_BYTES", 6)
    monkeypatch.setattr("builtins.open", spying_open)
    ds = pk.data.TextLineDataset([str(tmp_path / "a.txt"), str(tmp_path / "empty.txt")])
    assert reads and all(0 < n <= 6 for n in reads)  # blocks only, never read(-1)
    monkeypatch.setattr("builtins.open", real_open)
    assert list(ds) == lines


def test_array_record_writes_a_list_of_records_and_names_a_wrong_input(tmp_path):
    files = pk.data.write_array_record([b"a\x00", b"bc", b"d"], tmp_path / "l", num_shards=2)
    assert list(pk.data.ArrayRecordDataset(files)) == [b"a\x00", b"bc", b"d"]
    with pytest.raises(pk.InputError, match="takes a pk.data Dataset or a list of bytes, not "
                                            "a dict"):
        pk.data.write_array_record({"a": b"x"}, tmp_path / "d")


def test_array_record_round_trip_keeps_order(tmp_path):
    ds = D.range(23).map(lambda i: json.dumps({"i": int(i)}).encode())
    files = pk.data.write_array_record(ds, tmp_path / "recs", num_shards=3)
    assert [f.split("/")[-1] for f in files] == [f"recs-0000{i}-of-00003.array_record"
                                                  for i in range(3)]
    back = pk.data.ArrayRecordDataset(str(tmp_path / "recs-*"))
    assert back.cardinality() == 23
    assert [json.loads(r)["i"] for r in back] == list(range(23))
    assert not list(tmp_path.glob("*.tmp"))


def test_cache_in_memory_computes_each_element_once():
    calls = []

    def f(x):
        calls.append(int(x))
        return x * 2
    ds = D.range(5).map(f).cache().shuffle(5, seed=0)
    first, second = values(ds), values(ds)
    assert sorted(first) == sorted(second) == [0, 2, 4, 6, 8]
    assert first != second  # shuffled anew above the cache
    assert sorted(calls) == [0, 1, 2, 3, 4]


def test_cache_file_is_reused_by_a_new_pipeline(tmp_path):
    calls = []

    def f(x):
        calls.append(int(x))
        return {"v": x * 3}
    path = str(tmp_path / "cache" / "c")
    assert values(D.range(4).map(f).cache(path)) == [{"v": v} for v in (0, 3, 6, 9)]
    assert len(calls) == 4
    assert values(D.range(4).map(f).cache(path)) == [{"v": v} for v in (0, 3, 6, 9)]
    assert len(calls) == 4  # read from the file, not recomputed
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_shuffle_is_a_seeded_permutation_that_changes_each_epoch():
    ds = D.range(100).shuffle(100, seed=7)
    a, b = values(ds), values(ds)
    assert sorted(a) == sorted(b) == list(range(100))
    assert a != b and a != list(range(100))
    assert values(D.range(100).shuffle(100, seed=7)) == a  # same seed, same first epoch
    assert values(D.range(100).shuffle(100, seed=8)) != a
    fixed = D.range(100).shuffle(100, seed=7, reshuffle_each_iteration=False)
    assert values(fixed) == values(fixed)
    reps = values(D.range(50).shuffle(50, seed=1).repeat(2))
    assert sorted(reps[:50]) == sorted(reps[50:]) == list(range(50)) and reps[:50] != reps[50:]


def test_small_shuffle_buffers_keep_elements_near_their_position():
    out = values(D.range(1000).shuffle(10, seed=0))
    assert sorted(out) == list(range(1000))
    assert max(abs(v - i) for i, v in enumerate(out)) < 10
    stream = values(D.range(1000).filter(lambda x: True).shuffle(10, seed=0))
    assert sorted(stream) == list(range(1000)) and stream != list(range(1000))


def test_prefetch_and_parallel_map_keep_order():
    ds = D.range(50).map(lambda x: x + 1, num_parallel_calls=pk.data.AUTOTUNE).prefetch(4)
    assert values(ds) == list(range(1, 51))
    assert values(D.range(20).filter(lambda x: x % 2).prefetch(3)) == list(range(1, 20, 2))


def test_iterator_reports_elements_and_wait():
    it = iter(D.range(1000).batch(10))
    assert len(list(it)) == 100
    stats = it.stats()
    assert stats.elements == 100
    assert stats.elements_per_s > 0 and 0 < stats.wait_s <= stats.elapsed_s
    assert 0 < stats.wait_fraction <= 1


@pytest.mark.parametrize("ds", [
    D.range(10).filter(lambda x: x % 2), D.range(5).batch(2).unbatch(),
    D.range(3).interleave(lambda x: D.range(x)),
])
def test_unknown_cardinality(ds):
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    with pytest.raises(TypeError, match="unknown"):
        len(ds)


def slow_element(x):
    import time
    time.sleep(0.004)
    return x


def test_autotune_sizes_workers_and_buffers_from_measured_cost():
    from podkit.data.autotune import WORKER_MIN_WORK_S, usable_cores

    heavy = iter(D.range(500).map(slow_element, num_parallel_calls=pk.data.AUTOTUNE).batch(2))
    plan = heavy._stream.plan  # decided before any worker starts
    heavy.close()
    assert plan.workers == min(usable_cores(), 32) and usable_cores() > 1
    assert 2 <= plan.depth <= 16 and plan.tuned
    cheap = iter(D.range(64).map(lambda x: x + 1, num_parallel_calls=pk.data.AUTOTUNE))
    assert cheap._stream.plan.workers == 0  # a process hand-off would cost more than the work
    assert len(list(cheap)) == 64
    short = iter(D.range(20).map(slow_element, num_parallel_calls=pk.data.AUTOTUNE))
    assert 20 * 0.004 < WORKER_MIN_WORK_S and short._stream.plan.workers == 0  # over too soon
    short.close()
    explicit = iter(D.range(64).map(slow_element, num_parallel_calls=3))
    assert explicit._stream.plan.workers == 3
    explicit.close()


def test_looking_at_a_dataset_does_not_change_its_shuffle():
    a = D.range(30).shuffle(30, seed=4)
    b = D.range(30).shuffle(30, seed=4)
    assert a.element_spec.shape == ()
    assert values(a) == values(b)
