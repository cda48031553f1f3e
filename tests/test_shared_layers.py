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
