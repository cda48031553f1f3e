"""The path layer (podkit.paths) against a local directory, moto's S3 and the GCS emulator: the
same calls, the same answers, the same errors."""

import io
import os
import uuid

import numpy as np
import pytest

import podkit as pk
from podkit import paths
from podkit.errors import StorageError
from storage_servers import BUCKET


@pytest.fixture(params=["local", "s3", "gs"])
def root(request, tmp_path):
    """A fresh, empty directory of each kind."""
    if request.param == "local":
        return str(tmp_path / "root")
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    return f"{request.param}://{BUCKET}/paths-{uuid.uuid4().hex[:12]}"


DATA = np.random.default_rng(0).bytes(3 << 20)  # over the 1 MiB read buffer: several ranges


def test_write_then_read_by_ranges_and_seek(root):
    path = paths.join(root, "a", "blob.bin")
    with paths.open(path, "wb") as f:
        f.write(DATA)
    assert paths.exists(path) and paths.size(path) == len(DATA)
    first = paths.stat(path)
    assert first.size == len(DATA) and first.version
    with paths.open(path, "wb") as f:
        f.write(b"other bytes")
    assert paths.stat(path).version != first.version  # rewritten: another version
    with paths.open(path, "wb") as f:
        f.write(DATA)
    with paths.open(path, "rb", buffer_size=4096) as f:  # small ranges: one GET a record
        f.seek(1 << 20)
        assert f.read(10) == DATA[1 << 20:(1 << 20) + 10]
    with paths.open(path, "rb") as f:
        assert f.seekable() and f.readable()
        assert f.read(10) == DATA[:10]
        f.seek(2 << 20)
        assert f.read(5) == DATA[2 << 20:(2 << 20) + 5] and f.tell() == (2 << 20) + 5
        f.seek(-7, io.SEEK_END)
        assert f.read() == DATA[-7:] and f.read(3) == b""
        f.seek(100)
        f.seek(50, io.SEEK_CUR)
        assert f.read(1 << 20) == DATA[150:150 + (1 << 20)]
        f.seek(0)
        assert f.read() == DATA
    text = paths.join(root, "notes.txt")
    with paths.open(text, "w") as f:
        f.write("é first\nsecond\n")
    with paths.open(text, "r") as f:
        assert f.readlines() == ["é first\n", "second\n"]


def test_a_write_is_atomic_and_an_error_uploads_nothing(root):
    path = paths.join(root, "x.bin")
    with paths.open(path, "wb") as f:
        f.write(b"old")
    with pytest.raises(RuntimeError, match="boom"), paths.open(path, "wb") as f:
        f.write(b"new, half written")
        assert paths.open(path, "rb").read() == b"old"  # nothing visible before close
        raise RuntimeError("boom")
    assert paths.open(path, "rb").read() == b"old"
    with pytest.raises(RuntimeError, match="boom"), paths.open(paths.join(root, "t.txt"), "w"):
        raise RuntimeError("boom")
    assert not paths.exists(paths.join(root, "t.txt"))
    f = paths.open(paths.join(root, "dropped.bin"), "wb")
    f.write(b"never closed")
    del f  # dropped without close(): an error path, not a finished file
    assert not paths.exists(paths.join(root, "dropped.bin"))
    assert paths.listdir(root) == ["x.bin"]  # no temporary file left in sight


def test_listing_glob_and_directories(root):
    for name in ["d/train-0.rec", "d/train-1.rec", "d/test-0.rec", "d/sub/train-9.rec", "e.txt"]:
        with paths.open(paths.join(root, name), "wb") as f:
            f.write(name.encode())
    assert paths.listdir(root) == ["d", "e.txt"]
    assert paths.listdir(paths.join(root, "d")) == ["sub", "test-0.rec", "train-0.rec",
                                                    "train-1.rec"]
    assert paths.glob(paths.join(root, "d", "train-*.rec")) == [
        paths.join(root, "d", "train-0.rec"), paths.join(root, "d", "train-1.rec")]
    # '*' stays inside one segment; a matching directory is listed, as glob.glob does
    assert paths.glob(paths.join(root, "*", "train-?.rec")) == [
        paths.join(root, "d", "train-0.rec"), paths.join(root, "d", "train-1.rec")]
    assert paths.glob(paths.join(root, "d", "*")) == [
        paths.join(root, "d", n) for n in ["sub", "test-0.rec", "train-0.rec", "train-1.rec"]]
    assert paths.glob(paths.join(root, "d", "train-[1].rec")) == [
        paths.join(root, "d", "train-1.rec")]
    assert paths.glob(paths.join(root, "e.txt")) == [paths.join(root, "e.txt")]
    assert paths.glob(paths.join(root, "none-*")) == []
    assert paths.isdir(paths.join(root, "d")) and not paths.isdir(paths.join(root, "e.txt"))
    assert paths.exists(paths.join(root, "d")) and not paths.exists(paths.join(root, "dd"))
    assert not paths.isdir(paths.join(root, "d", "sub", "train-9.rec"))
    paths.makedirs(paths.join(root, "made"))  # remote: nothing to make, and no error
    with pytest.raises(StorageError) as e:
        paths.listdir(paths.join(root, "none"))
    assert e.value.missing and "none" in str(e.value)


def test_remove_rename_and_rmtree(root):
    for name in ["d/a.bin", "d/s/b.bin", "f.bin"]:
        with paths.open(paths.join(root, name), "wb") as f:
            f.write(name.encode())
    paths.rename(paths.join(root, "f.bin"), paths.join(root, "g.bin"))
    assert not paths.exists(paths.join(root, "f.bin"))
    assert paths.open(paths.join(root, "g.bin"), "rb").read() == b"f.bin"
    paths.rename(paths.join(root, "d"), paths.join(root, "moved"))
    assert not paths.exists(paths.join(root, "d"))
    assert paths.open(paths.join(root, "moved", "s", "b.bin"), "rb").read() == b"d/s/b.bin"
    paths.remove(paths.join(root, "g.bin"))
    assert paths.listdir(root) == ["moved"]
    paths.rmtree(paths.join(root, "moved"))
    assert not paths.exists(paths.join(root, "moved"))
    for missing in (lambda: paths.remove(paths.join(root, "g.bin")),
                    lambda: paths.rmtree(paths.join(root, "moved")),
                    lambda: paths.size(paths.join(root, "g.bin")),
                    lambda: paths.open(paths.join(root, "g.bin"), "rb"),
                    lambda: paths.rename(paths.join(root, "g.bin"), paths.join(root, "h"))):
        with pytest.raises(StorageError) as e:
            missing()
        assert e.value.missing and ("g.bin" in str(e.value) or "moved" in str(e.value))


def test_local_copy_downloads_once_per_version(root):
    path = paths.join(root, "w.bin")
    with paths.open(path, "wb") as f:
        f.write(b"one")
    with paths.local_copy(path) as local:
        assert open(local, "rb").read() == b"one"
        first = local
    with paths.local_copy(path) as local:
        assert local == first  # unchanged: the same download
    if not paths.is_url(root):
        assert first == path  # a local path is its own copy
    with paths.open(path, "wb") as f:
        f.write(b"two!")
    with paths.local_copy(path) as local:
        assert open(local, "rb").read() == b"two!"
    for name in ["dir/a", "dir/s/b"]:
        with paths.open(paths.join(root, name), "wb") as f:
            f.write(name.encode())
    with paths.local_copy(paths.join(root, "dir")) as local:
        assert sorted(os.listdir(local)) == ["a", "s"]
        assert open(os.path.join(local, "s", "b"), "rb").read() == b"dir/s/b"
    with pytest.raises(StorageError) as e:
        with paths.local_copy(paths.join(root, "nothing")):
            pass
    assert e.value.missing


def test_staged_puts_files_and_directories_in_place(root):
    with paths.staged(paths.join(root, "f.txt")) as local:
        with open(local, "w") as f:
            f.write("staged")
    assert paths.open(paths.join(root, "f.txt"), "r").read() == "staged"
    with paths.staged(paths.join(root, "private.bin")) as local:
        os.close(os.open(local, os.O_CREAT | os.O_WRONLY, 0o600))  # as mkstemp-based writers
    if not paths.is_url(root):  # put in place with the mode open() gives, not 0o600
        umask = os.umask(0)
        os.umask(umask)
        assert os.stat(paths.join(root, "private.bin")).st_mode & 0o777 == 0o666 & ~umask
    paths.remove(paths.join(root, "private.bin"))
    target = paths.join(root, "model")
    for version, names in [(1, ["a", "old", "s/b"]), (2, ["a", "s/b", "s/c"])]:
        with paths.staged(target) as local:
            for name in names:
                os.makedirs(os.path.dirname(os.path.join(local, name)), exist_ok=True)
                with open(os.path.join(local, name), "w") as f:
                    f.write(f"{version}{name}")
    assert paths.listdir(target) == ["a", "s"]  # "old" went with version 1
    assert paths.listdir(paths.join(target, "s")) == ["b", "c"]
    assert paths.open(paths.join(target, "s", "c"), "r").read() == "2s/c"
    with pytest.raises(RuntimeError, match="boom"), paths.staged(target) as local:
        os.makedirs(local)
        with open(os.path.join(local, "a"), "w") as f:
            f.write("3a")
        raise RuntimeError("boom")
    assert paths.open(paths.join(target, "a"), "r").read() == "2a"  # untouched
    assert paths.listdir(root) == ["f.txt", "model"]  # no staging left behind
    with pytest.raises(StorageError, match="nothing was written"), \
            paths.staged(paths.join(root, "empty")):
        pass


@pytest.mark.parametrize("bad, match", [
    ("s3://", "names no bucket"),
    ("gs:///x", "names no bucket"),
    ("s3:/bucket/x", "without '//'"),
    ("gs:/bucket/x", "without '//'"),
    ("s3//bucket/x", "without its ':'"),
    ("GS//bucket/x", "without its ':'"),
    ("gcs://bucket/x", "is gs://"),
    ("hdfs://cluster/x", "unknown storage scheme"),
    ("gs://bucket/a/../x", "not allowed"),
    ("", "not a path"),
])
def test_bad_urls_are_config_errors_and_make_nothing(bad, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls = [paths.is_url, paths.exists, paths.isdir, paths.listdir, paths.makedirs,
             paths.glob, paths.size, paths.remove, paths.rmtree,
             lambda p: paths.open(p, "wb"), lambda p: paths.staged(p).__enter__(),
             lambda p: paths.local_copy(p).__enter__()]
    for call in calls:
        with pytest.raises(pk.ConfigError, match=match) as e:
            call(bad)
        assert repr(bad) in str(e.value)
    assert os.listdir(tmp_path) == []  # no local folder called "s3:" or "gs:"


def test_is_url_join_and_modes(tmp_path):
    assert paths.is_url("gs://b/x") and paths.is_url("S3://b") and not paths.is_url("a/b")
    assert not paths.is_url(tmp_path) and not paths.is_url("file:///tmp/x")
    assert paths.join("gs://b/", "x/", "y") == "gs://b/x/y"
    assert paths.join(tmp_path, "x") == str(tmp_path / "x")
    with pytest.raises(pk.ConfigError, match="mode='ab'"):
        paths.open(tmp_path / "x", "ab")
    with pytest.raises(pk.ConfigError, match="buffer_size=0"):
        paths.open(tmp_path / "x", buffer_size=0)
    with pytest.raises(pk.ConfigError, match="is a bucket"):
        paths.open("gs://b", "wb")
    with paths.open(f"file://{tmp_path}/y.txt", "w") as f:
        f.write("file url")
    assert (tmp_path / "y.txt").read_text() == "file url"


def test_a_file_replaced_while_read_is_an_error(s3):
    path = f"s3://{BUCKET}/paths-{uuid.uuid4().hex[:12]}/v.bin"
    with paths.open(path, "wb") as f:
        f.write(DATA)
    with paths.open(path, "rb") as reader:
        reader.read(10)
        with paths.open(path, "wb") as f:
            f.write(DATA[::-1])
        reader.seek(2 << 20)
        with pytest.raises(StorageError, match="replaced while it was being read"):
            reader.read(10)


def test_a_missing_bucket_is_named(s3, gcs):
    for scheme in ("s3", "gs"):
        with pytest.raises(StorageError, match="bucket does not exist"):
            paths.exists(f"{scheme}://no-such-bucket/x")
        with pytest.raises(StorageError, match="bucket does not exist"):
            with paths.open(f"{scheme}://no-such-bucket/x", "wb") as f:
                f.write(b"1")


def test_verbs_take_the_arguments_of_what_they_mirror():
    import builtins
    import glob as stdlib_glob
    import inspect
    import shutil

    def params(fn, *names):
        sig = inspect.signature(fn).parameters
        return [(n, sig[n].default, sig[n].kind == inspect.Parameter.KEYWORD_ONLY)
                for n in names]

    assert params(paths.makedirs, "name", "mode", "exist_ok") == params(
        os.makedirs, "name", "mode", "exist_ok")
    assert params(paths.listdir, "path") == params(os.listdir, "path")
    assert params(paths.rmtree, "ignore_errors") == params(shutil.rmtree, "ignore_errors")
    assert params(paths.glob, "pathname", "include_hidden") == params(
        stdlib_glob.glob, "pathname", "include_hidden")
    assert params(paths.open, "mode")[0][1] == params(builtins.open, "mode")[0][1] == "r"


def _outcome(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except (OSError, StorageError):
        return "error"
    return "ok"


def test_makedirs_as_os_makedirs(root, tmp_path):
    """Each call's outcome is os.makedirs's on a local twin of the same tree."""
    twin = tmp_path / "twin"
    twin.mkdir()
    with paths.open(paths.join(root, "d", "f.bin"), "wb") as f:
        f.write(b"x")
    (twin / "d").mkdir()
    (twin / "d" / "f.bin").write_bytes(b"x")
    for rel, kw in [("d", {}), ("d", {"exist_ok": True}), ("d/f.bin", {}),
                    ("d/f.bin", {"exist_ok": True}), ("new/deep", {}),
                    ("new/deep", {"exist_ok": True})]:
        theirs = _outcome(os.makedirs, twin / rel, **kw)
        ours = _outcome(paths.makedirs, paths.join(root, *rel.split("/")), **kw)
        if rel.startswith("new") and paths.is_url(root):
            assert ours == "ok", (rel, kw)  # nothing is made, so it never exists after
            continue
        assert ours == theirs, (rel, kw)
    with pytest.raises(StorageError, match="exist_ok=True"):
        paths.makedirs(paths.join(root, "d"))
    if not paths.is_url(root):
        paths.makedirs(paths.join(root, "m"), mode=0o700)
        assert os.stat(paths.join(root, "m")).st_mode & 0o777 == 0o700 & ~_umask()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_rmtree_ignore_errors_and_listdir_here(root, tmp_path, monkeypatch):
    import shutil

    shutil.rmtree(tmp_path / "none", ignore_errors=True)  # the stdlib: no error
    paths.rmtree(paths.join(root, "none"), ignore_errors=True)
    with pytest.raises(StorageError):
        paths.rmtree(paths.join(root, "none"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.txt").write_text("x")
    assert paths.listdir() == sorted(os.listdir())


def test_glob_hides_dot_names_as_glob_glob(root, tmp_path):
    import glob as stdlib_glob

    names = ["a.rec", ".b.rec", "s/c.rec", ".h/d.rec"]
    twin = tmp_path / "twin"
    for name in names:
        with paths.open(paths.join(root, *name.split("/")), "wb") as f:
            f.write(b"x")
        (twin / name).parent.mkdir(parents=True, exist_ok=True)
        (twin / name).write_bytes(b"x")
    for pattern in ["*.rec", "*/*.rec", "*", ".*", ".h/*", "[.a]*"]:
        for hidden in (False, True):
            theirs = sorted(os.path.relpath(p, twin) for p in stdlib_glob.glob(
                str(twin / pattern), include_hidden=hidden))
            ours = [p[len(root) + 1:] for p in paths.glob(paths.join(root, pattern),
                                                          include_hidden=hidden)]
            assert ours == theirs, (pattern, hidden)


def test_rename_refuses_what_os_rename_refuses(root, tmp_path):
    """os.rename's answers on a local twin: a file onto a directory, a directory onto a file
    or onto a directory that holds something, a directory into itself; a path onto itself
    is nothing (an object copied onto itself and deleted would be lost)."""
    twin = tmp_path / "twin"
    for name in ["f.bin", "g.bin", "d/a.bin", "e/b.bin"]:
        with paths.open(paths.join(root, *name.split("/")), "wb") as f:
            f.write(name.encode())
        (twin / name).parent.mkdir(parents=True, exist_ok=True)
        (twin / name).write_bytes(name.encode())
    for src, dst in [("f.bin", "d"), ("d", "f.bin"), ("d", "e"), ("d", "d/inner"),
                     ("f.bin", "f.bin"), ("d", "d"), ("f.bin", "g.bin")]:
        theirs = _outcome(os.rename, twin / src, twin / dst)
        ours = _outcome(paths.rename, paths.join(root, *src.split("/")),
                        paths.join(root, *dst.split("/")))
        assert ours == theirs, (src, dst)
    assert paths.open(paths.join(root, "g.bin"), "rb").read() == b"f.bin"
    assert paths.listdir(paths.join(root, "e")) == ["b.bin"]  # not merged with d's
    assert paths.open(paths.join(root, "d", "a.bin"), "rb").read() == b"d/a.bin"
