"""A layer used by several models is one set of variables, as in Keras: what one model trains
(or sets, or loads) is what the others compute with. podkit's models each hold a copy in
their own state; these tests pin that the copies never disagree where a user can look."""

import warnings

import numpy as np
import pytest

import podkit as pk

L = pk.layers
RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8)).astype(np.float32)


def _dense(x, layer):
    kernel, bias = layer.get_weights()
    return x @ kernel + bias


def _autoencoder():
    inputs = pk.Input((8,))
    code = L.Dense(3, name="code")(inputs)
    decoded = L.Dense(8, name="decoded")(code)
    autoencoder = pk.Model(inputs, decoded)
    autoencoder.compile(optimizer=pk.optimizers.Adam(0.05), loss="mse")
    return autoencoder, pk.Model(inputs, code)


def test_an_encoder_built_before_the_autoencoder_trains_predicts_with_the_trained_weights():
    autoencoder, encoder = _autoencoder()
    before = encoder.predict(X, verbose=0)  # builds the encoder first, on its own
    autoencoder.fit(X, X, batch_size=16, epochs=2, verbose=0)
    layer = autoencoder.get_layer("code")
    after = encoder.predict(X, verbose=0)
    assert not np.allclose(before, after, atol=1e-4)  # it trained, and the encoder sees it
    np.testing.assert_allclose(after, _dense(X, layer), rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(encoder.get_weights(), layer.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_set_weights_on_a_shared_layer_or_a_model_reaches_every_model_that_holds_it():
    autoencoder, encoder = _autoencoder()
    encoder.predict(X, verbose=0)
    autoencoder.predict(X, verbose=0)  # both built, each with its own copy
    layer = encoder.get_layer("code")
    kernel = RNG.normal(size=(8, 3)).astype(np.float32)
    layer.set_weights([kernel, np.ones(3, np.float32)])
    for model in (encoder, autoencoder):
        np.testing.assert_array_equal(model.get_layer("code").get_weights()[0], kernel)
    np.testing.assert_allclose(encoder.predict(X, verbose=0), X @ kernel + 1, rtol=1e-5,
                               atol=1e-5)
    # A whole model's set_weights too: the autoencoder's "code" weights are the encoder's.
    weights = autoencoder.get_weights()
    weights[0] = weights[0] * 0 + 0.5
    autoencoder.set_weights(weights)
    np.testing.assert_array_equal(encoder.get_weights()[0], np.full((8, 3), 0.5, np.float32))


def test_load_weights_reaches_the_models_that_share_the_layers(tmp_path):
    autoencoder, encoder = _autoencoder()
    autoencoder.fit(X, X, batch_size=16, epochs=1, verbose=0)
    autoencoder.save_weights(tmp_path / "ae")
    trained = autoencoder.get_layer("code").get_weights()
    encoder.predict(X, verbose=0)
    other, other_encoder = _autoencoder()
    other_encoder.predict(X, verbose=0)  # built from fresh weights
    other.build((None, 8))
    other.load_weights(tmp_path / "ae")
    for mine, theirs in zip(other_encoder.get_weights(), trained, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_a_gan_trains_the_discriminator_and_generator_through_their_shared_layers():
    """Keras's GAN recipe: the discriminator compiled trainable, then frozen inside the
    combined model; train_on_batch alternates. Each model must see the other's updates."""
    generator = pk.Sequential([pk.Input((4,)), L.Dense(8, activation="tanh", name="g")])
    discriminator = pk.Sequential([pk.Input((8,)), L.Dense(1, name="d")])
    discriminator.compile(optimizer=pk.optimizers.SGD(0.1),
                          loss=pk.losses.BinaryCrossentropy(from_logits=True))
    discriminator.trainable = False  # frozen in the combined model only (compiled after)
    noise = pk.Input((4,))
    gan = pk.Model(noise, discriminator(generator(noise)))
    gan.compile(optimizer=pk.optimizers.SGD(0.1),
                loss=pk.losses.BinaryCrossentropy(from_logits=True))
    z = RNG.normal(size=(16, 4)).astype(np.float32)
    real = RNG.normal(size=(16, 8)).astype(np.float32)
    for i in range(2):
        d_before = discriminator.get_weights()
        # Said once: the discriminator trains as compiled although its flag says frozen.
        with (pytest.warns(UserWarning, match=r"trainable changed on layers \['d'\].*"
                           r"compile\(\)") if i == 0 else warnings.catch_warnings()):
            if i:
                warnings.simplefilter("error")
            discriminator.train_on_batch(real, np.ones((16, 1), np.float32))
        d_trained = discriminator.get_weights()
        assert not np.allclose(d_before[0], d_trained[0])  # the discriminator learns
        g_before = generator.get_weights()
        gan.train_on_batch(z, np.ones((16, 1), np.float32))
        # Frozen in the combined model: its step left the discriminator as it was trained.
        for mine, theirs in zip(discriminator.get_weights(), d_trained, strict=True):
            np.testing.assert_array_equal(mine, theirs)
        g_after = generator.get_weights()
        assert not np.allclose(g_before[0], g_after[0])  # the generator learns, in its model
        # The combined model computes with the discriminator's latest weights.
        logits = np.tanh(z @ g_after[0] + g_after[1]) @ d_trained[0] + d_trained[1]
        np.testing.assert_allclose(gan.predict(z, verbose=0), logits, rtol=1e-4, atol=1e-5)


def test_a_model_dropped_by_the_user_is_not_kept_alive_by_the_layers_it_shared():
    import gc
    import weakref

    autoencoder, encoder = _autoencoder()
    encoder.predict(X, verbose=0)
    autoencoder.fit(X, X, batch_size=16, epochs=1, verbose=0)  # built last: the layers' home
    ref = weakref.ref(encoder)
    del encoder
    gc.collect()
    assert ref() is None
    autoencoder.fit(X, X, batch_size=16, epochs=1, verbose=0)  # no dead model to write to


def _nested():
    encoder = pk.Sequential([pk.Input((8,)), L.Dense(3, name="e")], name="encs")
    decoder = pk.Sequential([pk.Input((3,)), L.Dense(8, name="dd")], name="decs")
    autoencoder = pk.Sequential([encoder, decoder])
    autoencoder.compile(optimizer=pk.optimizers.Adam(0.05), loss="mse")
    return encoder, autoencoder


def test_a_nested_model_never_built_on_its_own_predicts_with_what_its_holder_trained():
    encoder, autoencoder = _nested()
    autoencoder.fit(X, X, batch_size=16, epochs=2, verbose=0)
    trained = autoencoder.get_layer("encs").get_weights()  # the outer model's copy
    # The encoder builds now, after the training: it starts from the trained weights.
    for mine, theirs in zip(encoder.get_weights(), trained, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_allclose(encoder.predict(X, verbose=0), X @ trained[0] + trained[1],
                               rtol=1e-4, atol=1e-5)


def test_set_weights_inside_a_nested_model_or_on_it_as_a_layer_reaches_both():
    encoder, autoencoder = _nested()
    autoencoder.predict(X, verbose=0)
    encoder.predict(X, verbose=0)
    kernel = RNG.normal(size=(8, 3)).astype(np.float32)
    # A layer of the nested model, set through the nested model: the outer model sees it.
    encoder.get_layer("e").set_weights([kernel, np.zeros(3, np.float32)])
    np.testing.assert_array_equal(autoencoder.get_layer("encs").get_weights()[0], kernel)
    # The nested model as a layer of the outer one, set there: the nested model sees it.
    autoencoder.get_layer("encs").set_weights([2 * kernel, np.ones(3, np.float32)])
    np.testing.assert_array_equal(encoder.get_weights()[0], 2 * kernel)
    np.testing.assert_array_equal(encoder.get_layer("e").get_weights()[1], np.ones(3))
    np.testing.assert_allclose(encoder.predict(X, verbose=0), X @ (2 * kernel) + 1,
                               rtol=1e-5, atol=1e-5)


def test_a_trainable_change_is_warned_again_after_a_recompile_at_the_users_line():
    model = pk.Sequential([pk.Input((8,)), L.Dense(3, name="a"), L.Dense(1, name="b")])
    model.compile(optimizer="sgd", loss="mse")
    y = np.zeros((16, 1), np.float32)
    for _ in range(2):  # the same change after a second compile() is a new change
        model.get_layer("a").trainable = False
        with pytest.warns(UserWarning, match=r"trainable changed on layers \['a'\]") as seen:
            model.train_on_batch(X[:16], y)
        assert seen[0].filename == __file__  # names this line, not podkit's insides
        model.get_layer("a").trainable = True
        model.compile(optimizer="sgd", loss="mse")


def test_save_and_load_of_a_model_never_built_or_compiled(tmp_path):
    model = pk.Sequential([pk.Input((8,)), L.Dense(3)])
    model.save(tmp_path / "m")  # a declared input: built now, as for get_weights()
    model.save_weights(tmp_path / "w")
    loaded = pk.models.load_model(tmp_path / "m")  # saved uncompiled: loads uncompiled
    assert not loaded.compiled
    for mine, theirs in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_layer_output_of_a_loaded_or_cloned_model_makes_a_feature_extractor(tmp_path):
    inputs = pk.Input((8,))
    hidden = L.Dense(4, activation="relu", name="hidden")(inputs)
    model = pk.Model(inputs, L.Dense(1, name="out")(hidden))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(X, X[:, :1], batch_size=16, epochs=1, verbose=0)
    model.save(tmp_path / "m")
    for again in (pk.models.load_model(tmp_path / "m"), pk.models.clone_model(model)):
        again.set_weights(model.get_weights())
        features = pk.Model(again.input, again.get_layer("hidden").output)
        kernel, bias = model.get_layer("hidden").get_weights()
        np.testing.assert_allclose(features.predict(X, verbose=0),
                                   np.maximum(X @ kernel + bias, 0), rtol=1e-4, atol=1e-5)


def test_weights_are_variables_that_outlive_training_steps():
    """Keras's `layer.weights` are variables: taken before fit, they read the trained
    values after it (podkit's train step replaces, and deletes, the state's buffers)."""
    model = pk.Sequential([pk.Input((8,)), L.Dense(3, name="dense_a"), L.Dense(1, name="b")])
    model.compile(optimizer="sgd", loss="mse")
    kernel = model.get_layer("dense_a").weights[0]
    held = model.weights
    assert (kernel.name, kernel.path, kernel.shape, kernel.trainable) == \
        ("kernel", "dense_a/kernel", (8, 3), True)
    before = kernel.numpy()
    model.fit(X, X[:, :1], batch_size=16, epochs=1, verbose=0)
    after = np.asarray(kernel)  # not "Array has been deleted"
    assert not np.allclose(before, after)
    np.testing.assert_array_equal(after, model.get_layer("dense_a").get_weights()[0])
    assert [v.path for v in held] == ["dense_a/kernel", "dense_a/bias", "b/kernel", "b/bias"]
    kernel.assign(np.zeros((8, 3), np.float32))  # Keras's assign(): the model computes with it
    np.testing.assert_array_equal(model.get_weights()[0], np.zeros((8, 3)))
    with pytest.raises(pk.InputError, match=r"dense_a/kernel.assign\(\).*\(8, 3\)"):
        kernel.assign(np.zeros(3))
    model.get_layer("dense_a").trainable = False
    assert [v.name for v in model.non_trainable_weights] == ["kernel", "bias"]
