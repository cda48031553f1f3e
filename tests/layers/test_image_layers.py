"""Keras 3's image preprocessing and augmentation layers against Keras itself (JAX backend):
the deterministic ones (Resizing, CenterCrop, Rescaling, Normalization, GroupNormalization)
give Keras's outputs (and GroupNormalization its gradients) to 1e-5; every random layer in
inference gives Keras's inference output; and given the same random draw, each random
layer's transform gives Keras's `transform_images` (every fill mode and interpolation Keras's
JAX backend has). tests/layers/test_augmentation.py checks the draws themselves."""

import os

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
K, P = keras.layers, pk.layers
RNG = np.random.default_rng(0)
N = 8  # a multiple of the test process's 8 devices
IMAGES = RNG.uniform(0, 255, size=(N, 9, 11, 3)).astype(np.float32)


def built(layer, shape=IMAGES.shape[1:]):
    """podkit's layer built for inputs of `shape` (the module a model would run; its
    variables' logical axes are left to a strategy, as a model leaves them)."""
    with nnx.use_eager_sharding(False):
        return layer.build(tuple(shape), nnx.Rngs(0))


def close(got, want, tol=1e-5):
    """Equal to `tol`, relative to the values' scale (pixels in [0, 255])."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)


# -- deterministic layers --------------------------------------------------------------------
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic", "lanczos3",
                                           "lanczos5"])
@pytest.mark.parametrize("mode", ["stretch", "crop_to_aspect_ratio", "pad_to_aspect_ratio"])
def test_resizing_is_keras_s(interpolation, mode):
    options = {} if mode == "stretch" else {mode: True, "fill_value": 7.0}
    for size, antialias in (((5, 7), False), ((5, 7), True), ((12, 8), False)):
        args = dict(interpolation=interpolation, antialias=antialias, **options)
        want = K.Resizing(*size, **args)(IMAGES)
        close(built(P.Resizing(*size, **args))(IMAGES), want)
        close(built(P.Resizing(*size, **args))(IMAGES[0]), K.Resizing(*size, **args)(IMAGES[0]))


@pytest.mark.parametrize("size", [(5, 7), (6, 8), (9, 11), (4, 12), (12, 13)])
def test_center_crop_is_keras_s(size):
    """Smaller than the image: the middle window; larger in a dim: Keras's smart_resize."""
    close(built(P.CenterCrop(*size))(IMAGES), K.CenterCrop(*size)(IMAGES))
    close(built(P.CenterCrop(*size))(IMAGES[0]), K.CenterCrop(*size)(IMAGES[0]))


def _predict_both(keras_layers, podkit_layers, x, **kwargs):
    k = keras.Sequential([keras.Input(x.shape[1:]), *keras_layers])
    p = pk.Sequential([pk.Input(x.shape[1:]), *podkit_layers])
    return p.predict(x, batch_size=N, verbose=0, **kwargs), np.asarray(k.predict(x, verbose=0))


def test_image_layers_in_a_sequential_and_a_functional_model_are_keras_s():
    make = lambda m: [m.Rescaling([1 / 255.0, 2 / 255.0, 3 / 255.0], offset=[0.0, -1.0, 0.5]),
                      m.Resizing(12, 10, interpolation="bicubic", crop_to_aspect_ratio=True),
                      m.CenterCrop(8, 8), m.Rescaling(0.5, offset=0.25)]
    got, want = _predict_both(make(K), make(P), IMAGES)
    close(got, want)
    x = pk.Input(IMAGES.shape[1:], dtype="uint8")
    h = x
    for layer in make(P):
        h = layer(h)
    assert h.shape == (None, 8, 8, 3)  # Resizing and CenterCrop's sizes, known symbolically
    model = pk.Model(x, h)
    close(model.predict(IMAGES.astype(np.uint8), batch_size=N, verbose=0),
          keras.Sequential([keras.Input(IMAGES.shape[1:]), *make(K)]).predict(
              IMAGES.astype(np.uint8).astype(np.float32), verbose=0))


def test_rescaling_config_is_keras_s():
    for args in (dict(scale=1 / 255.0), dict(scale=[1.0, 2.0, 3.0], offset=[0.0, 1.0, 2.0])):
        want = K.Rescaling(**args).get_config()
        got = P.Rescaling(**args).get_config()
        assert {k: got[k] for k in ("scale", "offset")} == {k: want[k] for k in
                                                            ("scale", "offset")}


NORMALIZATIONS = {
    "scalar": dict(mean=2.0, variance=4.0),
    "per channel": dict(mean=[1.0, 2.0, 3.0], variance=[1.0, 4.0, 9.0]),
    "two axes": dict(axis=(1, 3), mean=np.full((9, 3), 3.0), variance=np.full((9, 3), 2.0)),
    "trailing of two axes": dict(axis=(2, 3), mean=[1.0, 2.0, 3.0], variance=[1.0, 2.0, 3.0]),
    "one for all": dict(axis=None, mean=1.0, variance=2.0),
    "inverted": dict(mean=[1.0, 2.0, 3.0], variance=[1.0, 4.0, 9.0], invert=True),
}


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_normalization_with_given_statistics_is_keras_s(name):
    """Given statistics are constants: no weights (Keras's), Keras's broadcasting."""
    args = NORMALIZATIONS[name]
    got, want = _predict_both([K.Normalization(**args)], [P.Normalization(**args)], IMAGES)
    close(got, want)
    layer = P.Normalization(**args)
    pk.Sequential([pk.Input(IMAGES.shape[1:]), layer]).build((None, *IMAGES.shape[1:]))
    assert layer.get_weights() == []


@pytest.mark.parametrize("axis", [-1, (1, 3), None, 2])
def test_normalization_adapts_to_keras_s_weights(axis):
    k, p = K.Normalization(axis=axis), P.Normalization(axis=axis)
    k.adapt(IMAGES)
    p.adapt(IMAGES)
    model = pk.Sequential([pk.Input(IMAGES.shape[1:]), p])
    got = model.predict(IMAGES, batch_size=N, verbose=0)
    close(got, k(IMAGES))
    want_weights = k.get_weights()
    assert [w.shape for w in p.get_weights()] == [w.shape for w in want_weights]
    for g, w in zip(p.get_weights(), want_weights, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)
    p.set_weights(want_weights)  # Keras's layout goes in as it is
    # Batches as a list, as Keras's adapt reads a list: the same statistics.
    listed = P.Normalization(axis=axis)
    listed.adapt([IMAGES[:3], IMAGES[3:]])
    for g, w in zip((listed.mean, listed.variance), want_weights[:2], strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6)


def _keras_group_norm(layer, x, gamma, beta, w):
    """Keras's outputs and gradients (of sum(out * w)) for x, gamma, beta."""
    layer.build(x.shape)
    names = [v.name for v in layer.trainable_variables]

    def loss(x, params):
        values = [params[n] for n in names]
        out, _ = layer.stateless_call(values, [], x)
        return jnp.sum(out * w), out

    params = {"gamma": gamma, "beta": beta}
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, params)
    return out, grads[0], grads[1]


@pytest.mark.parametrize("args", [dict(groups=3), dict(groups=1), dict(groups=-1),
                                  dict(groups=2, axis=1), dict(groups=3, epsilon=1e-5),
                                  dict(groups=2, center=False, scale=False)])
def test_group_normalization_outputs_and_gradients_are_keras_s(args):
    shape = (N, 4, 5, 6) if args.get("axis") != 1 else (N, 4, 5, 3)
    x = jnp.asarray(RNG.normal(loc=1.0, scale=2.0, size=shape).astype(np.float32))
    w = jnp.asarray(RNG.normal(size=shape).astype(np.float32))
    channels = shape[args.get("axis", -1)]
    gamma = jnp.asarray(RNG.normal(1.0, 0.3, size=channels).astype(np.float32))
    beta = jnp.asarray(RNG.normal(0.0, 0.3, size=channels).astype(np.float32))
    k_out, k_dx, k_dparams = _keras_group_norm(K.GroupNormalization(**args), x, gamma, beta, w)
    module = built(P.GroupNormalization(**args), shape[1:])
    if args.get("scale", True):
        module.gamma[...] = gamma
    if args.get("center", True):
        module.beta[...] = beta

    def loss(x, module):
        out = module(x)
        return jnp.sum(out * w), out

    (_, out), (dx, dmodule) = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, module)
    close(out, k_out)
    close(dx, k_dx)
    for name in ("gamma", "beta"):
        if name in k_dparams and hasattr(module, name):
            close(getattr(dmodule, name)[...], k_dparams[name])


def test_group_normalization_in_a_model_has_keras_s_weights_and_outputs():
    x = RNG.normal(size=(N, 4, 4, 6)).astype(np.float32)
    k = keras.Sequential([keras.Input((4, 4, 6)), K.GroupNormalization(groups=3)])
    k.set_weights([w + RNG.normal(scale=0.3, size=w.shape).astype(np.float32)
                   for w in k.get_weights()])
    p = pk.Sequential([pk.Input((4, 4, 6)), P.GroupNormalization(groups=3)])
    p.set_weights(k.get_weights())
    close(p.predict(x, batch_size=N, verbose=0), k.predict(x, verbose=0))
    assert [w.name for w in p.layers[0].weights] == ["gamma", "beta"]


# -- random layers -----------------------------------------------------------------------------
RANDOM = {
    "RandomFlip": lambda m: m.RandomFlip(),
    "RandomRotation": lambda m: m.RandomRotation(0.2, fill_mode="constant"),
    "RandomZoom": lambda m: m.RandomZoom(0.3, 0.2),
    "RandomTranslation": lambda m: m.RandomTranslation(0.2, 0.3, interpolation="nearest"),
    "RandomContrast": lambda m: m.RandomContrast(0.5),
    "RandomBrightness": lambda m: m.RandomBrightness(0.3),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_a_random_layer_in_inference_is_keras_s(name):
    got, want = _predict_both([RANDOM[name](K)], [RANDOM[name](P)], IMAGES)
    close(got, want)
    close(got, IMAGES)  # Keras's inference: the input, as float32


def test_random_crop_in_inference_is_keras_s_documented_center_crop():
    """Keras 3.15's code returns the uncropped image in inference (its next layer then gets
    another shape than the layer declares); its docstring's crop, the largest centered
    window of the target's aspect ratio resized, is Keras's Resizing(crop_to_aspect_ratio=
    True), which podkit gives."""
    for size in ((5, 7), (6, 6), (12, 8), (9, 11)):
        x = pk.Input(IMAGES.shape[1:])
        model = pk.Model(x, P.RandomCrop(*size)(x))
        close(model.predict(IMAGES, batch_size=N, verbose=0),
              K.Resizing(*size, crop_to_aspect_ratio=True)(IMAGES))


def _same_draw(name, keras_layer, podkit_layer, images, seed=1):
    """podkit's transform of its own draw against Keras's transform_images of that draw."""
    params = podkit_layer.draw(jax.random.key(seed), images.shape)
    got = podkit_layer.transform(jnp.asarray(images), params)
    if name == "RandomRotation":
        n = 1 if images.ndim == 3 else images.shape[0]
        h, w = images.shape[-3], images.shape[-2]
        zero, one = jnp.zeros(n), jnp.ones(n)
        matrix = keras_layer._compute_affine_matrix(0.5, 0.5, params["angle"], zero, zero, one,
                                                    zero, zero, h, w)
        params = {"rotation_matrix": matrix[0] if images.ndim == 3 else matrix}
    want = keras_layer.transform_images(images, params, training=True)
    return got, want


AFFINE = {
    "RandomRotation": lambda m, **kw: m.RandomRotation((-0.3, 0.4), **kw),
    "RandomZoom": lambda m, **kw: m.RandomZoom((-0.4, 0.5), (-0.3, 0.2), **kw),
    "RandomTranslation": lambda m, **kw: m.RandomTranslation(0.3, 0.4, **kw),
}


@pytest.mark.parametrize("name", sorted(AFFINE))
@pytest.mark.parametrize("fill_mode", ["reflect", "wrap", "constant", "nearest"])
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
def test_an_affine_layer_given_keras_s_draw_is_keras_s(name, fill_mode, interpolation):
    args = dict(fill_mode=fill_mode, interpolation=interpolation, fill_value=13.0)
    for images in (IMAGES, IMAGES[0]):
        got, want = _same_draw(name, AFFINE[name](K, **args), AFFINE[name](P, **args), images)
        close(got, want)


COLOR_AND_FLIP = {
    "RandomFlip horizontal": lambda m: m.RandomFlip("horizontal"),
    "RandomFlip vertical": lambda m: m.RandomFlip("vertical"),
    "RandomFlip both": lambda m: m.RandomFlip("horizontal_and_vertical"),
    "RandomContrast": lambda m: m.RandomContrast((0.2, 0.9)),
    "RandomContrast [0, 1]": lambda m: m.RandomContrast(0.8, value_range=(0, 1)),
    "RandomBrightness": lambda m: m.RandomBrightness((-0.4, 0.3)),
    "RandomBrightness [0, 1]": lambda m: m.RandomBrightness(0.5, value_range=(1, 0)),
    "RandomCrop": lambda m: m.RandomCrop(5, 7),
    "RandomCrop one dim equal": lambda m: m.RandomCrop(9, 7),
    "RandomCrop larger": lambda m: m.RandomCrop(12, 8),
}


@pytest.mark.parametrize("name", sorted(COLOR_AND_FLIP))
def test_a_random_layer_given_keras_s_draw_is_keras_s(name):
    images = IMAGES / 255.0 if "[0, 1]" in name else IMAGES
    for x in (images, images[0]):
        got, want = _same_draw(name, COLOR_AND_FLIP[name](K), COLOR_AND_FLIP[name](P), x)
        close(got, want)


CONFIGS = [
    ("Resizing", dict(height=4, width=5)),
    ("Resizing", dict(height=4, width=5, interpolation="lanczos3", pad_to_aspect_ratio=True,
                      fill_value=2.0, antialias=True)),
    ("CenterCrop", dict(height=4, width=5)),
    ("Rescaling", dict(scale=[0.5, 2.0, 1.0], offset=1.0)),
    ("Normalization", dict(axis=(1, 3), mean=[[1.0, 2.0]], variance=[[3.0, 4.0]],
                           invert=True)),
    ("GroupNormalization", dict(groups=4, epsilon=1e-5, center=False,
                                gamma_initializer="zeros", beta_regularizer="l2")),
    ("RandomFlip", dict(mode="vertical", seed=3)),
    ("RandomCrop", dict(height=4, width=5, seed=3)),
    ("RandomRotation", dict(factor=0.2, fill_mode="wrap", interpolation="nearest",
                            fill_value=1.0, seed=3)),
    ("RandomRotation", dict(factor=(-0.1, 0.3))),
    ("RandomZoom", dict(height_factor=0.2, width_factor=(-0.1, 0.3), fill_mode="constant",
                        seed=3)),
    ("RandomZoom", dict(height_factor=(0.1, 0.2))),
    ("RandomTranslation", dict(height_factor=0.2, width_factor=(-0.1, 0.3))),
    ("RandomContrast", dict(factor=0.4, value_range=(0, 1), seed=3)),
    ("RandomContrast", dict(factor=(0.1, 0.4))),
    ("RandomBrightness", dict(factor=0.4, value_range=(1, 0), seed=3)),
]


@pytest.mark.parametrize("name, args", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in
                                                     enumerate(CONFIGS)])
def test_the_config_is_keras_s_both_ways(name, args):
    """podkit's layer written as Keras writes it (what a .keras file holds, JSON), and
    Keras's config read back by podkit gives the same config."""
    import json

    from keras.src.saving import serialization_lib

    from podkit.interop.keras_config import keras_layer_config, layer_from_keras

    theirs = serialization_lib.serialize_keras_object(getattr(K, name)(**args))
    ours = keras_layer_config(getattr(P, name)(**args))
    normal = lambda entry: {k: v for k, v in json.loads(json.dumps(entry["config"])).items()
                            if k not in ("name", "dtype")}
    assert normal(ours) == normal(theirs)
    assert normal(keras_layer_config(layer_from_keras(theirs))) == normal(theirs)
