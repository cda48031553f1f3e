"""Writes tests/golden/keras/text_vectorization.json: Keras 3's own TextVectorization (TensorFlow
backend) on a small corpus, in every mode and option that matters, for
tests/layers/test_text_vectorization.py to compare podkit's against in CI, where there is no
TensorFlow. pytest does not collect this file (its name does not start with test_).

    KERAS_BACKEND=tensorflow .venv/bin/python tests/golden/keras/make_text_vectorization.py

Each case records the layer's arguments, how it got its vocabulary (adapt on a list, adapt on
batches, a vocabulary list or file), the inputs it was called on, and what Keras gave:
the vocabulary, its size, and each output with its dtype and shape.
"""

import json
import os
import tempfile
from pathlib import Path

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

OUT = Path(__file__).with_name("text_vectorization.json")

# Punctuation, case, runs of whitespace of several kinds (ASCII and not), accents (ASCII-only
# lowercasing), an empty string, ties in the counts, and the OOV token as text.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "THE DOG barks; the fox runs!",
    "  Multiple   spaces\tand\ttabs\nnewlines\r\x0bvt\x0cff  ",
    "Punctuation: commas, periods... (parens) [brackets] {braces} \"quotes\" 'apostrophes' "
    "don't back\\slash a|b ~tilde~ `tick` ^caret^ under_score",
    "Ünïcödé wörds — café, naïve; ÉCOLE école Straße",
    "non\u00a0breaking space and\u2003em space\x1cfile-sep",
    "numbers 123 4.56 7,890 and e-mail@example.com #hashtag 50% $5 a+b=c <tag> q?",
    "",
    "the the the fox fox dog",
    "[UNK] is not special here",
]
TEST = [
    "the fox and the unknown zebra!",
    "Café ÉCOLE école",
    "",
    "dog",
    "a much longer sentence with many words that is far longer than the others, by far",
    "[UNK] unk",
]
WORDS = ["red", "green", "blue", "red", "", "red", "blue", "Red", "[UNK]"]
WORDS_TEST = ["red", "blue", "purple", "", "Red", "[UNK]"]
VOCAB = ["the", "fox", "dog", "école", "zebra"]


def case(name, kwargs, calls, adapt=None, batches=None, vocabulary=None, idf_weights=None,
         vocabulary_file=None):
    return {"name": name, "kwargs": kwargs, "calls": calls, "adapt": adapt,
            "batches": batches, "vocabulary": vocabulary, "idf_weights": idf_weights,
            "vocabulary_file": vocabulary_file}


def column(strings):
    return [[s] for s in strings]


def cases():
    text_calls = [{"input": TEST}, {"input": column(TEST)}, {"input": TEST[0]},
                  {"input": TEST, "bytes": True}]
    return [
        case("default", {}, text_calls, adapt=CORPUS),
        case("max_tokens", {"max_tokens": 12}, [{"input": TEST}], adapt=CORPUS),
        case("sequence_length", {"output_sequence_length": 6},
             [{"input": TEST}, {"input": column(TEST)}, {"input": TEST[4]}], adapt=CORPUS),
        case("sequence_length_long", {"output_sequence_length": 40}, [{"input": TEST}],
             adapt=CORPUS),
        case("lower", {"standardize": "lower"}, [{"input": TEST}], adapt=CORPUS),
        case("strip", {"standardize": "strip_punctuation"}, [{"input": TEST}], adapt=CORPUS),
        case("no_standardize", {"standardize": None}, [{"input": TEST}], adapt=CORPUS),
        case("character", {"split": "character", "max_tokens": 40},
             [{"input": TEST}, {"input": TEST[1]}], adapt=CORPUS),
        case("no_split", {"split": None}, [{"input": WORDS_TEST}, {"input": column(WORDS_TEST)}],
             adapt=WORDS),
        case("no_split_sequence", {"split": None, "output_sequence_length": 3},
             [{"input": column(WORDS_TEST)}], adapt=WORDS),
        case("ngrams_2", {"ngrams": 2}, [{"input": TEST}], adapt=CORPUS),
        case("ngrams_1_3", {"ngrams": (1, 3), "output_sequence_length": 12},
             [{"input": TEST}, {"input": TEST[0]}], adapt=CORPUS),
        case("multi_hot", {"output_mode": "multi_hot"},
             [{"input": TEST}, {"input": column(TEST)}, {"input": TEST[0]}], adapt=CORPUS),
        case("count", {"output_mode": "count"}, [{"input": TEST}], adapt=CORPUS),
        case("tf_idf", {"output_mode": "tf_idf"}, [{"input": TEST}, {"input": TEST[0]}],
             adapt=CORPUS),
        case("multi_hot_padded", {"output_mode": "multi_hot", "max_tokens": 40,
                                  "pad_to_max_tokens": True}, [{"input": TEST}], adapt=CORPUS),
        case("count_capped", {"output_mode": "count", "max_tokens": 8, "ngrams": 2},
             [{"input": TEST}], adapt=CORPUS),
        case("tf_idf_padded", {"output_mode": "tf_idf", "max_tokens": 30,
                               "pad_to_max_tokens": True}, [{"input": TEST}], adapt=CORPUS),
        case("tf_idf_capped", {"output_mode": "tf_idf", "max_tokens": 6}, [{"input": TEST}],
             adapt=CORPUS),
        case("no_split_multi_hot", {"split": None, "output_mode": "multi_hot"},
             [{"input": WORDS_TEST}, {"input": column(WORDS_TEST)}], adapt=WORDS),
        case("no_split_tf_idf", {"split": None, "output_mode": "tf_idf"},
             [{"input": column(WORDS_TEST)}], adapt=WORDS),
        case("vocabulary", {"output_sequence_length": 5}, [{"input": TEST}],
             vocabulary=VOCAB),
        case("vocabulary_special", {}, [{"input": TEST}], vocabulary=["", "[UNK]", *VOCAB]),
        case("vocabulary_unk_term", {"split": None}, [{"input": WORDS_TEST}],
             vocabulary=["[UNK]", "red", "blue"]),
        case("vocabulary_multi_hot", {"output_mode": "multi_hot"}, [{"input": TEST}],
             vocabulary=VOCAB),
        case("vocabulary_tf_idf", {"output_mode": "tf_idf"}, [{"input": TEST}],
             vocabulary=VOCAB, idf_weights=[0.5, 1.0, 1.5, 2.0, 2.5]),
        case("vocabulary_tf_idf_special", {"output_mode": "tf_idf", "max_tokens": 10,
                                           "pad_to_max_tokens": True}, [{"input": TEST}],
             vocabulary=["[UNK]", *VOCAB], idf_weights=[0.25, 0.5, 1.0, 1.5, 2.0, 2.5]),
        case("vocabulary_file", {}, [{"input": TEST}], vocabulary_file=VOCAB),
        case("batches", {}, [{"input": TEST}], batches=[CORPUS[:4], CORPUS[4:8], CORPUS[8:]]),
        case("batches_tf_idf", {"output_mode": "tf_idf"}, [{"input": TEST}],
             batches=[CORPUS[:4], CORPUS[4:8], CORPUS[8:]]),
        case("batches_no_split_tf_idf", {"split": None, "output_mode": "tf_idf"},
             [{"input": column(WORDS_TEST)}], batches=[WORDS[:4], WORDS[4:8], WORDS[8:]]),
    ]


def run(spec, tmp):
    kwargs = dict(spec["kwargs"])
    if spec["vocabulary"] is not None:
        kwargs["vocabulary"] = spec["vocabulary"]
    if spec["vocabulary_file"] is not None:
        path = Path(tmp, f"{spec['name']}.txt")
        path.write_text("\n".join(spec["vocabulary_file"]) + "\n", encoding="utf-8")
        kwargs["vocabulary"] = str(path)
    if spec["idf_weights"] is not None:
        kwargs["idf_weights"] = spec["idf_weights"]
    layer = keras.layers.TextVectorization(**kwargs)
    if spec["adapt"] is not None:
        layer.adapt(spec["adapt"])
    if spec["batches"] is not None:
        layer.adapt(np.array(b) for b in spec["batches"])
    outputs = []
    for call in spec["calls"]:
        x = call["input"]
        if call.get("bytes"):
            x = np.array([s.encode("utf-8") for s in x], dtype=object)
        y = np.asarray(layer(x))
        outputs.append({"shape": list(y.shape), "dtype": str(y.dtype), "output": y.tolist()})
    config = layer.get_config()
    config = {k: v for k, v in config.items() if k not in ("name", "dtype")}
    config["ngrams"] = list(config["ngrams"]) if isinstance(config["ngrams"], tuple) \
        else config["ngrams"]
    return {**spec, "kwargs": spec["kwargs"],
            "result": {"vocabulary": [str(t) for t in layer.get_vocabulary()],
                       "vocabulary_no_special": [str(t) for t in layer.get_vocabulary(
                           include_special_tokens=False)],
                       "vocabulary_size": int(layer.vocabulary_size()),
                       "outputs": outputs, "keras_config_keys": sorted(config)}}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        results = [run(spec, tmp) for spec in cases()]
    OUT.write_text(json.dumps({"keras": keras.__version__, "tensorflow": tf.__version__,
                               "corpus": CORPUS, "cases": results}, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(results)} cases)")


if __name__ == "__main__":
    main()
