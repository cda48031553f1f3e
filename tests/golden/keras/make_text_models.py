"""Writes tests/golden/keras/text_functional.keras and text_sequential.keras (+ .npz): Keras
models that hold a TextVectorization, as Keras writes them with the TensorFlow backend (Keras
on JAX refuses a string input), for tests/interop/test_keras_golden.py: podkit splits the
layer off, and its model on the vectorized texts must give Keras's predictions on the texts.
pytest does not collect this file (its name does not start with test_).

    KERAS_BACKEND=tensorflow .venv/bin/python tests/golden/keras/make_text_models.py

Each `.npz` holds the texts, Keras's ids for them (the layer alone) and Keras's predictions.
"""

import os
from pathlib import Path

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

HERE = Path(__file__).resolve().parent
L = keras.layers
CORPUS = ["The cat sat on the mat.", "A dog ran far, far away!", "the cat and the dog",
          "Birds fly; cats sit.", "a mat for the cat", "dogs and cats and birds",
          "nothing here", "THE END"]


def _functional(vectorize):
    text = keras.Input((1,), dtype="string", name="text")
    e = L.Embedding(24, 4)(vectorize(text))
    out = L.Dense(2, activation="softmax")(L.GlobalAveragePooling1D()(e))
    return keras.Model(text, out)


def _sequential(vectorize):
    return keras.Sequential([keras.Input((1,), dtype="string"), vectorize,
                             L.Embedding(24, 3), L.Flatten(), L.Dense(2)])


def main() -> None:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    texts = np.array(CORPUS)[:, None]
    for name, make in {"text_functional": _functional, "text_sequential": _sequential}.items():
        vectorize = L.TextVectorization(max_tokens=24, output_sequence_length=5)
        vectorize.adapt(CORPUS)
        model = make(vectorize)
        model.set_weights([w + rng.normal(scale=0.3, size=w.shape).astype(w.dtype)
                           for w in model.get_weights()])
        model.save(HERE / f"{name}.keras")
        np.savez(HERE / f"{name}.npz", texts=np.array(CORPUS),
                 ids=np.asarray(vectorize(tf.constant(texts))),
                 y=np.asarray(model(tf.constant(texts))), keras_version=keras.__version__)
        print(f"wrote {name}: .keras, .npz")


if __name__ == "__main__":
    main()
