"""Checkpoint storage against real servers on loopback: local disk, moto's S3, a GCS emulator,
with a proxy in between that injects throttling, permission errors and dropped connections."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit.checkpoint import CheckpointManager, RetryPolicy, StorageError, open_storage
from podkit.paths.retry import classify
from storage_servers import (
    ACCESS_DENIED,
    BUCKET,
    GCS_BUSY,
    GCS_DENIED,
    SLOW_DOWN,
    FaultProxy,
    closed_port,
    environ,
    gcs_env,
    s3_env,
)

FAST = RetryPolicy(attempts=4, initial_s=0.05, max_s=0.2, multiplier=2.0)
FAST_WAITS = 0.05 + 0.1 + 0.2  # the three backoffs between FAST's four attempts


def _unique(request) -> str:
    return request.node.name.replace("[", "-").rstrip("]")


@pytest.fixture(params=["local", "s3", "gs"])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    return f"{request.param}://{BUCKET}/{_unique(request)}"


def test_round_trip(url, tmp_path):
    store = open_storage(url, FAST)
    assert store.list() == [] and not store.exists("a/one.json")
    store.write_bytes("a/one.json", b'{"x": 1}')
    store.write_bytes("a/one.json", b'{"x": 2}')  # replaced
    store.write_bytes("a/b/two.bin", b"\x00\x01" * 10)
    big = tmp_path / "big.bin"  # over 8 MiB: S3 multipart, a GCS resumable upload
    big.write_bytes(np.random.default_rng(0).bytes(9 << 20))
    store.upload_file(big, "c/big.bin")
    assert store.list("") == ["a/b/two.bin", "a/one.json", "c/big.bin"]
    assert store.list("a/") == ["a/b/two.bin", "a/one.json"]
    assert store.list("a/o") == ["a/one.json"] and store.list("zzz") == []
    assert store.read_bytes("a/one.json") == b'{"x": 2}'
    assert store.size("c/big.bin") == 9 << 20 and store.size("a/b/two.bin") == 20
    assert store.exists("a/one.json") and not store.exists("a/none.json")
    back = tmp_path / "restore" / "back.bin"  # the directory is made
    store.download_file("c/big.bin", back)
    assert back.read_bytes() == big.read_bytes()
    assert os.listdir(back.parent) == ["back.bin"]  # no temporary file left
    store.delete_prefix("a/")
    store.delete_prefix("a/")  # already gone: fine
    assert store.list("") == ["c/big.bin"]
    with pytest.raises(StorageError, match="after 1 attempt") as e:
        store.read_bytes("a/one.json")
    assert e.value.missing and not e.value.transient and "a/one.json" in str(e.value)
    with pytest.raises(StorageError) as e:
        store.size("a/one.json")
    assert e.value.missing
    with pytest.raises(StorageError) as e:
        store.download_file("a/one.json", tmp_path / "restore" / "none.bin")
    assert e.value.missing and os.listdir(back.parent) == ["back.bin"]
    store.delete_prefix("")
    assert store.list() == []


def test_delete_prefix_deletes_like_a_directory(url):
    store = open_storage(url, FAST)
    for key in ("step_1/a", "step_1/b/c", "step_10/a", "step_1x"):
        store.write_bytes(key, b"1")
    store.delete_prefix("step_1")  # not step_10/, not step_1x
    assert store.list() == ["step_10/a", "step_1x"]
    store.delete_prefix("step_1x")  # a single key
    assert store.list() == ["step_10/a"]


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


# -- failures injected by a proxy -------------------------------------------------------------

# Per store: the endpoint fixture, the environment pointing at the proxy, the request method of
# a small write, and the bodies of a throttling and a permission answer.
STORES = {
    "s3": ("s3_endpoint", s3_env, "PUT", (SLOW_DOWN, "application/xml"),
           (ACCESS_DENIED, "application/xml")),
    "gs": ("gcs_endpoint", gcs_env, "POST", (GCS_BUSY, "application/json"),
           (GCS_DENIED, "application/json")),
}


@pytest.fixture(params=sorted(STORES))
def flaky(request):
    """(proxy, store): a proxy in front of the server that injects nothing until told, and a
    storage that talks to the server through it."""
    fixture, env, *_ = STORES[request.param]
    proxy = FaultProxy(request.getfixturevalue(fixture))
    try:
        with environ(**env(proxy.url)):
            proxy.scheme = request.param
            yield proxy, open_storage(f"{request.param}://{BUCKET}/{_unique(request)}", FAST)
    finally:
        proxy.close()


def _fail_writes(proxy, n, status=503):
    _, _, method, busy, denied = STORES[proxy.scheme]
    proxy.body, proxy.content_type = busy if status == 503 else denied
    proxy.status, proxy.when, proxy.fail, proxy.seen = status, (lambda m, p: m == method), n, 0


def test_transient_errors_are_retried_with_backoff(flaky):
    proxy, store = flaky
    _fail_writes(proxy, 3)
    t0 = time.perf_counter()
    store.write_bytes("x.json", b"{}")
    elapsed = time.perf_counter() - t0
    assert proxy.seen == 4  # 3 refusals, then the write that went through
    assert elapsed >= FAST_WAITS  # the backoff waited (jitter only ever adds)
    assert store.read_bytes("x.json") == b"{}"


@pytest.mark.parametrize("op", ["read", "list", "size", "exists", "upload", "download",
                                "delete"])
def test_every_operation_is_retried(flaky, op, tmp_path):
    proxy, store = flaky
    store.write_bytes("d/x.bin", b"12345")
    (tmp_path / "up.bin").write_bytes(b"up")
    run = {"read": lambda: store.read_bytes("d/x.bin"), "list": lambda: store.list("d/"),
           "size": lambda: store.size("d/x.bin"), "exists": lambda: store.exists("d/x.bin"),
           "upload": lambda: store.upload_file(tmp_path / "up.bin", "d/up.bin"),
           "download": lambda: store.download_file("d/x.bin", tmp_path / "down.bin"),
           "delete": lambda: store.delete_prefix("d/none")}[op]
    proxy.seen = 0
    expected = run()  # and how many requests it takes when nothing fails
    requests = proxy.seen
    proxy.fail, proxy.seen, proxy.body = 2, 0, b""  # the next two requests get a bare 503
    assert run() == expected
    assert proxy.seen == requests + 2, (requests, proxy.log)


def test_a_dropped_connection_is_retried(flaky):
    proxy, store = flaky
    _fail_writes(proxy, 2, status=None)
    store.write_bytes("x.json", b"{}")
    assert proxy.seen == 3 and store.read_bytes("x.json") == b"{}"


def test_transient_errors_beyond_the_policy_are_a_clear_error(flaky):
    proxy, store = flaky
    _fail_writes(proxy, 100)
    t0 = time.perf_counter()
    with pytest.raises(StorageError, match="after 4 attempts") as e:
        store.write_bytes("x.json", b"{}")
    assert time.perf_counter() - t0 >= FAST_WAITS
    assert e.value.transient and not e.value.missing
    assert f"{proxy.scheme}://{BUCKET}/" in str(e.value) and "x.json" in str(e.value)
    assert "503" in str(e.value) and "raise attempts" in str(e.value)
    assert proxy.seen == 4


def test_permission_denied_is_not_retried(flaky):
    proxy, store = flaky
    _fail_writes(proxy, 100, status=403)
    with pytest.raises(StorageError, match="credentials") as e:
        store.write_bytes("x.json", b"{}")
    assert not e.value.transient and "after 1 attempt:" in str(e.value)
    assert "Permission denied" in str(e.value)
    assert proxy.seen == 1


@pytest.mark.parametrize("scheme", ["local", "s3", "gs"])
def test_checkpoints_on_every_storage(scheme, request, tmp_path):
    """The manager saves and restores through each storage; on the object stores the first
    three writes are throttled, and the checkpoint does not notice."""
    if scheme == "local":
        manager = _checkpoint_round_trip(str(tmp_path / "ck"))
    else:
        fixture, env, method, (body, content_type), _ = STORES[scheme]
        proxy = FaultProxy(request.getfixturevalue(fixture), fail=3, status=503, body=body,
                           content_type=content_type, when=lambda m, p: m == method)
        try:
            with environ(**env(proxy.url)):
                manager = _checkpoint_round_trip(f"{scheme}://{BUCKET}/{_unique(request)}")
                step, digest = manager.digest()
        finally:
            proxy.close()
        assert proxy.fail == 0 and sum(s == 503 for _, _, s in proxy.log) == 3
    step, digest = manager.digest() if scheme == "local" else (step, digest)
    assert step == 16 and len(digest) == 32


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_unreachable_endpoint_is_transient(scheme):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    with environ(**(s3_env if scheme == "s3" else gcs_env)(endpoint)):
        store = open_storage(f"{scheme}://{BUCKET}/x", FAST)
        with pytest.raises(StorageError, match="after 4 attempts") as e:
            store.read_bytes("k")
    assert e.value.transient and "could not be reached" in str(e.value)


def test_a_missing_bucket_is_named(s3, gcs):
    for scheme in ("s3", "gs"):
        with pytest.raises(StorageError, match="bucket does not exist") as e:
            open_storage(f"{scheme}://no-such-bucket/x", FAST).write_bytes("a", b"1")
        assert not e.value.transient and not e.value.missing


# -- local disks --------------------------------------------------------------------------------

def _mount_tmpfs(disk: Path, size: str) -> None:
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")


def test_a_full_or_read_only_disk_is_a_clear_error_and_leaves_nothing_behind(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "1m")
    try:
        store = open_storage(disk / "ck", FAST)
        store.write_bytes("step_1/good.json", b"{}")
        with pytest.raises(StorageError, match="disk is full") as e:
            store.write_bytes("step_1/big.bin", b"\0" * (2 << 20))
        assert not e.value.transient and "after 1 attempt:" in str(e.value)  # not retried
        assert str(disk / "ck" / "step_1" / "big.bin") in str(e.value)
        # no partial file under the key, no temporary file beside it
        assert os.listdir(disk / "ck" / "step_1") == ["good.json"]
        assert store.read_bytes("step_1/good.json") == b"{}"
        big = tmp_path / "big.bin"
        big.write_bytes(b"\0" * (2 << 20))
        with pytest.raises(StorageError, match="disk is full"):
            store.upload_file(big, "step_1/big.bin")
        assert store.list() == ["step_1/good.json"]
        assert os.listdir(disk / "ck" / "step_1") == ["good.json"]

        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(StorageError, match="read-only") as e:
            store.write_bytes("step_2/other.json", b"{}")
        assert not e.value.transient and "after 1 attempt:" in str(e.value)
        with pytest.raises(StorageError, match="read-only"):
            store.delete_prefix("step_1")
        assert store.read_bytes("step_1/good.json") == b"{}"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


NOBODY = 65534
_WRITE_INTO = f"""
import json, os, sys
from podkit.checkpoint import StorageError, open_storage
target, scratch = sys.argv[1:3]
# Every module the write and its error need, loaded while this process may still read them
# (as root the interpreter may live where nobody may look, e.g. /root/.pyenv): a write that
# works, and one that fails (a file where a directory should be).
open_storage(scratch).write_bytes("a", b"1")
try:
    open_storage(os.path.join(scratch, "a", "b")).write_bytes("c", b"1")
except StorageError:
    pass
if os.geteuid() == 0:  # root writes anywhere: become nobody, for good
    os.setgroups([])
    os.setgid({NOBODY})
    os.setuid({NOBODY})
try:
    open_storage(target).write_bytes("a", b"1")
    raised = None
except StorageError as e:
    raised = {{"message": str(e), "transient": e.transient}}
print(json.dumps({{"euid": os.geteuid(), "raised": raised}}))
"""


def test_local_permission_denied(tmp_path):
    """A directory the writer may not write into (mode r-x, owned by this process's user).
    Root writes anywhere, so as root (CI) the write runs in a child that drops to the
    unprivileged uid and gid 65534 (nobody) before it: the kernel refuses it, nothing is
    mocked. Not root, the child writes as this user, whom the mode refuses."""
    base = Path(tempfile.mkdtemp(prefix="podkit-perm-"))
    try:
        base.chmod(0o755)  # nobody may look inside (pytest's tmp_path is root's alone)
        target = base / "ro"
        target.mkdir(mode=0o555)
        r = subprocess.run([sys.executable, "-c", _WRITE_INTO, str(target),
                            str(tmp_path / "scratch")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.splitlines()[-1])
        assert out["euid"] == (NOBODY if os.geteuid() == 0 else os.geteuid())
        assert out["raised"] is not None, "the write went through"
        assert "permissions" in out["raised"]["message"], out
        assert "after 1 attempt:" in out["raised"]["message"], out  # not retried
        assert not out["raised"]["transient"]
        assert os.listdir(target) == []  # nothing left behind
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_local_storage_is_a_plain_directory(tmp_path):
    store = open_storage(f"file://{tmp_path}/ck")
    assert store.local_dir() == tmp_path / "ck" and store.url == str(tmp_path / "ck")
    assert not (tmp_path / "ck").exists()  # made on the first write
    store.write_bytes("a/b.json", b"{}")
    assert (tmp_path / "ck" / "a" / "b.json").read_bytes() == b"{}"
    assert open_storage(tmp_path / "ck").list() == ["a/b.json"]


# -- configuration ------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    ("s3://", "names no bucket"),
    ("gs:///prefix", "names no bucket"),
    ("s3:/bucket/x", "without '//'"),
    ("hdfs://cluster/x", "unknown storage scheme 'hdfs'"),
    ("gcs://bucket/x", "is gs://"),
    ("file://relative/x", "absolute path"),
    ("s3://bucket/../x", "not allowed"),
    ("", "not a checkpoint location"),
])
def test_bad_urls(bad, match):
    with pytest.raises(pk.ConfigError, match=match) as e:
        open_storage(bad)
    assert repr(bad) in str(e.value)


@pytest.mark.parametrize("key", ["/etc/passwd", "../x", "a/../../x", "a//b", ""])
def test_keys_stay_under_the_root(key, tmp_path):
    with pytest.raises(pk.ConfigError, match="relative key"):
        open_storage(tmp_path).write_bytes(key, b"1")


@pytest.mark.parametrize("bad, match", [
    (dict(attempts=0), "attempts=0"),
    (dict(attempts=2.5), "attempts=2.5"),
    (dict(initial_s=-1), "initial_s=-1"),
    (dict(max_s=float("inf")), "max_s=inf"),
    (dict(multiplier=0.5), "multiplier=0.5"),
    (dict(initial_s=5, max_s=1), "max_s=1"),
])
def test_bad_retry_policies(bad, match):
    with pytest.raises(pk.ConfigError, match=match):
        RetryPolicy(**bad)


def test_a_retry_policy_backs_off_exponentially_up_to_max_s():
    policy = RetryPolicy(attempts=5, initial_s=1, max_s=3, multiplier=2)
    for attempt, base in [(1, 1), (2, 2), (3, 3), (4, 3)]:
        assert base <= policy.delay(attempt) <= base * 1.1
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise BlockingIOError(errno.EAGAIN, "try again")
        return "done"

    assert RetryPolicy(attempts=3, initial_s=0, max_s=0).call(flaky, "testing") == "done"
    assert len(calls) == 3


@pytest.mark.parametrize("error, transient, fix", [
    (ConnectionResetError(errno.ECONNRESET, "reset"), True, "could not be reached"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True, "could not be reached"),
    (TimeoutError("timed out"), True, "could not be reached"),
    (OSError(errno.EINTR, "interrupted"), True, "busy"),
    (OSError(errno.EIO, "I/O error"), False, "does not retry EIO"),
    (PermissionError(errno.EACCES, "denied"), False, "permissions"),
    (OSError(errno.EDQUOT, "quota"), False, "quota"),
    (ValueError("bad"), False, "not one podkit retries"),
])
def test_classification(error, transient, fix):
    got_transient, cause, got_fix = classify(error)
    assert got_transient == transient and fix in got_fix and type(error).__name__ in cause
    wrapped = RuntimeError("upload failed")
    wrapped.__cause__ = error  # what a wrapper wraps decides
    assert classify(wrapped)[0] == transient
