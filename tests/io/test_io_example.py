"""pk.io's Example parsing against what tf.io.parse_* returned for TF-written Examples
(tests/golden/tf/examples.*, sequence_examples.*), TF's errors, and writing."""

import numpy as np
import pytest
from tf_golden import GOLDEN, load, plain, specs

import podkit as pk
from podkit.errors import ConfigError, DataError

EXAMPLES = load("examples.json")
SEQUENCES = load("sequence_examples.json")


@pytest.fixture(scope="module")
def records():
    return list(pk.io.tf_record_iterator(GOLDEN / "examples.tfrecord"))


def test_parse_single_example_equals_tensorflow_on_every_feature_kind(records):
    spec = specs(EXAMPLES["specs"])
    assert len(records) == len(EXAMPLES["single"]) == 3
    for record, expected in zip(records, EXAMPLES["single"], strict=True):
        parsed = pk.io.parse_single_example(record, spec)
        assert parsed.keys() == expected.keys()
        for key, value in parsed.items():
            assert plain(value) == expected[key], key


def test_scalars_come_as_tf_data_gives_them(records):
    parsed = pk.io.parse_single_example(records[0], specs(EXAMPLES["specs"]))
    assert type(parsed["i"]) is np.int64 and type(parsed["f"]) is np.float32
    assert parsed["b"] == b"\x00bytes\xff" and parsed["s"] == "h\u00e9llo".encode()
    assert parsed["bl"].dtype == object and parsed["bl"].tolist() == [b"a", b"", b"ccc"]


def test_parse_example_batches_as_tensorflow_with_sparse_to_dense(records):
    parsed = pk.io.parse_example(records, specs(EXAMPLES["specs"]))
    for key, expected in EXAMPLES["batched"].items():
        assert plain(parsed[key]) == expected, key


@pytest.mark.parametrize("case", sorted(EXAMPLES["errors"]))
def test_errors_where_tensorflow_errs_name_the_key(records, case):
    info = EXAMPLES["errors"][case]
    assert info["error"] is not None  # TF erred here
    (key,) = info["spec"]
    with pytest.raises(DataError, match=repr(key)):
        pk.io.parse_single_example(records[0], specs(info["spec"]))


def test_parse_single_sequence_example_equals_tensorflow():
    records = list(pk.io.tf_record_iterator(GOLDEN / "sequence_examples.tfrecord"))
    context, sequence = specs(SEQUENCES["context"]), specs(SEQUENCES["sequence"])
    for record, expected in zip(records, SEQUENCES["parsed"], strict=True):
        c, s = pk.io.parse_single_sequence_example(record, context, sequence)
        assert {k: plain(v) for k, v in c.items()} == expected["context"]
        assert {k: plain(v) for k, v in s.items()} == expected["sequence"]


def test_a_required_feature_list_that_is_missing_names_the_key():
    record = pk.io.serialize_sequence_example({"n": 1}, {"other": [[1]]})
    with pytest.raises(DataError, match="'tokens'"):
        pk.io.parse_single_sequence_example(
            record, sequence_features={"tokens": pk.io.FixedLenSequenceFeature([], "int64")})


def test_serialize_example_round_trips_every_kind():
    values = {"int": 3, "bool": True, "float": 0.5, "bytes": b"\x00x", "str": "é",
              "ints": [1, 2, 3], "floats": np.arange(6, dtype=np.float32).reshape(2, 3),
              "strs": ["a", b"b"], "empty_floats": np.zeros(0, np.float32),
              "np_int": np.int32(-7), "feature": pk.io.Feature(
                  int64_list=pk.io.Int64List(value=[9, 8]))}
    spec = {"int": pk.io.FixedLenFeature([], np.int64),
            "bool": pk.io.FixedLenFeature([], "int64"),
            "float": pk.io.FixedLenFeature([], np.float32),
            "bytes": pk.io.FixedLenFeature([], bytes),
            "str": pk.io.FixedLenFeature([], "string"), "ints": pk.io.VarLenFeature("int64"),
            "floats": pk.io.FixedLenFeature([2, 3], "float32"),
            "strs": pk.io.VarLenFeature("string"), "empty_floats": pk.io.VarLenFeature("float"),
            "np_int": pk.io.FixedLenFeature([], "int64"),
            "feature": pk.io.FixedLenFeature([2], "int64")}
    parsed = pk.io.parse_single_example(pk.io.serialize_example(values), spec)
    assert parsed["int"] == 3 and parsed["bool"] == 1 and parsed["float"] == 0.5
    assert parsed["bytes"] == b"\x00x" and parsed["str"] == "é".encode()
    assert parsed["ints"].tolist() == [1, 2, 3] and parsed["strs"].tolist() == [b"a", b"b"]
    np.testing.assert_array_equal(parsed["floats"], values["floats"])
    assert parsed["empty_floats"].shape == (0,) and parsed["empty_floats"].dtype == np.float32
    assert parsed["np_int"] == -7 and parsed["feature"].tolist() == [9, 8]


def test_serialize_example_refuses_what_has_no_list_kind():
    with pytest.raises(ConfigError, match="'empty'"):
        pk.io.serialize_example({"empty": []})
    with pytest.raises(ConfigError, match="'mixed'"):
        pk.io.serialize_example({"mixed": [b"a", 1]})
    with pytest.raises(ConfigError, match="complex"):
        pk.io.serialize_example({"c": np.zeros(2, np.complex64)})


def test_specs_are_checked_before_parsing():
    with pytest.raises(ConfigError, match="int32"):
        pk.io.FixedLenFeature([], "int32")
    with pytest.raises(ConfigError, match="default_value"):
        pk.io.FixedLenFeature([3], "float32", default_value=1.0)  # TF reshapes: 1 value != 3
    with pytest.raises(ConfigError, match="allow_missing"):
        pk.io.parse_single_example(b"", {"s": pk.io.FixedLenSequenceFeature([], "int64")})
    with pytest.raises(ConfigError, match="'x'"):
        pk.io.parse_single_example(b"", {"x": "int64"})
    assert pk.io.FixedLenFeature(3, np.float32).shape == (3,)
    assert pk.io.VarLenFeature(np.dtype("int64")).dtype == "int64"


def test_bytes_that_are_no_example_are_a_data_error():
    with pytest.raises(DataError, match="Example"):
        pk.io.parse_single_example(b"\xff\xff\xff", {"x": pk.io.VarLenFeature("int64")})


def test_a_default_taken_by_one_parse_is_not_changed_by_writing_to_it():
    spec = {"x": pk.io.FixedLenFeature([2], "float32", default_value=[1.0, 2.0])}
    record = pk.io.serialize_example({"other": 1})
    first = pk.io.parse_single_example(record, spec)
    first["x"] += 10  # the caller's own array
    np.testing.assert_array_equal(pk.io.parse_single_example(record, spec)["x"], [1.0, 2.0])
