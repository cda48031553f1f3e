"""TFRecord framing, writing and reading against files tf.io.TFRecordWriter wrote
(tests/golden/tf/*.tfrecord*, records.json)."""

import gzip
import os

import numpy as np
import pytest
from tf_golden import GOLDEN, load, unhex

import podkit as pk
from podkit.errors import ConfigError, DataError
from podkit.io import tfrecord

INFO = load("records.json")
RECORDS = unhex(INFO["records"])
FILES = {"": "plain.tfrecord", "GZIP": "gzip.tfrecord.gz", "ZLIB": "zlib.tfrecord.z"}


@pytest.mark.parametrize("compression", ["", "GZIP", "ZLIB"])
def test_reads_the_records_tensorflow_wrote(compression):
    got = list(pk.io.tf_record_iterator(GOLDEN / FILES[compression], compression or None))
    assert got == RECORDS


@pytest.mark.parametrize("compression", ["", "ZLIB"])
def test_writes_the_bytes_tensorflow_writes(tmp_path, compression):
    path = tmp_path / "out.tfrecord"
    with pk.io.TFRecordWriter(path, pk.io.TFRecordOptions(compression or None)) as w:
        for r in RECORDS:
            w.write(r)
    assert path.read_bytes() == (GOLDEN / FILES[compression]).read_bytes()


def test_gzip_holds_the_bytes_of_the_plain_file(tmp_path):
    path = tmp_path / "out.tfrecord.gz"
    with pk.io.TFRecordWriter(path, "GZIP") as w:
        for r in RECORDS:
            w.write(r)
    assert gzip.decompress(path.read_bytes()) == (GOLDEN / "plain.tfrecord").read_bytes()


def test_index_gives_the_record_offsets_and_the_end():
    offsets = tfrecord.index(GOLDEN / "plain.tfrecord")
    sizes = [16 + len(r) for r in RECORDS]
    assert offsets.tolist() == np.concatenate([[0], np.cumsum(sizes)]).tolist()
    assert offsets[-1] == os.path.getsize(GOLDEN / "plain.tfrecord")


@pytest.mark.parametrize("name", ["corrupt", "truncated", "bad_length"])
def test_damage_is_a_data_error_naming_file_and_offset_after_tensorflows_records(name):
    path = str(GOLDEN / f"{name}.tfrecord")
    expected = unhex(INFO[name]["records"])
    assert INFO[name]["error"].startswith("DataLossError")
    got = []
    with pytest.raises(DataError) as e:
        for r in pk.io.tf_record_iterator(path):
            got.append(r)
    assert got == expected
    bad = INFO["small_offsets"][len(expected)]
    assert path in str(e.value) and f"byte offset {bad}" in str(e.value)


def test_index_ends_a_file_at_its_first_bad_record():
    offsets = tfrecord.index(GOLDEN / "corrupt.tfrecord")
    small = INFO["small_offsets"]
    assert offsets.tolist() == [*small[:3], os.path.getsize(GOLDEN / "corrupt.tfrecord")]


def test_a_failed_with_block_leaves_no_file(tmp_path):
    path = tmp_path / "x.tfrecord"
    with pytest.raises(RuntimeError), pk.io.TFRecordWriter(path) as w:
        w.write(b"one")
        raise RuntimeError("stop")
    assert not path.exists() and os.listdir(tmp_path) == []


def test_writer_takes_text_as_utf8_and_refuses_other_values_and_writes_after_close(tmp_path):
    w = pk.io.TFRecordWriter(tmp_path / "x.tfrecord")
    w.write("h\u00e9")  # as TF's writer: UTF-8
    with pytest.raises(ConfigError, match="serialize"):
        w.write({"label": 1})
    w.close()
    with pytest.raises(ConfigError, match="closed"):
        w.write(b"x")
    assert list(pk.io.tf_record_iterator(tmp_path / "x.tfrecord")) == ["h\u00e9".encode()]


def test_unknown_compression_is_a_config_error():
    with pytest.raises(ConfigError, match="BZ2"):
        pk.io.TFRecordOptions("BZ2")


def test_a_compressed_file_read_as_plain_is_a_data_error():
    with pytest.raises(DataError, match="gzip.tfrecord.gz"):
        list(pk.io.tf_record_iterator(GOLDEN / "gzip.tfrecord.gz"))


def test_a_writer_never_closed_keeps_its_records_at_exit(tmp_path):
    """TF's writer leaves its records in the file when a script forgets close(): so does
    podkit's (finished when collected or at the interpreter's exit)."""
    import subprocess
    import sys

    script = ("import podkit as pk\n"
              "w = pk.io.TFRecordWriter('left-open.tfrecord')\n"
              "for i in range(3):\n"
              "    w.write(pk.io.serialize_example({'id': i}))\n"
              "dropped = pk.io.TFRecordWriter('dropped.tfrecord')\n"
              "dropped.write(b'x')\n"
              "del dropped\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    records = list(tfrecord.tf_record_iterator(str(tmp_path / "left-open.tfrecord")))
    assert len(records) == 3
    assert list(tfrecord.tf_record_iterator(str(tmp_path / "dropped.tfrecord"))) == [b"x"]
    assert not [p for p in os.listdir(tmp_path) if "tmp" in p]  # no temporary file left
