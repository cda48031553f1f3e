"""pk.data's files on local paths, `s3://` and `gs://` alike (moto's S3 server and a GCS
emulator on loopback): file names and globs, TextLineDataset, ArrayRecordDataset,
write_array_record, Dataset.list_files and cache(filename)."""

import gzip
import os

import numpy as np
import pytest

import podkit as pk
from podkit import paths
from storage_servers import BUCKET

D = pk.data.Dataset


@pytest.fixture(params=["local", "s3", "gs"])
def root(request, tmp_path):
    """A fresh directory or URL prefix per test."""
    if request.param == "local":
        return str(tmp_path / "store")
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    name = request.node.name.replace("[", "-").rstrip("]")
    return f"{request.param}://{BUCKET}/{name}"


def _put(path: str, data: bytes) -> None:
    with paths.open(path, "wb") as f:
        f.write(data)


def _listing(root: str) -> list[str]:
    return [os.path.basename(p) for p in paths.glob(paths.join(root, "*"))]


def test_text_lines_from_paths_and_globs(root):
    _put(paths.join(root, "b.txt"), b"b1\r\nb2\n")
    _put(paths.join(root, "a.txt"), b"a1\na2\n\na4")
    _put(paths.join(root, "a.gz"), gzip.compress(b"z1\nz2\n"))
    ds = pk.data.TextLineDataset(paths.join(root, "*.txt"))
    assert list(ds) == [b"a1", b"a2", b"", b"a4", b"b1", b"b2"]
    assert ds.cardinality() == 6
    assert list(pk.data.TextLineDataset([paths.join(root, "b.txt")]).skip(1)) == [b"b2"]
    gz = pk.data.TextLineDataset(paths.join(root, "a.gz"), compression_type="GZIP")
    assert list(gz) == [b"z1", b"z2"]


def test_a_missing_file_or_an_empty_glob_is_an_input_error_naming_it(root):
    _put(paths.join(root, "here.txt"), b"x\n")
    missing = paths.join(root, "nope.txt")
    with pytest.raises(pk.errors.InputError, match=f"no file matches '{missing}'"):
        pk.data.TextLineDataset(missing)
    with pytest.raises(pk.errors.InputError, match=r"ArrayRecordDataset: no file matches .*"
                       r"\*\.array_record"):
        pk.data.ArrayRecordDataset(paths.join(root, "*.array_record"))


def test_write_and_read_array_records(root):
    prefix = paths.join(root, "out", "part")
    names = pk.data.write_array_record([str(i).encode() for i in range(10)], prefix, 3)
    assert names == [f"{prefix}-{i:05d}-of-00003.array_record" for i in range(3)]
    assert all(paths.exists(n) for n in names)
    assert _listing(paths.join(root, "out")) == [os.path.basename(n) for n in names]
    ds = pk.data.ArrayRecordDataset(paths.join(root, "out", "part-*"))
    assert list(ds) == [str(i).encode() for i in range(10)]
    assert list(ds.shuffle(10, seed=1).take(3)) == list(ds.shuffle(10, seed=1).take(3))
    assert ds.cardinality() == 10
    assert not os.path.exists("gs:") and not os.path.exists("s3:")  # never a local folder


def test_a_failed_write_leaves_nothing(root):
    def gen():
        yield b"a"
        yield b"b"
        raise RuntimeError("source broke")

    prefix = paths.join(root, "bad", "part")
    with pytest.raises(RuntimeError, match="source broke"):
        pk.data.write_array_record(D.from_generator(gen).map(lambda x: x), prefix, 2)
    with pytest.raises(pk.errors.InputError, match="element 1 is a int"):
        pk.data.write_array_record([b"ok", 3], prefix, 2)
    assert paths.glob(paths.join(root, "bad", "*")) == []


def test_list_files(root):
    for name in ("b.txt", "a.txt", "c.log"):
        _put(paths.join(root, name), name.encode())
    ds = D.list_files(paths.join(root, "*.txt"), shuffle=False)
    assert list(ds) == [paths.join(root, n).encode() for n in ("a.txt", "b.txt")]
    # every name a pattern list matches, sorted together (duplicates kept), as tf.data
    both = D.list_files([paths.join(root, "*.log"), paths.join(root, "a.txt")], shuffle=False)
    assert list(both) == [paths.join(root, n).encode() for n in ("a.txt", "c.log")]
    read = ds.interleave(lambda f: pk.data.TextLineDataset(f), cycle_length=2)
    assert sorted(read) == [b"a.txt", b"b.txt"]
    with pytest.raises(pk.errors.InputError, match="no files matched pattern: .*zzz"):
        D.list_files(paths.join(root, "*.zzz"))


def test_cache_to_a_file_there(root):
    name = paths.join(root, "cache", "c")
    ds = D.range(5).map(lambda v: {"v": v, "sq": np.full(2, v * v)})
    first = [e["sq"].tolist() for e in ds.cache(name)]
    assert first == [[v * v] * 2 for v in range(5)]
    assert paths.exists(name + ".podkit_cache.array_record")
    again = ds.cache(name)
    assert [e["sq"].tolist() for e in again] == first
    assert [int(e["v"]) for e in again.shuffle(5, seed=0)] != list(range(5))  # random access
    with pytest.raises(pk.errors.InputError, match="written by another pipeline"):
        list(D.range(6).cache(name))
