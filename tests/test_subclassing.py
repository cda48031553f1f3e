"""Keras subclassing, nested models, the layer API and loading what a checkpoint holds
(issue 22): a `class M(pk.Model)` with layers in __init__ and a call() trains by the same
compiled step, saves and loads its weights on any device count; a Sequential or functional
model is a layer of another; layers give and take their weights in Keras's order; frozen
layers do not move."""

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError


def _data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return x, x[:, :3].argmax(1).astype(np.int32)


def _strategy(devices):
    return pk.Strategy(mesh={"data": devices}, devices=jax.devices()[:devices])


class Classifier(pk.Model):
    def __init__(self, units=32, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = pk.layers.Dense(units, activation="relu")
        self.blocks = [pk.layers.Dense(units, activation="relu") for _ in range(2)]
        self.drop = pk.layers.Dropout(0.1)
        self.out = pk.layers.Dense(3)

    def call(self, x, training=False):
        h = self.hidden(x)
        for block in self.blocks:
            h = h + block(h)  # a residual: plain jax.numpy between layers
        return self.out(self.drop(h, training=training))

    def get_config(self):
        return {"units": self.units}


def _compile(model, **kwargs):
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True), **kwargs)
    return model


@pytest.mark.parametrize("devices", [1, 8])
def test_a_subclassed_model_learns_saves_and_loads_identically(devices, tmp_path):
    x, y = _data()
    with _strategy(devices).scope():
        model = _compile(Classifier())
    history = model.fit(x, y, batch_size=64, epochs=8, verbose=0)
    assert history.history["accuracy"][-1] > 0.7  # chance is 1/3
    assert model.kind == "Subclass" and model.name == "classifier"
    assert [key for key, _ in model.architecture.layer_items()] == \
        ["hidden", "blocks_0", "blocks_1", "drop", "out"]
    want = model.predict(x, verbose=0)
    model.save_weights(tmp_path / "w")
    for other in (1, 8):  # architecture from code, weights from the files, any device count
        with _strategy(other).scope():
            again = _compile(Classifier.from_config(model.get_config()))
        again.load_weights(tmp_path / "w")
        np.testing.assert_allclose(again.predict(x, verbose=0), want, rtol=1e-5, atol=1e-5)


def test_a_layer_called_but_not_an_attribute_is_named():
    class Bad(pk.Model):
        def call(self, x):
            return pk.layers.Dense(2)(x)

    with pytest.raises(ConfigError, match="not an attribute of the model"):
        _compile(Bad()).fit(*_data(64), verbose=0)


def test_a_plain_model_without_call_says_how_to_subclass():
    with pytest.raises(ConfigError, match="subclass it"):
        pk.Model()


def test_a_layer_called_on_an_array_outside_a_model_says_where_layers_run():
    with pytest.raises(ConfigError, match="call\\(\\) of a pk.Model subclass"):
        pk.layers.Dense(2)(np.zeros((4, 3), np.float32))


def test_training_reaches_dropout_and_batch_norm():
    class Noisy(pk.Model):
        def __init__(self):
            super().__init__()
            self.drop = pk.layers.Dropout(0.5)
            self.out = pk.layers.Dense(1, kernel_initializer="ones")

        def call(self, x, training=False):
            return self.out(self.drop(x, training=True))  # always on, as the call says

    model = Noisy()
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((64, 16), np.float32)
    assert np.unique(model.predict(x, verbose=0).round(4)).size > 1  # dropout in predict


def test_nested_models_train_and_a_frozen_base_does_not_move():
    x, y = _data()
    base = pk.Sequential([pk.Input((8,)), pk.layers.Dense(16, activation="relu"),
                          pk.layers.BatchNormalization()], name="base")
    base.compile(optimizer="adam", loss="mse")
    base.fit(x, np.zeros((len(x), 16), np.float32), verbose=0)  # "pretrained"
    pretrained = base.get_weights()
    inputs = pk.Input((8,))
    outputs = pk.layers.Dense(3)(base(inputs, training=False))  # Keras's transfer idiom
    model = pk.Model(inputs, outputs)
    base.trainable = False
    _compile(model).build()
    head = model.get_layer(index=-1)
    nested = model.get_layer("base")
    for a, b in zip(nested.get_weights(), pretrained, strict=True):
        np.testing.assert_array_equal(a, b)  # starts from the base's own weights
    head_before = head.get_weights()
    model.fit(x, y, epochs=2, verbose=0)
    for a, b in zip(nested.get_weights(), pretrained, strict=True):
        np.testing.assert_array_equal(a, b)  # frozen: neither weights nor statistics move
    assert any(np.abs(a - b).max() > 0 for a, b in zip(head.get_weights(), head_before,
                                                         strict=True))
    text = model.summary(print_fn=lambda _: None)
    assert "base (Sequential)" in text and "Connected to" in text
    assert "Non-trainable params: 208" in text  # 8*16+16 + 4*16 (BN: gamma, beta, stats)
    # No optimizer moments for frozen weights: Adam's state holds the head's alone.
    moments = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(model.state.opt_state))
    assert moments < 2 * 51 + 64


def test_a_model_with_nested_models_saves_its_architecture_and_loads(tmp_path):
    """A Sequential inside a functional model inside a Sequential: model.save writes each
    nested model's config (as Keras does), load_model rebuilds all three and predicts the
    same; the frozen flag of a nested model's layers survives."""
    x, y = _data(128)
    base = pk.Sequential([pk.Input((8,)), pk.layers.Dense(8, activation="relu"),
                          pk.layers.BatchNormalization()], name="base")
    inputs = pk.Input((8,))
    middle = pk.Model(inputs, pk.layers.Dense(4)(base(inputs)), name="middle")
    outer = pk.Sequential([pk.Input((8,)), middle, pk.layers.Dense(3)])
    base.trainable = False
    _compile(outer).fit(x, y, epochs=1, verbose=0)
    outer.save(tmp_path / "nested")
    back = pk.models.load_model(tmp_path / "nested")
    assert [layer.name for layer in back.layers] == ["middle", outer.layers[1].name]
    assert back.get_layer("middle").trainable is False  # base frozen -> not all trainable
    np.testing.assert_array_equal(back.predict(x, verbose=0), outer.predict(x, verbose=0))
    back.fit(x, y, epochs=1, verbose=0)  # compiled from the file, trains on


def test_a_nested_subclass_says_its_architecture_is_code():
    with pytest.raises(ConfigError, match="built from Python code.*save_weights"):
        Classifier(units=4).as_layer().get_config()


def test_layers_give_and_take_weights_in_keras_order():
    model = pk.Sequential([pk.Input((4,)), pk.layers.Dense(3), pk.layers.BatchNormalization(),
                           pk.layers.Dense(2, use_bias=False)])
    model.compile(optimizer="sgd", loss="mse")
    model.build()
    assert [w.shape for w in model.layers[1].weights] == [(3,)] * 4  # gamma beta mean var
    assert len(model.layers[1].trainable_weights) == 2
    assert len(model.layers[1].non_trainable_weights) == 2
    assert [w.shape for w in model.weights] == [(4, 3), (3,), (3,), (3,), (3,), (3,), (3, 2)]
    assert model.count_params() == 15 + 12 + 6  # as Keras: the statistics count too
    weights = [np.full(w.shape, i, np.float32) for i, w in enumerate(model.get_weights())]
    model.set_weights(weights)
    for got, want in zip(model.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(pk.errors.InputError, match="has 2 weights"):
        model.layers[0].set_weights([weights[0]])
    with pytest.raises(pk.errors.InputError, match="shape"):
        model.layers[0].set_weights([weights[0].T, weights[1]])
    with pytest.raises(ConfigError, match="no layer named 'nope'"):
        model.get_layer("nope")
    assert model.get_layer(model.layers[2].name) is model.layers[2]


def test_load_model_and_load_weights_read_a_checkpoint_directory(tmp_path):
    x, y = _data(256)
    model = _compile(pk.Sequential([pk.Input((8,)), pk.layers.Dense(16, activation="relu"),
                                    pk.layers.Dense(3)]))
    model.fit(x, y, epochs=3, verbose=0,
              callbacks=[pk.callbacks.ModelCheckpoint(tmp_path / "ck", monitor="loss")])
    want = model.predict(x, verbose=0)
    with _strategy(1).scope():
        loaded = pk.models.load_model(tmp_path / "ck")  # newest committed step, compiled
    np.testing.assert_allclose(loaded.predict(x, verbose=0), want, rtol=1e-5, atol=1e-5)
    loaded.fit(x, y, epochs=1, verbose=0)  # its optimizer state came along
    fresh = pk.Sequential([pk.Input((8,)), pk.layers.Dense(16, activation="relu"),
                           pk.layers.Dense(3)])
    fresh.load_weights(tmp_path / "ck", step=8)  # the first epoch's
    assert not np.allclose(fresh.predict(x, verbose=0), want)
    with pytest.raises(pk.errors.InputError, match="step 9"):
        fresh.load_weights(tmp_path / "ck", step=9)


def test_a_subclass_inside_a_subclass():
    class Inner(pk.Model):
        def __init__(self):
            super().__init__()
            self.dense = pk.layers.Dense(8, activation="relu")

        def call(self, x):
            return self.dense(x)

    class Outer(pk.Model):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.out = pk.layers.Dense(3)

        def call(self, x, training=False):
            return self.out(self.inner(x))

    x, y = _data(256)
    model = _compile(Outer())
    model.fit(x, y, epochs=1, verbose=0)
    assert [layer.name for layer in model.inner.layers] == [model.inner.dense.name]
    assert [w.shape for w in model.get_weights()] == [(8, 8), (8,), (8, 3), (3,)]
