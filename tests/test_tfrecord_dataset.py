"""pk.data.TFRecordDataset against what tf.data read from TF-written files
(tests/golden/tf/records.json): records and order, compressions, shards, damage and
ignore_errors; the cached index, random access (shuffle, shard, exact resume) and object
storage (moto's S3 server and the GCS emulator on loopback)."""

import json
import os
import re
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit import paths
from podkit.data import tfrecords
from podkit.errors import ConfigError, DataError
from podkit.io import tfrecord
from storage_servers import BUCKET

sys.path.insert(0, str(Path(__file__).parent / "io"))
from tf_golden import GOLDEN, load, unhex

INFO = load("records.json")
RECORDS = unhex(INFO["records"])
SHARDS = str(GOLDEN / "shard-*-of-00003.tfrecord")


@pytest.fixture(autouse=True)
def index_cache(tmp_path, monkeypatch):
    """Each test its own index cache: what one test cached never serves another."""
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tfrecord-index"


@pytest.mark.parametrize("compression,name", [(None, "plain.tfrecord"),
                                              ("GZIP", "gzip.tfrecord.gz"),
                                              ("ZLIB", "zlib.tfrecord.z")])
def test_the_records_tensorflow_wrote_in_its_order(compression, name):
    ds = pk.data.TFRecordDataset(str(GOLDEN / name), compression_type=compression)
    assert list(ds) == RECORDS
    # Plain files have an index, so a known length; compressed ones are streams, as tf.data's.
    expected = len(RECORDS) if compression is None else pk.data.UNKNOWN_CARDINALITY
    assert ds.cardinality() == expected


def test_shards_by_glob_list_and_list_files_in_tf_datas_order():
    assert list(pk.data.TFRecordDataset(SHARDS)) == unhex(INFO["shards"])
    names = sorted(paths.glob(SHARDS))
    assert list(pk.data.TFRecordDataset(names)) == unhex(INFO["shards"])
    files = pk.data.Dataset.list_files(SHARDS, shuffle=False)
    assert list(pk.data.TFRecordDataset(files)) == unhex(INFO["shards"])
    for k in (2, 3):  # 2: a finished file's slot is refilled
        parallel = pk.data.TFRecordDataset(SHARDS, num_parallel_reads=k)
        assert list(parallel) == unhex(INFO[f"shards_parallel_{k}"])
        assert parallel.plan.random_access  # an index order, not a stream
        threads = pk.data.TFRecordDataset(files, num_parallel_reads=k)
        assert list(threads) == unhex(INFO[f"shards_parallel_{k}"])


def test_interleave_order_is_interleaves():
    counts = [3, 0, 5, 1, 4, 2]
    starts = np.concatenate([[0], np.cumsum(counts)])
    names = np.asarray([str(i) for i in range(len(counts))], dtype=object)
    for cycle in (1, 2, 3, 4, 8):
        by_interleave = pk.data.Dataset.from_tensor_slices(names).interleave(
            lambda f: pk.data.Dataset.range(counts[int(f)]).map(
                lambda j, f=f: starts[int(f)] + j), cycle_length=cycle, block_length=1)
        order = tfrecords.interleave_order(counts, cycle)
        assert order.tolist() == [int(x) for x in by_interleave], cycle


@pytest.mark.parametrize("name", ["corrupt", "truncated", "bad_length"])
def test_damage_raises_after_tensorflows_records_and_ignore_errors_drops_as_tf(name):
    path = str(GOLDEN / f"{name}.tfrecord")
    expected = unhex(INFO[name]["records"])
    got = []
    with pytest.raises(DataError) as e:
        for r in pk.data.TFRecordDataset(path):
            got.append(r)
    assert got == expected
    assert path in str(e.value)
    assert f"byte offset {INFO['small_offsets'][len(expected)]}" in str(e.value)
    ignored = pk.data.TFRecordDataset(path).ignore_errors()
    assert list(ignored) == unhex(INFO[f"{name}_ignore_errors"]["records"])


def test_a_corrupt_compressed_file_is_a_data_error_and_ignore_errors_goes_on(tmp_path):
    good = tmp_path / "good.gz"
    with pk.io.TFRecordWriter(good, "GZIP") as w:
        w.write(b"after")
    bad = tmp_path / "bad.gz"
    import gzip
    bad.write_bytes(gzip.compress((GOLDEN / "corrupt.tfrecord").read_bytes()))
    ds = pk.data.TFRecordDataset([str(bad), str(good)], compression_type="GZIP")
    with pytest.raises(DataError, match="decompressed stream"):
        list(ds)
    small = unhex(INFO["small"])
    assert list(ds.ignore_errors()) == [*small[:2], b"after"]


def test_the_index_is_cached_by_path_and_version_not_beside_the_data(tmp_path, index_cache,
                                                                     monkeypatch):
    path = tmp_path / "data" / "x.tfrecord"
    path.parent.mkdir()
    with pk.io.TFRecordWriter(path) as w:
        for i in range(5):
            w.write(b"%d" % i)
    os.chmod(path.parent, 0o555)  # the data folder is read-only: nothing is written there
    try:
        assert list(pk.data.TFRecordDataset(str(path))) == [b"0", b"1", b"2", b"3", b"4"]
        assert os.listdir(path.parent) == ["x.tfrecord"]
    finally:
        os.chmod(path.parent, 0o755)
    assert len(os.listdir(index_cache)) == 1

    def no_scan(*args, **kwargs):
        raise AssertionError("the index was built again")
    monkeypatch.setattr(tfrecord, "index", no_scan)
    assert pk.data.TFRecordDataset(str(path)).cardinality() == 5  # from the cache
    monkeypatch.undo()
    monkeypatch.setenv("PODKIT_CACHE", str(index_cache.parent))
    with pk.io.TFRecordWriter(path) as w:  # a new version of the file: a new index
        w.write(b"only")
    os.utime(path, ns=(1, 1))
    assert list(pk.data.TFRecordDataset(str(path))) == [b"only"]
    assert len(os.listdir(index_cache)) == 2


def test_random_access_shuffle_shard_and_exact_resume():
    ds = pk.data.TFRecordDataset(SHARDS)
    records = unhex(INFO["shards"])
    shuffled = list(ds.shuffle(100, seed=3))
    assert sorted(shuffled) == sorted(records) and shuffled != records
    assert list(ds.shard(3, 1)) == records[1::3]
    assert list(ds.skip(5).take(3)) == records[5:8]
    pipeline = ds.shuffle(100, seed=7).batch(2)
    it = iter(pipeline)
    first = [next(it) for _ in range(2)]
    state = json.loads(json.dumps(it.get_state()))  # what a checkpoint stores
    rest = list(it)
    again = iter(pipeline)
    again.set_state(state)
    assert [list(b) for b in again] == [list(b) for b in rest]
    assert sum(len(b) for b in first + rest) == len(records)


def test_compressed_streams_resume_exactly(tmp_path):
    files = []
    for s in range(2):
        files.append(str(tmp_path / f"c{s}.z"))
        with pk.io.TFRecordWriter(files[-1], "ZLIB") as w:
            for i in range(4):
                w.write(b"%d-%d" % (s, i))
    ds = pk.data.TFRecordDataset(files, compression_type="ZLIB")
    it = iter(ds)
    head = [next(it) for _ in range(5)]
    state = it.get_state()
    again = iter(ds)
    again.set_state(state)
    assert head == [b"0-0", b"0-1", b"0-2", b"0-3", b"1-0"]
    assert list(again) == [b"1-1", b"1-2", b"1-3"]


def test_parse_and_decode_in_a_pipeline():
    spec = {"seq": pk.io.FixedLenSequenceFeature([2], "int64", allow_missing=True),
            "i": pk.io.FixedLenFeature([], "int64")}
    ds = pk.data.TFRecordDataset(str(GOLDEN / "examples.tfrecord")).map(
        lambda r: pk.io.parse_single_example(r, spec))
    got = list(ds.padded_batch(3))
    assert got[0]["i"].tolist() == [7, -3, 2**63 - 1]
    assert got[0]["seq"].shape == (3, 2, 2)  # padded to the longest, as tf.data's


def test_ignore_errors_drops_failed_elements_and_resumes_exactly():
    def fail_on_3(x):
        if x == 3:
            raise ValueError("three")
        return x

    ds = pk.data.Dataset.range(8).map(fail_on_3).ignore_errors()
    assert [int(x) for x in ds] == [0, 1, 2, 4, 5, 6, 7]
    assert ds.cardinality() == pk.data.UNKNOWN_CARDINALITY
    it = iter(ds)
    [next(it) for _ in range(4)]
    state = it.get_state()
    again = iter(ds)
    again.set_state(state)
    assert [int(x) for x in again] == [5, 6, 7]
    stream = pk.data.Dataset.range(8).filter(lambda x: x != 1).map(fail_on_3).ignore_errors()
    assert [int(x) for x in stream] == [0, 2, 4, 5, 6, 7]
    with pytest.raises(ConfigError, match="log_warning"):
        ds.ignore_errors(log_warning="yes")


def test_arguments_are_checked():
    with pytest.raises(ConfigError, match="BZ2"):
        pk.data.TFRecordDataset(str(GOLDEN / "plain.tfrecord"), compression_type="BZ2")
    with pytest.raises(ConfigError, match="num_parallel_reads"):
        pk.data.TFRecordDataset(str(GOLDEN / "plain.tfrecord"), num_parallel_reads=0)
    with pytest.raises(pk.errors.InputError, match="nope"):
        pk.data.TFRecordDataset(str(GOLDEN / "nope-*.tfrecord"))
    small = pk.data.TFRecordDataset(str(GOLDEN / "plain.tfrecord"), buffer_size=64)
    assert list(small) == RECORDS


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_object_storage(request, store, tmp_path):
    request.getfixturevalue(store)
    scheme = "s3" if store == "s3" else "gs"
    root = f"{scheme}://{BUCKET}/tfrecord-{uuid.uuid4().hex[:8]}"  # fresh on every run
    with pk.io.TFRecordWriter(f"{root}/b.tfrecord") as w:
        for r in RECORDS[:3]:
            w.write(r)
    with pk.io.TFRecordWriter(f"{root}/a.tfrecord") as w:
        for r in RECORDS[3:]:
            w.write(r)
    with pk.io.TFRecordWriter(f"{root}/c.tfrecord.gz", "GZIP") as w:
        w.write(b"zipped")
    ds = pk.data.TFRecordDataset(f"{root}/*.tfrecord")
    assert list(ds) == RECORDS[3:] + RECORDS[:3]
    assert sorted(ds.shuffle(50, seed=1)) == sorted(RECORDS)
    assert list(pk.io.tf_record_iterator(f"{root}/b.tfrecord")) == RECORDS[:3]
    assert list(pk.data.TFRecordDataset(f"{root}/c.tfrecord.gz", "GZIP")) == [b"zipped"]
    local = tmp_path / "corrupt.tfrecord"
    shutil.copy(GOLDEN / "corrupt.tfrecord", local)
    with paths.open(f"{root}/corrupt.tfrecord", "wb") as f:
        f.write(local.read_bytes())
    with pytest.raises(DataError, match=re.escape(f"{root}/corrupt.tfrecord")):
        list(pk.data.TFRecordDataset(f"{root}/corrupt.tfrecord"))
    with pytest.raises(RuntimeError), pk.io.TFRecordWriter(f"{root}/never.tfrecord") as w:
        w.write(b"x")
        raise RuntimeError("stop")
    assert not paths.exists(f"{root}/never.tfrecord")


def test_tfrecords_source_reads_in_worker_processes():
    ds = pk.data.TFRecordDataset(SHARDS).map(lambda r: np.frombuffer(r, np.uint8).sum(),
                                             num_parallel_calls=2)
    expected = [np.frombuffer(r, np.uint8).sum() for r in unhex(INFO["shards"])]
    assert [int(x) for x in ds] == [int(x) for x in expected]
    damaged = pk.data.TFRecordDataset(str(GOLDEN / "corrupt.tfrecord")).map(
        bytes.upper, num_parallel_calls=2).ignore_errors()
    assert list(damaged) == [r.upper() for r in unhex(INFO["corrupt_ignore_errors"]["records"])]
    assert isinstance(pk.data.TFRecordDataset(SHARDS).plan.source, tfrecords.TFRecords)


@pytest.mark.parametrize("reads", [None, 2])
def test_resume_at_every_cut_point_through_damage(reads):
    files = [*sorted(paths.glob(SHARDS)), str(GOLDEN / "corrupt.tfrecord")]

    def make():
        return (pk.data.TFRecordDataset(files, num_parallel_reads=reads).map(bytes.upper)
                .ignore_errors().shuffle(6, seed=1).batch(4))

    def run(it):
        out, states = [], []
        while True:
            states.append(json.loads(json.dumps(it.get_state())))
            try:
                out.append([bytes(x) for x in next(it)])
            except StopIteration:
                return out, states

    whole, states = run(make()._iterator(workers=False))
    assert sum(len(b) for b in whole) == len(INFO["shards"]) + 2  # corrupt's 2 good records
    for cut, state in enumerate(states):
        it = make()._iterator(workers=False)
        it.set_state(state)
        assert run(it)[0] == whole[cut:], cut


def test_ignore_errors_above_a_batch_splits_across_processes():
    ds = pk.data.TFRecordDataset(str(GOLDEN / "corrupt.tfrecord")).batch(2).ignore_errors()
    small = unhex(INFO["small"])
    assert [list(b) for b in ds] == [small[:2]]  # the batch holding the bad record is dropped
    shares = [[list(b) for b in ds.for_process(2, i)] for i in range(2)]
    assert shares == [[small[:1]], [small[1:2]]]
    assert ds.element_spec.shape == (None,)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_many_shards_keep_a_bounded_number_of_files_open(tmp_path, monkeypatch):
    """ImageNet has 1,024 training shards: reading them must not hold a descriptor each (a
    common `ulimit -n` is 1,024); the least recently read are closed and opened again."""
    monkeypatch.setattr(tfrecord, "MAX_OPEN_FILES", 4)
    files = []
    for i in range(12):
        files.append(str(tmp_path / f"shard-{i:02d}.tfrecord"))
        with pk.io.TFRecordWriter(files[-1]) as w:
            w.write(b"a%d" % i)
            w.write(b"b%d" % i)
    ds = pk.data.TFRecordDataset(files)

    def open_here():
        return sum(os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
                   for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    for _ in range(2):  # again: closed files open again
        got, most = [], 0
        for record in ds:
            got.append(bytes(record))
            most = max(most, open_here())
        assert got == [b"%s%d" % (k, i) for i in range(12) for k in (b"a", b"b")]
        assert most <= 4, most
    os.remove(files[3])  # indexed, then gone: a DataError naming it, not an OSError
    with pytest.raises(DataError, match="shard-03.*no longer exists"):
        list(ds)
    with pytest.raises(DataError, match="missing.tfrecord' does not exist"):
        list(pk.io.tf_record_iterator(tmp_path / "missing.tfrecord"))


@pytest.mark.parametrize("kind", ["GZIP", "ZLIB"])
def test_a_compressed_file_read_as_plain_names_its_compression_type(tmp_path, kind):
    path = str(tmp_path / "c.tfrecord")
    with pk.io.TFRecordWriter(path, options=pk.io.TFRecordOptions(compression_type=kind)) as w:
        w.write(b"record")
    with pytest.raises(DataError, match=f"starts as a {kind} stream does: pass "
                                        f"compression_type='{kind}'"):
        list(pk.data.TFRecordDataset(path))
    assert [bytes(r) for r in pk.data.TFRecordDataset(path, compression_type=kind)] == \
        [b"record"]


def test_an_index_cached_without_the_damage_flag_is_built_again(index_cache):
    """Format 1 of the index cache had no damage flag: trusting it would count a damaged
    file's bad record again."""
    path = str(GOLDEN / "corrupt.tfrecord")
    assert pk.data.TFRecordDataset(path).cardinality() == pk.data.UNKNOWN_CARDINALITY
    (cached,) = index_cache.glob("*.idx")
    offsets = np.frombuffer(cached.read_bytes(), "<i8", offset=16)
    cached.write_bytes(b"PKTFIDX1" + offsets.tobytes())  # as podkit wrote it before
    assert pk.data.TFRecordDataset(path).cardinality() == pk.data.UNKNOWN_CARDINALITY
    assert cached.read_bytes()[:8] == b"PKTFIDX2"
