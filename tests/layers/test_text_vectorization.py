"""pk.layers.TextVectorization against Keras 3's own outputs (tests/golden/keras/
text_vectorization.json, written with TensorFlow by make_text_vectorization.py beside it), and
its use in pk.data pipelines, its config and its errors. No TensorFlow here."""

import importlib.util
import json
import os
import pickle
import string
import time
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit import paths
from podkit.errors import ConfigError, InputError
from podkit.layers.text import _PUNCTUATION, DEFAULT_STRIP_REGEX

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "keras" /
                     "text_vectorization.json").read_text())
CASES = {case["name"]: case for case in GOLDEN["cases"]}
CORPUS = GOLDEN["corpus"]
TV = pk.layers.TextVectorization


def _kwargs(case: dict) -> dict:
    kwargs = dict(case["kwargs"])
    if isinstance(kwargs.get("ngrams"), list):
        kwargs["ngrams"] = tuple(kwargs["ngrams"])  # JSON made Keras's tuple a list
    if case["vocabulary"] is not None:
        kwargs["vocabulary"] = case["vocabulary"]
    if case["idf_weights"] is not None:
        kwargs["idf_weights"] = case["idf_weights"]
    return kwargs


def _layer(case: dict, tmp_path: Path) -> TV:
    """The layer a golden case describes, given its vocabulary as Keras's was; batches come
    through a pk.data Dataset of the same batches."""
    kwargs = _kwargs(case)
    if case["vocabulary_file"] is not None:
        path = tmp_path / "vocabulary.txt"
        path.write_text("\n".join(case["vocabulary_file"]) + "\n", encoding="utf-8")
        kwargs["vocabulary"] = str(path)
    layer = TV(**kwargs)
    if case["adapt"] is not None:
        layer.adapt(case["adapt"])
    if case["batches"] is not None:
        sizes = [len(b) for b in case["batches"]]
        ds = pk.data.Dataset.from_tensor_slices(sum(case["batches"], [])).batch(sizes[0])
        assert [len(b) for b in ds] == sizes  # the batches Keras adapted on
        layer.adapt(ds)
    return layer


@pytest.mark.parametrize("name", sorted(CASES))
def test_equal_to_keras(name, tmp_path):
    case = CASES[name]
    layer = _layer(case, tmp_path)
    result = case["result"]
    assert layer.get_vocabulary() == result["vocabulary"]
    assert layer.get_vocabulary(include_special_tokens=False) == \
        result["vocabulary_no_special"]
    assert layer.vocabulary_size() == result["vocabulary_size"]
    for call, want in zip(case["calls"], result["outputs"], strict=True):
        x = call["input"]
        if call.get("bytes"):
            x = np.array([s.encode() for s in x], dtype=object)
        got = layer(x)
        assert isinstance(got, np.ndarray)
        assert list(got.shape) == want["shape"], call
        assert str(got.dtype) == want["dtype"], call
        if got.dtype.kind == "f":
            # The special tokens' weight is the mean of the others in float32: TF's reduction
            # order is not numpy's, so one ulp apart.
            np.testing.assert_allclose(got, np.asarray(want["output"], np.float32), rtol=1e-6,
                                       atol=1e-6)
        else:
            np.testing.assert_array_equal(got, np.asarray(want["output"], got.dtype))
    # Keras's config keys are all there (podkit adds has_input_vocabulary).
    assert set(result["keras_config_keys"]) <= set(layer.get_config())


def test_golden_covers_every_mode_and_option():
    """The fixture was made on every output mode, standardize and split value, and both ways
    of getting a vocabulary: a guard against regenerating it with fewer cases."""
    kwargs = [c["kwargs"] for c in GOLDEN["cases"]]
    assert {k.get("output_mode", "int") for k in kwargs} == {"int", "multi_hot", "count",
                                                             "tf_idf"}
    assert {k.get("standardize", "lower_and_strip_punctuation") for k in kwargs} == {
        "lower_and_strip_punctuation", "lower", "strip_punctuation", None}
    assert {k.get("split", "whitespace") for k in kwargs} == {"whitespace", "character", None}
    assert any(c["batches"] for c in GOLDEN["cases"])
    assert any(c["vocabulary_file"] for c in GOLDEN["cases"])


def test_strip_regex_is_keras_s():
    """The class in Keras's source (read, not imported: importing Keras costs seconds), and
    what podkit deletes: ASCII punctuation, all of it."""
    spec = importlib.util.find_spec("keras")
    if spec is None:
        pytest.skip("keras is not installed")
    source = Path(spec.origin).parent / "src/layers/preprocessing/text_vectorization.py"
    assert f"r'{DEFAULT_STRIP_REGEX}'" in source.read_text()
    assert sorted(_PUNCTUATION.decode()) == sorted(string.punctuation)


@pytest.fixture(scope="module")
def adapted():
    layer = TV(max_tokens=30, output_sequence_length=8)
    layer.adapt(CORPUS)
    return layer


def test_adapt_on_a_dataset_of_pairs_reads_the_text(adapted):
    labels = np.arange(len(CORPUS))
    ds = pk.data.Dataset.from_tensor_slices((np.array(CORPUS), labels)).batch(3)
    layer = TV(max_tokens=30, output_sequence_length=8)
    layer.adapt(ds)
    assert layer.get_vocabulary() == adapted.get_vocabulary()


def test_adapt_steps_stops_an_endless_dataset():
    ds = pk.data.Dataset.from_tensor_slices(["a a b", "c"]).batch(1).repeat()
    layer = TV()
    layer.adapt(ds, steps=1)  # the first batch only: "c" never seen
    assert layer.get_vocabulary() == ["", "[UNK]", "a", "b"]


def test_map_in_worker_processes_equals_the_batch_call(adapted):
    """The layer travels to pk.data's worker processes with the pipeline and gives there what
    it gives here. Elements come from this process until a worker is up, so read an endless
    stream until one came from a worker."""

    def vectorize(text, label):
        time.sleep(0.002)  # this process, computing until a worker is up, leaves it the cores
        return adapted(text), label, np.int64(os.getpid())

    texts = np.array(CORPUS)
    want = adapted(texts)
    ds = pk.data.Dataset.from_tensor_slices((texts, np.arange(len(texts)))).repeat().map(
        vectorize, num_parallel_calls=1)
    deadline = time.monotonic() + 120
    with iter(ds) as it:
        for n, (ids, label, pid) in enumerate(it):
            np.testing.assert_array_equal(ids, want[label])
            assert label == n % len(texts)  # in order
            if pid != os.getpid() and n >= len(texts):
                break
            assert time.monotonic() < deadline, "no element came from a worker in 120 s"


def test_map_over_batches_of_bytes(adapted):
    """TextLineDataset's elements are bytes: batched, an object array of them."""
    ds = pk.data.Dataset.from_tensor_slices([s.encode() for s in CORPUS]).batch(5).map(adapted)
    np.testing.assert_array_equal(np.concatenate(list(ds)), adapted(CORPUS))


def test_config_round_trip_keeps_the_adapted_vocabulary():
    layer = TV(max_tokens=20, output_mode="tf_idf", pad_to_max_tokens=True, ngrams=(1, 2))
    layer.adapt(CORPUS)
    config = json.loads(json.dumps(pk.layers.serialize(layer)))  # as a saved model holds it
    again = pk.layers.deserialize(config)
    assert isinstance(again, TV) and again.get_vocabulary() == layer.get_vocabulary()
    np.testing.assert_array_equal(again(CORPUS), layer(CORPUS))
    again.adapt(["one two"])  # adapted, not given: it adapts again, as Keras's loaded one
    assert again.get_vocabulary() == ["[UNK]", "two", "one two", "one"]


def test_from_a_keras_config():
    """What Keras's get_config() writes (its dtype policy, vocabulary_size, ngrams as a
    list) builds the layer."""
    config = {"name": "tv", "trainable": True, "dtype": {
        "module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
        "registered_name": None}, "max_tokens": None, "standardize": "lower", "split":
        "whitespace", "ngrams": [1, 2], "output_mode": "int", "output_sequence_length": 4,
        "pad_to_max_tokens": False, "sparse": False, "ragged": False,
        "vocabulary": ["a", "b", "a b"], "idf_weights": None, "encoding": "utf-8",
        "vocabulary_size": 5}
    layer = TV.from_config(config)
    np.testing.assert_array_equal(layer(["A b c"]), [[2, 3, 1, 4]])
    with pytest.raises(ConfigError, match="vocabulary_size=9"):
        TV.from_config({**config, "vocabulary_size": 9})
    with pytest.raises(ConfigError, match="serialized function"):
        TV.from_config({**config, "standardize": {"class_name": "function"}})


def test_ragged_gives_a_list_of_arrays(adapted):
    layer = TV(vocabulary=adapted.get_vocabulary(), ragged=True)
    rows = layer(CORPUS[:3])
    dense = adapted(CORPUS[:3])
    assert [len(r) for r in rows] == [len(s.split()) for s in CORPUS[:3]]
    for row, want in zip(rows, dense, strict=True):
        assert row.dtype == np.int64
        np.testing.assert_array_equal(row[:8], want[:len(row[:8])])


def test_callables_take_numpy_strings():
    def shout(x):
        assert isinstance(x, np.ndarray) and x.dtype.kind == "U"
        return np.char.upper(x)

    def on_commas(x):
        return [s.split(",") for s in x]

    layer = TV(standardize=shout, split=on_commas, vocabulary=["A", "B C"])
    np.testing.assert_array_equal(layer(["a,b c,d", "b c"]), [[2, 3, 1], [3, 0, 0]])


def test_set_vocabulary_replaces_it_and_pickles():
    layer = TV(output_mode="count")
    layer.set_vocabulary(["x", "y"])
    np.testing.assert_array_equal(layer(["x y y z"]), [[1, 1, 2]])
    layer.set_vocabulary(["[UNK]", "z"])  # the special token leads: not a term
    assert layer.get_vocabulary() == ["[UNK]", "z"]
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(layer))(["x z"]), [[1, 1]])


@pytest.mark.parametrize("kwargs,match", [
    ({"output_mode": "multi-hot"}, "output_mode='multi-hot'"),
    ({"sparse": True}, "sparse=True"),
    ({"output_mode": "multi_hot", "output_sequence_length": 8}, "output_sequence_length=8"),
    ({"output_sequence_length": 0}, "output_sequence_length=0"),
    ({"standardize": "lowercase"}, "standardize='lowercase'"),
    ({"split": "space"}, "split='space'"),
    ({"ngrams": 0}, "ngrams=0"),
    ({"max_tokens": 1}, "max_tokens=1"),
    ({"pad_to_max_tokens": True}, "pad_to_max_tokens"),
    ({"ragged": True, "output_mode": "count"}, "ragged=True"),
    ({"encoding": "utf-9"}, "encoding='utf-9'"),
    ({"output_mode": "tf_idf", "vocabulary": ["a"]}, "idf_weights"),
    ({"idf_weights": [1.0], "vocabulary": ["a"]}, "idf_weights"),
    ({"vocabulary": ["a", "b", "a"]}, r"repeats terms \['a'\]"),
    ({"vocabulary": ["a", ""]}, "mask token '' at index 1"),
    ({"vocabulary": ["a", "b"], "max_tokens": 3}, "max_tokens=3"),
    ({"vocabulary": "/no/such/vocab.txt"}, "/no/such/vocab.txt"),
    ({"dtype": "int64"}, "dtype='int64'"),
    ({"oov_token": "?"}, "oov_token"),
])
def test_bad_arguments_name_the_value(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TV(**kwargs)


def test_bad_uses_say_what_to_do(adapted):
    with pytest.raises(ConfigError, match="was given its vocabulary"):
        TV(vocabulary=["a"]).adapt(["a b"])
    with pytest.raises(ConfigError, match="no tokens"):
        TV().adapt([""])
    with pytest.raises(ConfigError, match="no vocabulary yet"):
        TV(output_mode="multi_hot")(["a"])
    with pytest.raises(InputError, match="dtype int32"):
        adapted(np.arange(3, dtype=np.int32))
    with pytest.raises(InputError, match=r"shape \(2, 2\)"):
        adapted(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(InputError, match="int 3"):
        adapted(["a", 3])
    with pytest.raises(ConfigError, match=r"lambda x, y: \(vectorizer\(x\), y\)"):
        adapted(np.array(["a"]), np.array([0]))


def test_a_model_cannot_hold_it(adapted):
    """As Keras on JAX (which fails with "Invalid dtype: str"), but naming the fix."""
    with pytest.raises(ConfigError, match=r"ds\.map"):
        pk.Sequential([adapted, pk.layers.Embedding(30, 4)])
    with pytest.raises(ConfigError, match=r"ds\.map"):
        adapted(pk.Input(shape=(1,)))

    class Classifier(pk.Model):
        def __init__(self):
            super().__init__()
            self.vectorize = adapted
            self.embed = pk.layers.Embedding(30, 4)

        def call(self, x, training=False):
            return self.embed(self.vectorize(x))

    model = Classifier()
    model.compile("sgd", "mse")
    with pytest.raises(ConfigError, match=r"called inside a model.*ds\.map"):
        model.fit(np.zeros((8, 8)), np.zeros((8, 8, 4)), verbose=0)


@pytest.mark.parametrize("store,url", [("s3", "s3://podkit/text/vocab.txt"),
                                       ("gcs", "gs://podkit/text/vocab.txt")])
def test_vocabulary_file_in_object_storage(store, url, request):
    request.getfixturevalue(store)  # the local server of tests/storage_servers.py
    with paths.open(url, "wb") as f:
        f.write("the\nfox\nécole\r\n".encode())
    layer = TV(vocabulary=url)
    assert layer.get_vocabulary() == ["", "[UNK]", "the", "fox", "école"]
    with pytest.raises(ConfigError, match=url.replace(".", r"\.") + "x"):
        TV(vocabulary=url + "x")


def test_int_mode_without_a_vocabulary_is_an_error_as_in_keras():
    """Keras errs ("Table not initialized"); ids all [UNK] would train a model on a constant."""
    with pytest.raises(ConfigError, match=r"no vocabulary yet.*adapt"):
        pk.layers.TextVectorization()(["a b"])


def test_fit_on_strings_names_text_vectorization():
    model = pk.Sequential([pk.Input((1,)), pk.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(InputError, match=r"TextVectorization.*ds\.map"):
        model.fit(np.array([["a cat"], ["a dog"]]), np.array([0, 1]), verbose=0)


def test_export_says_how_a_savedmodel_is_made():
    model = pk.Sequential([pk.Input((4,)), pk.layers.Dense(2)])
    with pytest.raises(ConfigError, match=r"\.keras.*keras\.saving\.load_model.*export"):
        model.export("saved")
