"""Write tf.keras 2's legacy HDF5 files that tests/interop/test_keras_golden.py reads: a whole
model (`model.save("x.h5")`: model_config, training_config, model_weights/ with
`dense/kernel:0` names) and a weights file (`save_weights("x.h5")`), with tf.keras 2 itself
(the tf-keras package beside TensorFlow):

    pip install tensorflow-cpu==2.21.0 tf-keras==2.21.0
    python tests/golden/keras/make_tf_keras_fixtures.py
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> None:
    import tf_keras as K

    L = K.layers
    ids = K.Input((6,), dtype="int32")
    e = L.Embedding(16, 4, mask_zero=True)(ids)
    s = L.Bidirectional(L.LSTM(3, return_sequences=True))(e)
    s = L.GRU(3)(s)
    x = K.Input((5,))
    h = L.BatchNormalization()(L.Dense(4, activation="relu")(x))
    out = L.Dense(2, activation="softmax")(L.Concatenate()([s, h]))
    model = K.Model([ids, x], out)
    model.compile(optimizer=K.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(3)
    model.set_weights([w + rng.normal(scale=0.2, size=w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    a = rng.integers(1, 16, size=(8, 6)).astype("int32")
    a[:, 4:] = 0
    b = rng.normal(size=(8, 5)).astype("float32")
    model.save(str(HERE / "tf_keras2_model.h5"))
    model.save_weights(str(HERE / "tf_keras2_weights.h5"))
    np.savez(HERE / "tf_keras2_model.npz", ids=a, x=b, y=model.predict([a, b], verbose=0))
    print("ok", K.__version__)


if __name__ == "__main__":
    main()
