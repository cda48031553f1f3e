"""Write the small Keras files tests/interop/test_keras_golden.py reads, with Keras 3 itself
(JAX backend), so that a change of Keras's format cannot hide behind a newer Keras in CI:

    KERAS_BACKEND=jax python tests/golden/keras/make_keras_fixtures.py

Each model gets `NAME.keras` (Keras 3's archive), `NAME.weights.h5` (its weights file),
`NAME.h5` (tf.keras's legacy HDF5 format, as Keras 3's legacy writer writes it) and
`NAME.npz` (the input and Keras's predictions). Weights come from a fixed seed.
"""

import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np

HERE = Path(__file__).resolve().parent
L = keras.layers


def _text_classifier():
    ids = keras.Input((6,), dtype="int32", name="ids")
    e = L.Embedding(16, 4, mask_zero=True)(ids)
    s = L.Bidirectional(L.LSTM(3, return_sequences=True))(e)
    s = L.GRU(3)(s)
    out = L.Dense(2, activation="softmax")(L.LayerNormalization()(s))
    model = keras.Model(ids, out)
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x = np.random.default_rng(1).integers(1, 16, size=(8, 6)).astype("int32")
    x[:, 4:] = 0
    return model, x


def _image_classifier():
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        L.Rescaling(1 / 255),
        L.Conv2D(4, 3, padding="same", activation="relu"),
        L.BatchNormalization(),
        L.MaxPooling2D(),
        L.Flatten(),
        L.Dropout(0.2),
        L.Dense(3),
    ])
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(2).uniform(0, 255, size=(8, 8, 8, 3)).astype("float32")
    return model, x


MODELS = {"text_classifier": _text_classifier, "image_classifier": _image_classifier}


def main() -> None:
    from keras.src.legacy.saving import legacy_h5_format

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    for name, make in MODELS.items():
        model, x = make()
        model.set_weights([w + rng.normal(scale=0.2, size=w.shape).astype(w.dtype)
                           if w.dtype.kind == "f" and w.ndim else w
                           for w in model.get_weights()])
        model.save(HERE / f"{name}.keras")
        model.save_weights(HERE / f"{name}.weights.h5")
        legacy_h5_format.save_model_to_hdf5(model, str(HERE / f"{name}.h5"))
        np.savez(HERE / f"{name}.npz", x=x, y=np.asarray(model.predict(x, verbose=0)),
                 keras_version=keras.__version__)
        print(f"wrote {name}: .keras, .weights.h5, .h5, .npz")


if __name__ == "__main__":
    main()
