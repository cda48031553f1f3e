"""Checkpoint storage against real servers on loopback: local disk, moto's S3, a GCS emulator."""

import os
import time
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit.checkpoint import CheckpointManager, RetryPolicy, StorageError, open_storage
from storage_servers import ACCESS_DENIED, BUCKET, SLOW_DOWN, FaultProxy, environ

FAST = RetryPolicy(attempts=4, initial_s=0.05, max_s=0.2, multiplier=2.0)


@pytest.fixture(params=["local", "s3", "gs"])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    return f"{request.param}://{BUCKET}/{request.node.name.replace('[', '-').rstrip(']')}"


def test_round_trip(url, tmp_path):
    store = open_storage(url, FAST)
    store.write_bytes("a/one.json", b'{"x": 1}')
    store.write_bytes("a/b/two.bin", b"\x00\x01" * 10)
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(3 << 20))
    store.upload_file(big, "c/big.bin")
    assert store.list("") == ["a/b/two.bin", "a/one.json", "c/big.bin"]
    assert store.list("a/") == ["a/b/two.bin", "a/one.json"]
    assert store.read_bytes("a/one.json") == b'{"x": 1}'
    assert store.size("c/big.bin") == 3 << 20 and store.exists("a/one.json")
    assert not store.exists("a/none.json")
    back = tmp_path / "back.bin"
    store.download_file("c/big.bin", back)
    assert back.read_bytes() == big.read_bytes()
    store.delete_prefix("a/")
    assert store.list("") == ["c/big.bin"]
    with pytest.raises(StorageError) as e:
        store.read_bytes("a/one.json")
    assert e.value.missing and not e.value.transient


def _checkpoint_round_trip(url):
    """Save two steps through the manager and restore the newest into a fresh model."""
    x = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    with pk.Strategy(mesh={"data": 1}, devices=pk.connect().devices[:1]).scope():
        model = pk.Sequential([pk.layers.Dense(4, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      steps_per_execution=2)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0,
              checkpoint=CheckpointManager(url, retry=FAST))
    manager = CheckpointManager(url, retry=FAST)
    assert [(i.step, i.status) for i in manager.steps()] == [(8, "valid"), (16, "valid")]
    with pk.Strategy(mesh={"data": 1}, devices=pk.connect().devices[:1]).scope():
        again = pk.Sequential([pk.layers.Dense(4, activation="softmax")])
        again.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      steps_per_execution=2)
    again.fit(x, y, batch_size=32, epochs=2, verbose=0, checkpoint=manager)
    for a, b in zip(model.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    return manager


def test_checkpoints_on_every_storage(url):
    manager = _checkpoint_round_trip(url)
    step, digest = manager.digest()
    assert step == 16 and len(digest) == 32


def test_s3_transient_errors_are_retried_with_backoff(s3_endpoint, tmp_path):
    proxy = FaultProxy(s3_endpoint, fail=3, status=503, body=SLOW_DOWN,
                       when=lambda method, path: method == "PUT")
    try:
        with environ(AWS_ENDPOINT_URL=proxy.url):
            store = open_storage(f"s3://{BUCKET}/retry", FAST)
            t0 = time.perf_counter()
            store.write_bytes("x.json", b"{}")
            elapsed = time.perf_counter() - t0
            assert proxy.seen == 4  # 3 failures, then the write that went through
            assert elapsed >= 0.8 * (0.05 + 0.1 + 0.2)  # the backoff waited
            assert store.read_bytes("x.json") == b"{}"
            # a whole checkpoint through a flaky store
            proxy.fail = 2
            _checkpoint_round_trip(f"s3://{BUCKET}/flaky")
    finally:
        proxy.close()


def test_s3_transient_errors_beyond_the_policy_are_a_clear_error(s3_endpoint):
    proxy = FaultProxy(s3_endpoint, fail=100, status=503, body=SLOW_DOWN,
                       when=lambda method, path: method == "PUT")
    try:
        with environ(AWS_ENDPOINT_URL=proxy.url):
            store = open_storage(f"s3://{BUCKET}/down", FAST)
            with pytest.raises(StorageError, match="after 4 attempts") as e:
                store.write_bytes("x.json", b"{}")
            assert e.value.transient and f"s3://{BUCKET}/down/x.json" in str(e.value)
            assert proxy.seen == 4
    finally:
        proxy.close()


def test_s3_permission_denied_is_not_retried(s3_endpoint):
    proxy = FaultProxy(s3_endpoint, fail=100, status=403, body=ACCESS_DENIED,
                       when=lambda method, path: method == "PUT")
    try:
        with environ(AWS_ENDPOINT_URL=proxy.url):
            store = open_storage(f"s3://{BUCKET}/denied", FAST)
            with pytest.raises(StorageError, match="credentials") as e:
                store.write_bytes("x.json", b"{}")
            assert not e.value.transient and "after 1 attempt" in str(e.value)
            assert proxy.seen == 1
    finally:
        proxy.close()


def test_gcs_transient_errors_are_retried(gcs_endpoint):
    proxy = FaultProxy(gcs_endpoint, fail=2, status=503, body=b"busy",
                       when=lambda method, path: method == "POST")
    try:
        with environ(STORAGE_EMULATOR_HOST=proxy.url, GOOGLE_CLOUD_PROJECT="podkit"):
            store = open_storage(f"gs://{BUCKET}/retry", FAST)
            store.write_bytes("x.json", b"{}")
            assert proxy.seen == 3 and store.read_bytes("x.json") == b"{}"
    finally:
        proxy.close()


def test_a_missing_bucket_is_named(s3):
    with pytest.raises(StorageError, match="bucket does not exist"):
        open_storage("s3://no-such-bucket/x", FAST).write_bytes("a", b"1")


@pytest.mark.parametrize("bad, match", [
    ("s3://", "names no bucket"),
    ("hdfs://cluster/x", "unknown storage scheme 'hdfs'"),
    ("", "not a checkpoint location"),
])
def test_bad_urls(bad, match):
    with pytest.raises(pk.ConfigError, match=match):
        open_storage(bad)


@pytest.mark.parametrize("bad, match", [
    (dict(attempts=0), "attempts=0"),
    (dict(initial_s=-1), "initial_s=-1"),
    (dict(multiplier=0.5), "multiplier=0.5"),
])
def test_bad_retry_policies(bad, match):
    with pytest.raises(pk.ConfigError, match=match):
        RetryPolicy(**bad)


def test_a_local_write_that_fails_leaves_nothing_behind(tmp_path):
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")
    try:
        store = open_storage(disk, FAST)
        store.write_bytes("good.json", b"{}")
        with pytest.raises(StorageError, match="disk is full") as e:
            store.write_bytes("big.bin", b"\0" * (2 << 20))
        assert not e.value.transient
        assert sorted(os.listdir(disk)) == ["good.json"]  # no partial file, no temp file
        assert store.read_bytes("good.json") == b"{}"
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(StorageError, match="read-only"):
            store.write_bytes("other.json", b"{}")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_storage_files_are_plain(tmp_path):
    assert Path(open_storage(tmp_path).local_dir()) == tmp_path.absolute()
