"""Keras's layer habits: declaring input shapes, initializers, regularizers, frozen layers,
padding that batch statistics never see, and the arguments podkit refuses by name."""

import jax
import numpy as np
import pytest

import podkit as pk

L = pk.layers


def compiled(model, **kwargs):
    model.compile(**{"optimizer": "adam", "loss": "sparse_categorical_crossentropy", **kwargs})
    return model


def test_every_keras_way_to_declare_the_input_shape():
    head = lambda: [L.Dense(16, activation="relu"), L.Dense(10, activation="softmax")]
    models = {
        "first layer input_shape": pk.Sequential([L.Flatten(input_shape=(8, 8)), *head()]),
        "first layer input_dim": pk.Sequential([L.Dense(32, input_dim=64), *head()]),
        "pk.Input first": pk.Sequential([pk.Input((64,)), *head()]),
        "layers.Input first": pk.Sequential([pk.layers.Input((64,)), *head()]),
    }
    added = pk.Sequential()
    added.add(pk.Input((64,)))
    for layer in head():
        added.add(layer)
    models["empty, then add"] = added
    for what, model in models.items():
        compiled(model)
        assert model.count_params() > 0, what  # built from the declared shape, no data
        assert model.input_shape in ((None, 64), (None, 8, 8)), what
    late = compiled(pk.Sequential(head()))
    late.build((None, 64))  # Keras writes the batch dim as None
    assert late.input_shape == (None, 64)
    with pytest.raises(pk.ConfigError, match=r"no layers; add some"):
        compiled(pk.Sequential()).build((64,))


def test_unknown_arguments_are_refused_by_name():
    with pytest.raises(pk.ConfigError, match=r"Dense\(\) got arguments podkit does not "
                       r"support: activity_regularizer.*weight_decay"):
        L.Dense(3, activity_regularizer="l2")
    with pytest.raises(pk.ConfigError, match=r"unknown initializer 'glorot'.*glorot_uniform"):
        L.Dense(3, kernel_initializer="glorot")
    with pytest.raises(pk.ConfigError, match=r"Adam\(\) got arguments.*lr.*learning_rate="):
        pk.optimizers.Adam(lr=1e-3)
    with pytest.raises(pk.ConfigError, match=r"a Module model cannot be a layer"):
        pk.Sequential([pk.Model(lambda rngs: None), L.Dense(2)])


def test_initializers_and_regularizers_as_keras():
    x = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    y = np.zeros(64, np.int32)
    zeros = compiled(pk.Sequential([L.Dense(4, kernel_initializer="zeros", input_shape=(8,)),
                                    L.Dense(2, activation="softmax",
                                            kernel_initializer=pk.initializers.Constant(0.5))]))
    kernel0, bias0, kernel1, bias1 = zeros.get_weights()  # Keras's order
    assert not kernel0.any() and np.all(kernel1 == 0.5)
    he = compiled(pk.Sequential([L.Dense(256, kernel_initializer="he_normal",
                                         input_shape=(1024,)),
                                 L.Dense(2, activation="softmax")]))
    assert np.std(he.get_weights()[0]) == pytest.approx(np.sqrt(2 / 1024), rel=0.1)
    # a regularizer adds its penalty to the loss, as Keras reports it
    plain = compiled(pk.Sequential([L.Dense(2, activation="softmax", input_shape=(8,))]),
                     optimizer=pk.optimizers.SGD(0.0))
    reg = compiled(pk.Sequential([L.Dense(2, activation="softmax", input_shape=(8,),
                                          kernel_regularizer=pk.regularizers.L2(0.1))]),
                   optimizer=pk.optimizers.SGD(0.0))
    reg.set_weights(plain.get_weights())
    kernel = plain.get_weights()[0]
    assert reg.evaluate(x, y, verbose=0) == pytest.approx(
        plain.evaluate(x, y, verbose=0) + 0.1 * (kernel ** 2).sum(), rel=1e-5)


def test_frozen_layers_do_not_change(digits):
    (x, y), _ = digits
    model = compiled(pk.Sequential([L.Dense(32, activation="relu", input_shape=(64,)),
                                    L.BatchNormalization(), L.Dense(10, activation="softmax")]))
    model.fit(x, y, epochs=1, verbose=0)
    for layer in model.layers[:2]:
        layer.trainable = False
    # Keras's rule: trainable takes effect at compile(); until then the layers train, and
    # podkit says so.
    first = model.get_weights()[0]
    with pytest.warns(UserWarning, match=r"trainable changed on layers \['dense.*compile"):
        model.fit(x, y, epochs=1, verbose=0)
    assert not np.allclose(model.get_weights()[0], first)
    compiled(model)
    before = model.get_weights()
    assert len(model.trainable_weights) == 2  # the last Dense's bias and kernel
    model.fit(x, y, epochs=2, verbose=0)
    after = model.get_weights()
    # weights, in Keras's order: [dense kernel, dense bias, bn gamma, bn beta, bn mean,
    # bn var, dense_1 kernel, dense_1 bias]: frozen layers and a frozen BatchNorm's
    # statistics stay
    for i in range(6):
        np.testing.assert_array_equal(after[i], before[i])
    assert not np.allclose(after[6], before[6])  # the trainable layer learned
    model.trainable = True
    compiled(model)
    model.fit(x, y, epochs=1, verbose=0)
    assert not np.allclose(model.get_weights()[0], after[0])


def test_padding_never_reaches_batch_statistics():
    # 33 rows in batches of 32: the last batch holds one real row (value 100) and 31 padding
    x = np.zeros((33, 1), np.float32)
    x[32] = 100.0
    model = compiled(pk.Sequential([L.BatchNormalization(momentum=0.0, input_shape=(1,)),
                                    L.Dense(2, activation="softmax")]),
                     optimizer=pk.optimizers.SGD(0.0))
    model.fit(x, np.zeros(33, np.int32), batch_size=32, epochs=1, shuffle=False, verbose=0)
    mean = model.state.rest["layers"][0]["mean"]
    assert float(np.asarray(mean)[0]) == pytest.approx(100.0)  # the real row's mean alone


def test_a_module_the_user_built_stays_usable(digits):
    import flax.nnx as nnx

    (x, y), _ = digits
    module = nnx.Linear(64, 10, rngs=nnx.Rngs(0))
    kernel = np.asarray(module.kernel[...]).copy()
    model = pk.Model(module)
    model.compile(optimizer="sgd",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=1, verbose=0)
    np.testing.assert_array_equal(np.asarray(module.kernel[...]), kernel)  # not donated away

    class TwoInputs(nnx.Module):
        def __init__(self, rngs):
            self.a, self.b = nnx.Linear(48, 10, rngs=rngs), nnx.Linear(16, 10, rngs=rngs)

        def __call__(self, x):
            return self.a(x["top"]) + self.b(x["bottom"])

    dicts = pk.Model(lambda rngs: TwoInputs(rngs))
    dicts.compile(optimizer="adam",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    h = dicts.fit({"top": x[:, :48], "bottom": x[:, 48:]}, y, epochs=2, verbose=0)
    assert h.history["loss"][1] < h.history["loss"][0]


def test_bfloat16_probabilities_pass_the_check(digits):
    import flax.nnx as nnx
    import jax.numpy as jnp

    (x, y), _ = digits

    class Bf16(nnx.Module):
        def __init__(self, rngs):
            self.out = nnx.Linear(64, 10, rngs=rngs, dtype=jnp.bfloat16)

        def __call__(self, x):
            return jax.nn.softmax(self.out(x))

    model = pk.Model(lambda rngs: Bf16(rngs))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    assert np.isfinite(model.fit(x, y, epochs=1, verbose=0).history["loss"][0])
