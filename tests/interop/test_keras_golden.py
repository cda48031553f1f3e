"""Keras files written by Keras 3.15 (tests/golden/keras/make_keras_fixtures.py) read by
podkit without Keras: a change of the format cannot hide behind a newer Keras in CI."""

from pathlib import Path

import numpy as np
import pytest

import podkit as pk

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "keras"
NAMES = ["image_classifier", "text_classifier"]


def _expected(name):
    data = np.load(GOLDEN / f"{name}.npz")
    return data["x"], data["y"]


@pytest.mark.parametrize("name", NAMES)
def test_a_keras_written_file_loads_with_its_predictions(name):
    x, y = _expected(name)
    model = pk.models.load_model(str(GOLDEN / f"{name}.keras"))
    assert model.compiled  # its compile config: podkit has Adam / SGD and the losses
    np.testing.assert_allclose(model.predict(x, batch_size=len(x), verbose=0), y,
                               rtol=1e-5, atol=1e-5)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(str(GOLDEN / f"{name}.weights.h5"))
    np.testing.assert_allclose(model.predict(x, batch_size=len(x), verbose=0), y,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_a_legacy_h5_file_loads_with_its_predictions(name):
    x, y = _expected(name)
    model = pk.models.load_model(str(GOLDEN / f"{name}.h5"), compile=False)
    np.testing.assert_allclose(model.predict(x, batch_size=len(x), verbose=0), y,
                               rtol=1e-5, atol=1e-5)


def test_a_tf_keras_2_h5_model_and_weights_file_load():
    """Written by tf.keras 2.21 (make_tf_keras_fixtures.py): `kernel:0` names, tf.keras 2's
    configs (list nodes, numbered axes, `Custom>Adam`)."""
    data = np.load(GOLDEN / "tf_keras2_model.npz")
    x = [data["ids"], data["x"]]
    model = pk.models.load_model(str(GOLDEN / "tf_keras2_model.h5"))
    assert isinstance(model.optimizer, pk.optimizers.Adam)
    np.testing.assert_allclose(model.predict(x, batch_size=8, verbose=0), data["y"],
                               rtol=1e-5, atol=1e-5)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(str(GOLDEN / "tf_keras2_weights.h5"))
    np.testing.assert_allclose(model.predict(x, batch_size=8, verbose=0), data["y"],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore::podkit.layers.symbolic.DtypeNote")
@pytest.mark.parametrize("name", ["text_functional", "text_sequential"])
def test_a_keras_model_holding_text_vectorization_loads_with_the_layer_split_off(name):
    """Written by Keras 3.15 with the TensorFlow backend (make_text_models.py): the model
    takes the layer's ids, said once; the file's layer, vocabulary and all, gives Keras's
    ids, and the model on them Keras's predictions on the texts."""
    from podkit.interop.keras_text import SplitOffWarning

    data = np.load(GOLDEN / f"{name}.npz")
    path = str(GOLDEN / f"{name}.keras")
    with pytest.warns(SplitOffWarning, match=r"takes ids of shape \(batch, 5\) \(int64\).*"
                                             r"load_text_vectorization\(path.*ds\.map"):
        model = pk.models.load_model(path)
    vectorize = pk.interop.load_text_vectorization(path)
    ids = vectorize(list(data["texts"]))
    np.testing.assert_array_equal(ids, data["ids"])
    np.testing.assert_allclose(model.predict(ids, batch_size=len(ids), verbose=0), data["y"],
                               rtol=1e-5, atol=1e-5)


def test_a_string_input_no_text_vectorization_reads_is_refused():
    import json
    import zipfile

    from podkit.interop import model_from_keras_config

    with zipfile.ZipFile(GOLDEN / "text_functional.keras") as z:
        config = json.loads(z.read("config.json"))
    layers = config["config"]["layers"]
    layers[1]["class_name"] = "Dense"  # the string input read by another layer
    with pytest.raises(pk.ConfigError, match=r"InputLayer 'text' holds strings and is "
                                             r"read by .*Dense.*TextVectorization.*"
                                             r"ds\.map"):
        model_from_keras_config(config)
