"""What a Keras user's trial of the new surface found (issue 22), each as it must behave now:
declared input shapes and embedding ids checked before XLA, models inside models saved,
Keras's batch API, JSON and cloning, layer weights before fit, and errors that name the
fix instead of raw Python or JAX ones."""

import json
import re

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError, InputError

L = pk.layers
RNG = np.random.default_rng(0)


def _classifier(*layers):
    model = pk.Sequential(list(layers))
    model.compile(optimizer="adam",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


# -- checked before XLA ----------------------------------------------------------------------
@pytest.mark.parametrize("first", [[pk.Input((10,))], [L.Dense(4, input_shape=(10,))]])
def test_a_sequential_keeps_the_input_shape_it_declares(first):
    model = _classifier(*first, L.Dense(2))
    with pytest.raises(InputError, match=r"\(batch, 16\).*declares, \(batch, 10\)"):
        model.fit(np.zeros((32, 16), np.float32), np.zeros(32, np.int32), verbose=0)


def _embedder():
    return _classifier(L.Embedding(10, 4), L.GlobalAveragePooling1D(), L.Dense(2))


@pytest.mark.parametrize("ids, match", [
    (RNG.integers(0, 50, (32, 5)), r"id 49 .*\[0, 10\).*largest id \+ 1 = 50"),
    (-np.ones((32, 5), np.int64), r"id -1 .*negative"),
    (RNG.uniform(0, 9, (32, 5)).astype(np.float32), "hold fractions"),
])
def test_embedding_ids_out_of_range_are_an_error_not_nan(ids, match):
    with pytest.raises(InputError, match=match):
        _embedder().fit(ids, np.zeros(32, np.int32), verbose=0)


def test_embedding_ids_are_checked_in_every_batch_of_a_dataset_and_in_predict():
    model = _embedder()
    ds = pk.data.Dataset.from_tensor_slices(
        (np.concatenate([RNG.integers(0, 10, (48, 5)), np.full((16, 5), 11)]),
         np.zeros(64, np.int32))).batch(16)
    with pytest.raises(InputError, match="id 11"):
        model.fit(ds, verbose=0)
    with pytest.raises(InputError, match="id 500"):
        model.predict(np.full((8, 5), 500), verbose=0)


def test_whole_float_ids_are_cast_as_keras_casts_them():
    model = _embedder()
    ids = RNG.integers(0, 10, (32, 5))
    model.fit(ids.astype(np.float32), np.zeros(32, np.int32), verbose=0)
    np.testing.assert_allclose(model.predict(ids.astype(np.float32), verbose=0),
                               model.predict(ids, verbose=0), rtol=1e-6)


# -- models of models --------------------------------------------------------------------------
def _siamese():
    inner = pk.Input((4,))
    encoder = pk.Model(inner, L.Dense(8, activation="relu")(inner), name="enc")
    a, b = pk.Input((4,)), pk.Input((4,))
    out = L.Dense(1, activation="sigmoid")(L.Subtract()([encoder(a), encoder(b)]))
    model = pk.Model([a, b], out)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def test_a_shared_encoder_saves_loads_and_is_one_summary_row(tmp_path):
    model = _siamese()
    xa, xb = RNG.normal(size=(32, 4)), RNG.normal(size=(32, 4))
    model.fit([xa, xb], np.zeros((32, 1)), verbose=0)
    model.save(tmp_path / "siamese")
    back = pk.models.load_model(tmp_path / "siamese")
    np.testing.assert_array_equal(back.predict([xa, xb], verbose=0),
                                  model.predict([xa, xb], verbose=0))
    rows = [r for r in model.summary(print_fn=lambda _: None).splitlines()
            if r.startswith("enc ")]
    assert len(rows) == 1 and " 40 " in rows[0]
    assert re.search(r"input_\d+, input_\d+", rows[0])  # both calls, one row


def test_from_config_takes_what_get_config_returns():
    seq = pk.Sequential([pk.Input((4,)), L.Dense(3), L.Dense(2)])
    again = pk.Sequential.from_config(seq.get_config())
    assert [type(layer).__name__ for layer in again.layers] == ["Dense", "Dense"]
    functional = _siamese()
    assert len(pk.Model.from_config(functional.get_config()).layers) == 3


def test_to_json_model_from_json_and_clone_model_rebuild_the_architecture():
    model = _classifier(pk.Input((4,)), L.Dense(8), L.LeakyReLU(0.1), L.Dense(2))
    text = model.to_json()
    assert json.loads(text)["class_name"] == "Sequential"
    for other in (pk.models.model_from_json(text), pk.models.clone_model(model)):
        assert [type(layer).__name__ for layer in other.layers] == \
            ["Dense", "LeakyReLU", "Dense"]
        assert other.layers[0] is not model.layers[0]  # new layers, fresh weights
    with pytest.raises(ConfigError, match="to_json"):
        pk.models.model_from_json("not json")


def test_two_models_sharing_a_layer_hold_one_set_of_weights_as_in_keras():
    dense, inputs = L.Dense(3), pk.Input((2,))
    a, b = pk.Model(inputs, dense(inputs)), pk.Model(inputs, dense(inputs))
    a.set_weights([np.ones((2, 3)), np.zeros(3)])
    b.set_weights([np.zeros((2, 3)), np.ones(3)])  # the last set is what both compute with
    for model in (a, b):
        np.testing.assert_array_equal(model.predict(np.ones((4, 2), np.float32), verbose=0),
                                      np.ones((4, 3)))


def test_a_feature_extractor_from_a_trained_model_has_its_trained_weights():
    x = RNG.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    inputs = pk.Input((6,))
    hidden = L.Dense(8, activation="relu", name="hidden")
    model = pk.Model(inputs, L.Dense(2)(hidden(inputs)))
    model.compile(optimizer="adam",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=2, verbose=0)
    seq = _classifier(pk.Input((6,)), L.Dense(8, activation="relu"), L.Dense(2))
    seq.fit(x, y, epochs=2, verbose=0)
    for trained, extractor, layer in (
            (model, pk.Model(model.input, model.get_layer("hidden").output), hidden),
            (seq, pk.Model(seq.inputs, seq.layers[0].output), seq.layers[0])):
        kernel, bias = trained.get_layer(layer.name).get_weights()
        np.testing.assert_allclose(extractor.predict(x, verbose=0),
                                   np.maximum(x @ kernel + bias, 0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="exists for functional models"):
        _ = pk.Sequential([L.Dense(2)]).input


def test_a_trained_layer_called_on_a_new_input_keeps_its_trained_weights():
    """Keras's seq2seq inference recipe: models made after fit() from the trained layers."""
    x = RNG.normal(size=(64, 8)).astype(np.float32)
    hidden, inputs = L.Dense(4, name="hid"), pk.Input((8,))
    model = pk.Model(inputs, L.Dense(2)(hidden(inputs)))
    model.compile(optimizer="adam", loss="mse")
    model.fit(x, np.zeros((64, 2)), epochs=3, verbose=0)
    trained = model.get_layer("hid").get_weights()
    again = pk.Input((8,))
    reuse = pk.Model(again, hidden(again))
    np.testing.assert_array_equal(hidden.get_weights()[0], trained[0])
    np.testing.assert_allclose(reuse.predict(x, verbose=0), x @ trained[0] + trained[1],
                               rtol=1e-5, atol=1e-6)


def test_a_built_nested_model_gets_the_fine_tuned_weights_back_after_fit():
    x = RNG.normal(size=(64, 6)).astype(np.float32)
    base = pk.Sequential([pk.Input((6,)), L.Dense(8, activation="relu")], name="base")
    base.build()
    before = base.get_weights()[0].copy()
    inputs = pk.Input((6,))
    model = pk.Model(inputs, L.Dense(2)(base(inputs)))
    model.compile(optimizer="adam",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, (x[:, 0] > 0).astype(np.int32), epochs=2, verbose=0)
    assert np.abs(base.get_weights()[0] - before).max() > 0
    np.testing.assert_array_equal(base.get_weights()[0],
                                  model.get_layer("base").get_weights()[0])


# -- Keras's API that was missing ---------------------------------------------------------------
def test_the_batch_api_trains_tests_and_predicts_one_batch():
    x = RNG.normal(size=(32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    model = _classifier(pk.Input((4,)), L.Dense(8, activation="relu"), L.Dense(2))
    before = model.test_on_batch(x, y)
    for _ in range(30):
        loss, accuracy = model.train_on_batch(x, y)
    assert loss < before[0] and set(model.train_on_batch(x, y, return_dict=True)) == \
        {"loss", "accuracy"}
    assert model.predict_on_batch(x).shape == (32, 2)
    assert model.trace_count["train"] == 1  # one program for every call
    with pytest.raises(ConfigError, match="one batch of arrays"):
        model.train_on_batch(pk.data.Dataset.from_tensor_slices(x).batch(8))


def test_layers_have_weights_as_soon_as_the_input_is_declared_and_build_needs_no_compile():
    model = pk.Sequential([pk.Input((16,)), L.Dense(4), L.Dense(2)])
    assert [w.shape for w in model.layers[0].weights] == [(16, 4), (4,)]
    weights = model.layers[0].get_weights()
    weights[1][:] = 1.0  # writable copies, as Keras's
    model.layers[0].set_weights(weights)
    np.testing.assert_array_equal(model.get_weights()[1], 1.0)
    later = pk.Sequential([L.Dense(4)])
    with pytest.raises(ConfigError, match="build"):
        _ = later.layers[0].weights
    later.build((None, 16))  # before compile, as Keras allows
    later.compile(optimizer="adam", loss="mse")
    later.fit(np.zeros((8, 16)), np.zeros((8, 4)), verbose=0)


def test_sequential_pop_and_leaky_relu_alpha():
    model = pk.Sequential([L.Dense(3), L.Dense(2)])
    assert model.pop().units == 2 and len(model.layers) == 1
    with pytest.warns(DeprecationWarning, match="negative_slope"):
        assert L.LeakyReLU(alpha=0.2).negative_slope == 0.2


# -- errors that name the fix ------------------------------------------------------------------
def test_a_subclass_that_skips_super_init_is_told_so():
    class Forgot(pk.Model):
        def __init__(self):
            self.dense = L.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ConfigError, match=r"super\(\).__init__\(\)"):
        Forgot().compile(optimizer="adam", loss="mse")


@pytest.mark.parametrize("fn, kwargs, match", [
    (lambda t: (t, t), {}, "returns tuple.*one array"),
    (lambda t: None, {}, "returns NoneType"),
    (lambda t: t[:3], {}, "keep the batch"),
    (lambda t: t, {"output_shape": (3,)}, r"declares output_shape=\(3,\) but returns \(4,\)"),
])
def test_a_lambda_that_returns_the_wrong_thing_is_named(fn, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        pk.Sequential([pk.Input((4,)), L.Lambda(fn, **kwargs), L.Dense(2)])


def test_a_lambda_keeps_a_varying_length_unknown():
    tokens = pk.Input((None, 3))
    assert L.Lambda(lambda t: t * 2)(tokens).shape == (None, None, 3)
    assert L.Lambda(lambda t: t.sum(axis=1))(tokens).shape == (None, 3)


def test_a_subclass_output_that_loses_the_batch_is_named():
    class Sliced(pk.Model):
        def __init__(self):
            super().__init__()
            self.dense = L.Dense(2)

        def call(self, x):
            return self.dense(x)[:3]

    model = Sliced()
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(ConfigError, match=r"returned an array of shape \(3, 2\).*batch"):
        model.fit(np.zeros((32, 4)), np.zeros((32, 2)), verbose=0)


def test_unknown_call_arguments_and_flags_are_podkit_errors():
    tokens = pk.Input((5, 3))
    with pytest.raises(ConfigError, match="return_attention_scores"):
        L.MultiHeadAttention(2, 4)(tokens, tokens, return_attention_scores=True)
    with pytest.raises(ConfigError, match="called with \\['foo'\\]"):
        L.Dense(2)(tokens, foo=1)
    with pytest.raises(ConfigError, match="reset_after='no'"):
        L.GRU(8, reset_after="no")
    with pytest.raises(ConfigError, match="momentum=2"):
        L.BatchNormalization(momentum=2)


def test_checkpoint_step_directories_load_and_a_missing_step_lists_the_valid_ones(tmp_path):
    x = RNG.normal(size=(64, 4)).astype(np.float32)
    model = _classifier(pk.Input((4,)), L.Dense(2))
    model.fit(x, (x[:, 0] > 0).astype(np.int32), epochs=2, batch_size=16, verbose=0,
              checkpoint=tmp_path / "ck")
    step_dir = tmp_path / "ck" / "step_0000000004"
    assert step_dir.is_dir()
    back = pk.models.load_model(step_dir)
    assert back.steps_trained == 4
    with pytest.raises(InputError, match=r"no checkpoint step 1; its valid steps are \[4, 8\]"):
        model.load_weights(tmp_path / "ck", step=1)


def test_summary_takes_keras_arguments_and_calls_print_fn_per_line():
    base = pk.Sequential([pk.Input((8,)), L.Dense(4, name="h"), L.BatchNormalization(name="bn")],
                         name="base")
    inputs = pk.Input((8,))
    model = pk.Model(inputs, L.Dense(2, name="head")(base(inputs)), name="outer")
    base.trainable = False
    model.compile(optimizer="adam", loss="mse")
    lines = []
    text = model.summary(print_fn=lines.append, expand_nested=True, show_trainable=True)
    assert lines == text.splitlines()  # one call per line, as Keras
    rows = {line.split()[0]: line.split() for line in lines if "(" in line and ")" in line}
    assert rows["h"][-1] == "N" and rows["bn"][-1] == "N" and rows["head"][-1] == "Y"
    assert rows["h"][4] == "36" and rows["bn"][4] == "16"  # the nested model's own rows
    assert "Trainable params: 10" in text and "Non-trainable params: 52" in text
    picked = model.summary(print_fn=lambda _: None, layer_range=("base", "he.*"))
    assert "head (Dense)" in picked and "InputLayer" not in picked
    narrow = model.summary(print_fn=lambda _: None, line_length=40)
    assert max(len(line) for line in narrow.splitlines()[:8]) <= 40
    with pytest.raises(ConfigError, match="no layer's name matches 'encoder'"):
        model.summary(layer_range=("encoder", "head"))
    with pytest.raises(ConfigError, match="positions"):
        model.summary(positions=[0.5, 0.2, 0.7, 1.0])


def test_configs_and_calls_of_the_wrong_kind_are_podkit_errors():
    seq = pk.Sequential([pk.Input((4,)), L.Dense(2)])
    with pytest.raises(ConfigError, match=r"Sequential.from_config\(config\)"):
        pk.Model.from_config(seq.get_config())
    with pytest.raises(ConfigError, match=r"not one get_config\(\) wrote \(KeyError: 'inputs'"):
        pk.Model.from_config({"class_name": "Functional", "config": {"layers": []}})
    with pytest.raises(ConfigError, match=r"\['initial_states'\].*initial_state="):
        L.LSTM(4)(pk.Input((5, 3)), initial_states=[pk.Input((4,))])
