"""The random image layers' randomness: their draws are distributed as Keras 3's (many draws
from each, compared by their range and a two-sample Kolmogorov-Smirnov test), each training
step draws anew from the model's random stream (a compiled k-step execution too), equal
seeds draw equally, a resumed fit draws what an uninterrupted one does, `training=` on a call
forces them on; and their arguments are checked as Keras's are, before XLA."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import podkit as pk
from helpers import StopAt
from podkit.checkpoint import CheckpointManager
from podkit.errors import ConfigError

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
K, P = keras.layers, pk.layers
ONE = jax.devices()[:1]
DRAWS = 2000  # images' worth of draws from each side
SHAPE = (DRAWS, 6, 8, 3)


def podkit_draws(layer, shape=SHAPE, keys=1):
    """The layer's draws for `keys` batches of `shape` (one key per batch, as per step)."""
    return [layer.draw(jax.random.key(i), shape) for i in range(keys)]


def keras_draws(layer, shape=SHAPE, calls=1):
    images = np.zeros(shape, np.float32)
    return [layer.get_random_transformation(images, training=True) for _ in range(calls)]


def same_distribution(ours, theirs, low, high):
    """Both samples within [low, high], spread over it, and alike (KS p-value > 1e-3; the
    seeds are fixed, so the figure is too)."""
    ours, theirs = np.ravel(ours), np.ravel(theirs)
    for sample in (ours, theirs):
        assert low <= sample.min() and sample.max() <= high
        assert sample.max() - sample.min() > 0.9 * (high - low)  # not a corner of it
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


def test_flips_are_a_coin_as_keras_s():
    for mode in ("horizontal", "vertical", "horizontal_and_vertical"):
        ours = np.asarray(podkit_draws(P.RandomFlip(mode))[0]["flips"], float)
        theirs = np.asarray(keras_draws(K.RandomFlip(mode, seed=3))[0]["flips"], float)
        sigma = np.sqrt(0.25 / DRAWS)
        assert abs(ours.mean() - 0.5) < 4 * sigma and abs(theirs.mean() - 0.5) < 4 * sigma
        assert abs(ours.mean() - theirs.mean()) < 4 * np.sqrt(2) * sigma


def test_rotation_angles_are_keras_s():
    same_distribution(podkit_draws(P.RandomRotation((-0.1, 0.2)))[0]["angle"],
                      keras_draws(K.RandomRotation((-0.1, 0.2), seed=3))[0]["angle"],
                      -36.0, 72.0)


def test_zoom_factors_are_keras_s():
    ours = podkit_draws(P.RandomZoom((-0.3, 0.2), (0.1, 0.4)))[0]
    theirs = keras_draws(K.RandomZoom((-0.3, 0.2), (0.1, 0.4), seed=3))[0]
    same_distribution(ours["height_zoom"], theirs["height_zoom"], 0.7, 1.2)
    same_distribution(ours["width_zoom"], theirs["width_zoom"], 1.1, 1.4)
    one = podkit_draws(P.RandomZoom(0.3))[0]  # without width_factor: the height's zoom
    np.testing.assert_array_equal(one["height_zoom"], one["width_zoom"])


def test_translations_are_keras_s():
    ours = np.asarray(podkit_draws(P.RandomTranslation(0.2, (-0.1, 0.3)))[0]["translations"])
    theirs = np.asarray(keras_draws(K.RandomTranslation(0.2, (-0.1, 0.3), seed=3))[0][
        "translations"])
    same_distribution(ours[:, 0], theirs[:, 0], -0.1 * 8, 0.3 * 8)  # x: of the width
    same_distribution(ours[:, 1], theirs[:, 1], -0.2 * 6, 0.2 * 6)  # y: of the height


def test_contrast_factors_are_keras_s():
    """A number f draws in [1, 1 + f] (Keras 3.15's code: its docstring says [1 - f,
    1 + f]); a pair (lower, upper) in [1 - lower, 1 + upper]."""
    same_distribution(podkit_draws(P.RandomContrast(0.5))[0]["contrast_factor"],
                      keras_draws(K.RandomContrast(0.5, seed=3))[0]["contrast_factor"],
                      1.0, 1.5)
    same_distribution(podkit_draws(P.RandomContrast((0.2, 0.6)))[0]["contrast_factor"],
                      keras_draws(K.RandomContrast((0.2, 0.6), seed=3))[0]["contrast_factor"],
                      0.8, 1.6)


def test_brightness_deltas_are_keras_s():
    same_distribution(podkit_draws(P.RandomBrightness(0.3))[0]["rgb_delta"],
                      keras_draws(K.RandomBrightness(0.3, seed=3))[0]["rgb_delta"],
                      -0.3 * 255, 0.3 * 255)
    same_distribution(
        podkit_draws(P.RandomBrightness((-0.1, 0.4), value_range=(0, 1)))[0]["rgb_delta"],
        keras_draws(K.RandomBrightness((-0.1, 0.4), value_range=(0, 1), seed=3))[0]["rgb_delta"],
        -0.1, 0.4)


def test_crop_offsets_are_keras_s_one_per_batch():
    shape = (4, 12, 11, 3)
    ours = podkit_draws(P.RandomCrop(5, 7), shape, keys=400)
    theirs = keras_draws(K.RandomCrop(5, 7, seed=3), shape, calls=400)
    for axis, high in ((0, 7), (1, 4)):  # offsets 0..H-h and 0..W-w, every one drawn
        a = np.array([int(d[axis]) for d in ours])
        b = np.array([int(d[axis]) for d in theirs])
        assert set(a) == set(b) == set(range(high + 1))
        assert stats.ks_2samp(a, b).pvalue > 1e-3


def test_draws_differ_per_call_and_follow_the_seed():
    """The module draws from its stream: each call anew, a layer seed fixes the sequence."""
    layer = P.RandomRotation(0.3, seed=5)
    model = pk.Sequential([pk.Input((6, 8, 3)), layer])
    model.build((None, 6, 8, 3))
    module = model.module()
    module.train()
    x = jnp.asarray(np.random.default_rng(0).uniform(size=(8, 6, 8, 3)).astype(np.float32))
    first, second = np.asarray(module(x)), np.asarray(module(x))
    assert not np.allclose(first, second)
    again = pk.Sequential([pk.Input((6, 8, 3)), P.RandomRotation(0.3, seed=5)])
    again.build((None, 6, 8, 3))
    replay = again.module()
    replay.train()
    np.testing.assert_array_equal(np.asarray(replay(x)), first)
    module.eval()
    np.testing.assert_array_equal(np.asarray(module(x)), np.asarray(x))


def _image_model(*augment, seed=0, steps=4):
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = pk.Sequential([pk.Input((8, 8, 3)), *augment, P.Flatten(),
                               P.Dense(3, kernel_initializer="zeros")], seed=seed)
        model.compile(optimizer="sgd", steps_per_execution=steps,
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(n=64):
    rng = np.random.default_rng(1)
    return rng.uniform(0, 1, size=(n, 8, 8, 3)).astype(np.float32), rng.integers(0, 3, n)


def _params(model):
    return [np.asarray(a) for a in jax.tree.leaves(model.state.params)]


def test_fit_draws_each_step_anew_from_the_seed_whatever_the_steps_per_execution():
    x, y = _data()
    fits = {}
    for name, seed, steps in (("a", None, 4), ("b", None, 1), ("seeded", 7, 4),
                              ("none", None, 4)):
        augment = [] if name == "none" else [P.RandomFlip(seed=seed),
                                             P.RandomTranslation(0.2, 0.2, seed=seed)]
        model = _image_model(*augment, steps=steps)
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        fits[name] = _params(model)
        if augment:  # the stream advanced once per step, in the compiled scan too
            counts = [int(c) for c in jax.tree.leaves(model.state.rng)
                      if jnp.issubdtype(c.dtype, jnp.integer)]
            assert counts == [8, 8]
    assert all(np.array_equal(a, b) for a, b in zip(fits["a"], fits["b"], strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(fits["a"], fits["seeded"],
                                                        strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(fits["a"], fits["none"], strict=True))


def test_a_resumed_fit_draws_what_an_uninterrupted_one_draws(tmp_path):
    """Interrupted at step 6 of 8 (epoch 2 of 2, mid-epoch) and resumed from its step-4
    checkpoint: the weights of an uninterrupted fit, bit for bit."""
    x, y = _data()
    make = lambda: _image_model(P.RandomFlip(), P.RandomRotation(0.2), steps=1)
    whole = make()
    whole.fit(x, y, batch_size=16, epochs=2, verbose=0)
    with pytest.raises(KeyboardInterrupt):
        make().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[StopAt(6)],
                   checkpoint=CheckpointManager(tmp_path / "ck", every_steps=4))
    resumed = make()
    resumed.fit(x, y, batch_size=16, epochs=2, verbose=0, checkpoint=tmp_path / "ck")
    assert int(resumed.state.step) == 8
    assert all(np.array_equal(a, b) for a, b in zip(_params(whole), _params(resumed),
                                                    strict=True))


def test_every_image_layer_trains_in_a_functional_model():
    x, y = _data()
    inputs = pk.Input((8, 8, 3), dtype="uint8")
    h = P.Rescaling(1 / 255.0)(inputs)
    for layer in (P.RandomFlip(), P.RandomRotation(0.1), P.RandomZoom(0.2),
                  P.RandomTranslation(0.1, 0.1), P.RandomContrast(0.3, value_range=(0, 1)),
                  P.RandomBrightness(0.2, value_range=(0, 1)), P.RandomCrop(6, 6),
                  P.Resizing(8, 8), P.CenterCrop(6, 6), P.GroupNormalization(groups=3)):
        h = layer(h)
    assert h.shape == (None, 6, 6, 3)
    with pk.DataParallel().scope():  # the batch over 8 devices
        model = pk.Model(inputs, P.Dense(3)(P.Flatten()(h)))
        model.compile(optimizer="adam",
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    images = (x * 255).astype(np.uint8)
    history = model.fit(images, y, batch_size=16, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    first = model.predict(images, batch_size=16, verbose=0)  # inference: deterministic
    np.testing.assert_array_equal(model.predict(images, batch_size=16, verbose=0), first)


def test_the_draws_are_the_same_on_one_device_and_on_eight():
    """The global batch's draw, whatever its sharding: a checkpoint resumed on another mesh
    augments as the run it continues would have."""
    x, _ = _data(16)
    outs = []
    for strategy in (pk.Strategy(mesh={"data": 1}, devices=ONE), pk.DataParallel()):
        with strategy.scope():
            inputs = pk.Input((8, 8, 3))
            h = P.RandomRotation(0.2, seed=1)(inputs, training=True)
            h = P.RandomCrop(6, 6, seed=2)(h, training=True)
            model = pk.Model(inputs, P.RandomContrast(0.5, seed=3)(h, training=True))
            outs.append(model.predict(x, batch_size=16, verbose=0))
    assert len(jax.devices()) == 8
    np.testing.assert_array_equal(outs[0], outs[1])


class Augmented(pk.Model):
    """Keras's subclassing habit: the augmentation called with the call's `training`."""

    def __init__(self):
        super().__init__()
        self.flip = P.RandomFlip("horizontal")
        self.crop = P.RandomCrop(6, 6)
        self.flat, self.out = P.Flatten(), P.Dense(3)

    def call(self, x, training=False):
        h = self.crop(self.flip(x, training=training), training=training)
        return self.out(self.flat(h))


def test_a_subclassed_model_augments_while_training_on_eight_devices():
    x, y = _data()
    with pk.DataParallel().scope():
        model = Augmented()
        model.compile(optimizer="sgd",
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    counts = [int(c) for c in jax.tree.leaves(model.state.rng)
              if jnp.issubdtype(c.dtype, jnp.integer)]
    assert counts == [4, 4]
    first = model.predict(x, batch_size=16, verbose=0)
    np.testing.assert_array_equal(model.predict(x, batch_size=16, verbose=0), first)


def test_training_true_on_a_call_augments_in_predict():
    x, _ = _data(16)
    inputs = pk.Input((8, 8, 3))
    model = pk.Model(inputs, P.RandomFlip("horizontal", seed=2)(inputs, training=True))
    out = model.predict(x, batch_size=16, verbose=0)
    flipped = np.array([np.array_equal(o, i[:, ::-1]) for o, i in zip(out, x, strict=True)])
    kept = np.array([np.array_equal(o, i) for o, i in zip(out, x, strict=True)])
    assert (flipped | kept).all() and flipped.any() and kept.any()


@pytest.mark.parametrize("make, message", [
    (lambda: P.RandomFlip("diagonal"), r"RandomFlip\(mode='diagonal'\).*'horizontal', "
                                       r"'vertical', 'horizontal_and_vertical'"),
    (lambda: P.RandomRotation(1.5), r"RandomRotation\(factor=1.5\).*\[-1, 1\]"),
    (lambda: P.RandomRotation((0.5, -2)), r"RandomRotation\(factor=\(0.5, -2\)\)"),
    (lambda: P.RandomRotation(0.1, fill_mode="mirror"),
     r"fill_mode='mirror'.*'reflect', 'wrap', 'constant', 'nearest'"),
    (lambda: P.RandomZoom(-1.0), r"RandomZoom\(height_factor=-1.0\).*\(-1, 1\]"),
    (lambda: P.RandomZoom(0.2, interpolation="bicubic"),
     r"interpolation='bicubic'.*'nearest', 'bilinear'"),
    (lambda: P.RandomTranslation(0.1, "x"), r"RandomTranslation\(width_factor='x'\)"),
    (lambda: P.RandomContrast(-0.2), r"RandomContrast\(factor=-0.2\).*\[0, 1\]"),
    (lambda: P.RandomContrast(0.2, value_range=(255, 0)), r"value_range=\(255, 0\).*low"),
    (lambda: P.RandomBrightness(2), r"RandomBrightness\(factor=2\)"),
    (lambda: P.RandomBrightness(0.1, value_range=1), r"value_range=1"),
    (lambda: P.RandomCrop(0, 4), r"RandomCrop\(height=0\).*positive int"),
    (lambda: P.RandomCrop(4, 2.5), r"RandomCrop\(width=2.5\)"),
    (lambda: P.RandomFlip(seed="1"), r"RandomFlip\(seed='1'\)"),
    (lambda: P.Resizing(4, 4, interpolation="area"), r"interpolation='area'.*'lanczos5'"),
    (lambda: P.Resizing(4, 4, crop_to_aspect_ratio=True, pad_to_aspect_ratio=True),
     r"one or the other"),
    (lambda: P.Resizing(4, 4, fill_mode="reflect"), r"fill_mode='reflect'.*'constant'"),
    (lambda: P.CenterCrop(-1, 4), r"CenterCrop\(height=-1\)"),
    (lambda: P.RandomFlip(data_format="channels_first"), r"channels_first.*channels-last"),
    (lambda: P.GroupNormalization(groups=0), r"groups=0"),
    (lambda: P.GroupNormalization(gamma_constraint="non_neg"), r"no weight constraints"),
    (lambda: P.Rescaling("x"), r"Rescaling\(scale='x'\)"),
])
def test_bad_arguments_are_config_errors_naming_them(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize("layer, shape, message", [
    (lambda: P.RandomFlip(), (8, 8), r"takes images \(batch, height, width, channels\).*"
                                     r"\(None, 8, 8\).*Reshape"),
    (lambda: P.Resizing(4, 4), (None, 8, 3), r"fixed height and width"),
    (lambda: P.GroupNormalization(groups=4), (8, 8, 6), r"groups=4 must divide the 6"),
    (lambda: P.Rescaling([1.0, 2.0]), (8, 8, 3), r"scale of shape \(2,\) does not broadcast"),
])
def test_a_wrong_input_is_a_config_error_where_the_layer_is_called(layer, shape, message):
    with pytest.raises(ConfigError, match=message):
        layer()(pk.Input(shape))
