"""Keras 3's files both ways, against Keras itself (JAX backend, a dev dependency): a `.keras`
of each layer family podkit shares with Keras, written by Keras, loads in podkit with equal
predictions; podkit's `.keras` loads in Keras with equal predictions; `.weights.h5` both ways;
tf.keras's legacy `.h5` written by Keras 3's legacy writer; registered subclasses; errors
that name what podkit lacks; object storage."""

import json
import os
import re
import uuid
import zipfile

import flax.nnx as nnx
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning",
                                        "ignore:Skipping variable loading for optimizer")
L = keras.layers
N = 8  # examples: a multiple of the test process's 8 devices
RNG = np.random.default_rng(0)


def _randomize(model):
    """Non-trivial weights (zero biases and unit scales would hide a swapped variable)."""
    model.set_weights([w + RNG.normal(scale=0.2, size=w.shape).astype(w.dtype)
                       if w.dtype.kind == "f" and w.ndim else w for w in model.get_weights()])


def _core():
    x = keras.Input((6,), name="x")
    ids = keras.Input((5,), dtype="int32", name="ids")
    h = L.Dense(8, activation="relu", kernel_regularizer="l2")(x)
    h = L.Dropout(0.3)(h)
    e = L.Embedding(12, 4)(ids)
    e = L.Flatten()(e)
    e = L.Dense(8, use_bias=False)(e)
    parts = [L.Add()([h, e]), L.Subtract()([h, e]), L.Multiply()([h, e]),
             L.Average()([h, e]), L.Maximum()([h, e]), L.Minimum()([h, e])]
    merged = L.Concatenate()(parts)
    merged = L.Dense(6)(merged)
    acts = L.Concatenate()([L.ReLU()(merged), L.LeakyReLU()(merged), L.PReLU()(merged),
                            L.ELU()(merged), L.Activation("tanh")(merged)])
    dot = L.Dot(axes=1, normalize=True)([merged, L.Dense(6)(merged)])
    seq = L.Reshape((5, 6))(L.Dense(30)(acts))
    seq = L.Permute((2, 1))(seq)
    seq = L.Flatten()(L.GaussianNoise(0.1)(seq))
    rep = L.Flatten()(L.RepeatVector(2)(dot))
    hot = L.CategoryEncoding(num_tokens=12, output_mode="multi_hot")(ids)
    out = L.Softmax()(L.Dense(3)(L.Concatenate()([seq, dot, rep, hot])))
    inputs = [RNG.normal(size=(N, 6)).astype("float32"),
              RNG.integers(0, 12, size=(N, 5)).astype("int32")]
    return keras.Model([x, ids], out), inputs


def _conv():
    model = keras.Sequential([
        keras.Input((12, 12, 3)),
        L.Conv2D(4, 3, padding="same", activation="relu"),
        L.BatchNormalization(),
        L.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
        L.SeparableConv2D(4, 3),
        L.MaxPooling2D(),
        L.Conv2DTranspose(3, 3, strides=2, padding="same"),
        L.ZeroPadding2D(1),
        L.Cropping2D(2),
        L.UpSampling2D(2),
        L.AveragePooling2D(2),
        L.SpatialDropout2D(0.2),
        L.LayerNormalization(),
        L.GlobalAveragePooling2D(),
        L.Rescaling(0.5, offset=0.1),
        L.Dense(3),
    ])
    return model, RNG.normal(size=(N, 12, 12, 3)).astype("float32")


def _conv1d():
    x = keras.Input((16, 3))
    masked = L.GlobalAveragePooling1D()(L.Masking()(x))  # a mask pooling reads
    a = L.SpatialDropout1D(0.1)(x)
    a = L.Conv1D(4, 3, padding="causal", dilation_rate=2)(a)
    a = L.MaxPooling1D()(a)
    a = L.AveragePooling1D(2)(a)
    b = L.GlobalMaxPooling1D()(a)
    c = L.GlobalAveragePooling1D()(a)
    d = L.GlobalMaxPooling2D()(L.Reshape((4, 4, 1))(L.Flatten()(a)))
    data = RNG.normal(size=(N, 16, 3)).astype("float32")
    data[:, 12:] = 0.0  # masked steps
    return keras.Model(x, L.Concatenate()([b, c, d, masked])), data


def _recurrent():
    ids = keras.Input((7,), dtype="int32")
    e = L.Embedding(20, 6, mask_zero=True)(ids)
    s = L.LSTM(5, return_sequences=True)(e)
    s = L.Bidirectional(L.GRU(4, return_sequences=True))(s)
    t = L.TimeDistributed(L.Dense(3))(s)
    r = L.SimpleRNN(4)(t)
    _, h, c = L.LSTM(3, return_state=True)(s)
    # Attention on a sequence without a mask: podkit's MultiHeadAttention does not pass its
    # query's mask on to the next layer as Keras's does (docs/keras.md, "Keras files").
    seq = keras.Input((5, 4))
    a = L.MultiHeadAttention(num_heads=2, key_dim=3)(seq, seq)
    a = L.GlobalAveragePooling1D()(a)
    out = L.Concatenate()([r, h, c, a])
    ids_data = RNG.integers(1, 20, size=(N, 7)).astype("int32")
    ids_data[:, 5:] = 0
    return keras.Model([ids, seq], out), [ids_data, RNG.normal(size=(N, 5, 4)).astype(
        "float32")]


def _preprocessing_and_nested():
    norm = L.Normalization()
    norm.adapt(RNG.normal(loc=2.0, scale=3.0, size=(32, 5)).astype("float32"))
    inner = keras.Sequential([keras.Input((5,)), L.Dense(4, activation="relu"), L.Dense(4)],
                             name="inner_seq")
    fi = keras.Input((4,))
    inner_f = keras.Model(fi, L.Dense(2)(L.Dense(3)(fi)), name="inner_functional")
    x = keras.Input((5,))
    h = norm(x)
    h = inner(h)
    out = inner_f(h)
    return keras.Model(x, out), RNG.normal(size=(N, 5)).astype("float32")


def _image_augmentation():
    """Keras's image preprocessing and augmentation layers (identity or deterministic in
    inference, as predict runs them), GroupNormalization, and Normalization both ways: given
    statistics (constants, no weights) and adapted (weights shaped as the kept axis)."""
    adapted = L.Normalization()
    adapted.adapt(RNG.uniform(0, 255, size=(16, 6, 6, 3)).astype("float32"))
    model = keras.Sequential([
        keras.Input((12, 14, 3)),
        L.RandomFlip(), L.RandomRotation(0.2, fill_mode="constant"), L.RandomZoom(0.1),
        L.RandomTranslation(0.1, 0.2, interpolation="nearest"),
        L.RandomContrast(0.3), L.RandomBrightness(0.2),
        L.Resizing(10, 10, interpolation="bicubic", crop_to_aspect_ratio=True),
        L.CenterCrop(8, 8), L.RandomCrop(8, 8), adapted,
        L.Normalization(mean=[0.1, 0.2, 0.3], variance=[1.0, 2.0, 3.0]),
        L.Rescaling(np.array([0.5, 1.0, 2.0], "float32"), offset=0.1),  # "__numpy__"
        L.Conv2D(6, 3), L.GroupNormalization(groups=3), L.GlobalAveragePooling2D(),
        L.Dense(3),
    ])
    return model, RNG.uniform(0, 255, size=(N, 12, 14, 3)).astype("float32")


FAMILIES = {"core_merge_activation": _core, "conv_pooling_normalization": _conv,
            "image_augmentation": _image_augmentation,
            "conv1d_pooling": _conv1d, "recurrent_attention": _recurrent,
            "preprocessing_nested": _preprocessing_and_nested}


def _predict(model, x):
    if isinstance(model, pk.Model):
        return model.predict(x, batch_size=N, verbose=0)
    return np.asarray(model.predict(x, verbose=0))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Each family: the model Keras loads from the .keras file Keras wrote, its input, and
    the file. (Keras's loaded model is the reference: an adapted Normalization whose weights
    were set afterwards computes with the old statistics until it is saved and loaded.)"""
    out = {}
    root = tmp_path_factory.mktemp("keras")
    for name, make in FAMILIES.items():
        model, x = make()
        _randomize(model)
        path = str(root / f"{name}.keras")
        model.save(path)
        out[name] = (keras.saving.load_model(path), x, path)
    return out


@pytest.fixture(scope="module")
def loaded(files):
    return {name: pk.models.load_model(path) for name, (_, _, path) in files.items()}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_keras_file_loads_with_keras_predictions(files, loaded, family):
    model, x, _ = files[family]
    np.testing.assert_allclose(_predict(loaded[family], x), _predict(model, x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_podkit_writes_a_keras_file_keras_loads(files, loaded, family, tmp_path):
    model, x, _ = files[family]
    path = str(tmp_path / "back.keras")
    loaded[family].save(path)
    back = keras.saving.load_model(path)
    np.testing.assert_allclose(_predict(back, x), _predict(model, x), rtol=1e-5, atol=1e-5)
    assert [type(layer).__name__ for layer in back.layers] == \
        [type(layer).__name__ for layer in model.layers]


@pytest.mark.filterwarnings("ignore:Model doesn't support `jit_compile=True`")  # Keras's
def test_a_keras_file_of_augmentation_layers_trains_in_podkit(files, tmp_path):
    """The loaded augmentation runs in podkit's compiled step: fit moves the weights, and
    predict (inference) stays Keras's deterministic output of the new weights."""
    _, x, path = files["image_augmentation"]
    model = pk.models.load_model(path)
    model.compile(optimizer="adam",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    y = RNG.integers(0, 3, size=N)
    history = model.fit(x, y, batch_size=N, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = model.get_weights()
    assert not np.allclose(before[-2], after[-2])  # the Dense kernel trained
    np.testing.assert_array_equal(before[0], after[0])  # the adapted mean did not
    model.save(str(tmp_path / "trained.keras"))
    back = keras.saving.load_model(str(tmp_path / "trained.keras"))
    np.testing.assert_allclose(_predict(back, x), _predict(model, x), rtol=1e-5, atol=1e-5)


def test_weights_files_go_both_ways(files, loaded, tmp_path):
    model, x, _ = files["recurrent_attention"]
    mine = loaded["recurrent_attention"]
    theirs = keras.models.clone_model(model)  # fresh weights in both directions
    mine.save_weights(str(tmp_path / "p.weights.h5"))
    theirs.load_weights(str(tmp_path / "p.weights.h5"))
    np.testing.assert_allclose(_predict(theirs, x), _predict(model, x), rtol=1e-5, atol=1e-5)
    _randomize(theirs)
    theirs.save_weights(str(tmp_path / "k.weights.h5"))
    mine.load_weights(str(tmp_path / "k.weights.h5"))
    np.testing.assert_allclose(_predict(mine, x), _predict(theirs, x), rtol=1e-5, atol=1e-5)
    mine.load_weights(files["recurrent_attention"][2])  # a .keras file's weights, as Keras
    np.testing.assert_allclose(_predict(mine, x), _predict(model, x), rtol=1e-5, atol=1e-5)


def test_the_compile_config_comes_along(tmp_path):
    model = keras.Sequential([keras.Input((4,)), L.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.save(str(tmp_path / "c.keras"))
    mine = pk.models.load_model(str(tmp_path / "c.keras"))
    assert mine.compiled and isinstance(mine.optimizer, pk.optimizers.Adam)
    assert mine.optimizer.learning_rate == pytest.approx(3e-3)
    mine.fit(np.zeros((N, 4), "float32"), np.zeros(N, "int32"), batch_size=N, verbose=0)
    assert not pk.models.load_model(str(tmp_path / "c.keras"), compile=False).compiled
    mine.save(str(tmp_path / "back.keras"))
    back = keras.saving.load_model(str(tmp_path / "back.keras"))
    assert type(back.optimizer).__name__ == "Adam"
    assert float(back.optimizer.learning_rate) == pytest.approx(3e-3)
    assert type(back.loss).__name__ == "SparseCategoricalCrossentropy"


def test_a_legacy_h5_model_and_weights_file_load(tmp_path):
    from keras.src.legacy.saving import legacy_h5_format

    x = keras.Input((6,))
    h = L.BatchNormalization()(L.Dense(5, activation="relu")(x))
    model = keras.Model(x, L.Dense(2)(h))
    model.compile(optimizer="sgd", loss="mse")
    _randomize(model)
    data = RNG.normal(size=(N, 6)).astype("float32")
    model.save(str(tmp_path / "m.h5"))  # Keras 3's legacy HDF5 writer, by the suffix
    mine = pk.models.load_model(str(tmp_path / "m.h5"))
    np.testing.assert_allclose(_predict(mine, data), _predict(model, data), rtol=1e-5,
                               atol=1e-5)
    assert isinstance(mine.optimizer, pk.optimizers.SGD)
    import h5py

    with h5py.File(tmp_path / "w.h5", "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, model)
    fresh = pk.models.load_model(str(tmp_path / "m.h5"), compile=False)
    fresh.set_weights([np.zeros_like(w) for w in fresh.get_weights()])
    fresh.load_weights(str(tmp_path / "w.h5"))
    np.testing.assert_allclose(_predict(fresh, data), _predict(model, data), rtol=1e-5,
                               atol=1e-5)


def _edit_config(path, out, edit):
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    config = json.loads(parts["config.json"])
    edit(config)
    parts["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(out, "w") as z:
        for n, data in parts.items():
            z.writestr(n, data)
    return str(out)


def test_a_layer_podkit_lacks_is_named_with_those_it_has(tmp_path):
    model = keras.Sequential([keras.Input((4,)), L.Dense(3), L.Dense(2)])
    model.save(str(tmp_path / "m.keras"))

    def rename(config):
        config["config"]["layers"][1]["class_name"] = "ConvLSTM3D"
    path = _edit_config(tmp_path / "m.keras", tmp_path / "u.keras", rename)
    with pytest.raises(ConfigError, match=r"'dense\w*' \(ConvLSTM3D\) is a Keras built-in layer "
                                          r"that podkit does not have yet.*Bidirectional, "
                                          r".*Dense, .*LSTM") as caught:
        pk.models.load_model(path)
    assert "register" not in str(caught.value).replace("registering a class", "")


@keras.saving.register_keras_serializable(package="podkit_tests")
class KerasOnly(L.Layer):
    def call(self, x):
        return x


@pytest.mark.parametrize("layer, expected", [
    (L.RandomShear, r"'random_shear\w*' \(RandomShear\) is a Keras built-in layer that podkit "
                    r"does not have yet.*input pipeline.*ds\.map"),
    (L.UnitNormalization, r"\(UnitNormalization\) is a Keras built-in layer that podkit does "
                          r"not have yet.*without it"),
    (KerasOnly, r"\(KerasOnly\) is not a layer podkit has.*register_keras_serializable.*"
                r"custom_objects=\{'podkit_tests>KerasOnly': cls\}"),
])
def test_only_a_class_of_the_users_gets_the_register_advice(tmp_path, layer, expected):
    model = keras.Sequential([keras.Input((6, 6, 2)), layer(), L.Flatten(), L.Dense(2)])
    model.save(str(tmp_path / "m.keras"))
    with pytest.raises(ConfigError, match=expected) as caught:
        pk.models.load_model(str(tmp_path / "m.keras"))
    builtin = layer is not KerasOnly
    assert ("register_keras_serializable" in str(caught.value)) is not builtin


def test_the_builtin_layer_names_are_keras_s():
    """keras_builtins' lists (what a legacy file's module-less entries are looked up in, and
    which get the input-pipeline advice) are keras.layers' classes."""
    import inspect

    from podkit.interop import keras_builtins

    classes = {c for c in vars(keras.layers).values()
               if inspect.isclass(c) and issubclass(c, keras.layers.Layer)}
    preprocessing = {c.__name__ for c in classes
                     if c.__module__.startswith("keras.src.layers.preprocessing")}
    assert keras_builtins.PREPROCESSING == preprocessing
    assert keras_builtins.OTHERS == {c.__name__ for c in classes} - preprocessing
    assert keras_builtins.is_builtin({"class_name": "RandomFlip"})  # tf.keras 2: no module
    assert not keras_builtins.is_builtin({"module": None, "class_name": "Dense"})
    assert not keras_builtins.is_builtin({"module": "keras_hub.src.layers", "class_name": "X"})


def test_an_option_podkit_lacks_is_named():
    stateful = keras.Sequential([keras.Input((3, 2), batch_size=N),
                                 L.LSTM(2, stateful=True)])
    from keras.src.saving import serialization_lib

    from podkit.interop.keras_config import model_from_keras

    with pytest.raises(ConfigError, match=r"LSTM\(stateful=True\).*not supported"):
        model_from_keras(serialization_lib.serialize_keras_object(stateful))


def test_a_compile_podkit_lacks_is_an_error_unless_compile_false(tmp_path):
    model = keras.Sequential([keras.Input((4,)), L.Dense(2)])
    model.compile(optimizer=keras.optimizers.Muon(), loss="mse")
    model.save(str(tmp_path / "m.keras"))
    with pytest.raises(ConfigError, match="optimizer 'Muon'.*compile=False"):
        pk.models.load_model(str(tmp_path / "m.keras"))
    assert pk.models.load_model(str(tmp_path / "m.keras"), compile=False).built


@pk.interop.register_keras_serializable(package="podkit_tests")
class TwoLayers(pk.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = pk.layers.Dense(units, activation="relu")
        self.out = pk.layers.Dense(2)

    def call(self, inputs, training=False):
        return self.out(self.hidden(inputs))

    def get_config(self):
        return {"units": self.units}


@keras.saving.register_keras_serializable(package="podkit_tests")
class KerasTwoLayers(keras.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = L.Dense(units, activation="relu")
        self.out = L.Dense(2)

    def call(self, inputs, training=False):
        return self.out(self.hidden(inputs))

    def get_config(self):
        return {"units": self.units}


def test_a_registered_subclass_loads(tmp_path):
    model = KerasTwoLayers(units=4)
    x = RNG.normal(size=(N, 5)).astype("float32")
    model(x)
    _randomize(model)
    model.save(str(tmp_path / "s.keras"))
    with pytest.raises(ConfigError, match="KerasTwoLayers.*register_keras_serializable"):
        pk.models.load_model(str(tmp_path / "s.keras"))
    mine = pk.models.load_model(str(tmp_path / "s.keras"),
                                custom_objects={"podkit_tests>KerasTwoLayers": TwoLayers})
    assert isinstance(mine, TwoLayers) and mine.units == 4
    np.testing.assert_allclose(_predict(mine, x), _predict(model, x), rtol=1e-5, atol=1e-5)
    mine.save(str(tmp_path / "back.keras"))  # written under podkit's registered name
    back = keras.saving.load_model(str(tmp_path / "back.keras"),
                                   custom_objects={"podkit_tests>TwoLayers": KerasTwoLayers})
    np.testing.assert_allclose(_predict(back, x), _predict(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_keras_files_on_object_storage(scheme, request, files, loaded):
    from storage_servers import BUCKET

    request.getfixturevalue("s3" if scheme == "s3" else "gcs")
    model, x, path = files["conv1d_pooling"]
    url = f"{scheme}://{BUCKET}/keras-{uuid.uuid4().hex[:12]}"
    loaded["conv1d_pooling"].save(f"{url}/m.keras")
    loaded["conv1d_pooling"].save_weights(f"{url}/m.weights.h5")
    back = pk.models.load_model(f"{url}/m.keras")
    np.testing.assert_allclose(_predict(back, x), _predict(model, x), rtol=1e-5, atol=1e-5)
    back.set_weights([np.zeros_like(w) for w in back.get_weights()])
    back.load_weights(f"{url}/m.weights.h5")
    np.testing.assert_allclose(_predict(back, x), _predict(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_weight_names_are_keras(files, loaded, family):
    model = files[family][0]
    assert [w.name for w in loaded[family].weights] == [w.name for w in model.weights]
    assert [w.shape for w in loaded[family].weights] == [tuple(w.shape) for w in model.weights]
    if family in ("core_merge_activation", "conv1d_pooling"):
        # Keras puts a Sequential's name before its layers' paths (its name scope), and a
        # Bidirectional's before its sublayers' only when it was built in code; a functional
        # model's layers have their own paths, as podkit's
        assert [w.path for w in loaded[family].weights] == [w.path for w in model.weights]
    if family == "recurrent_attention":
        # No layer name, and no unique-name counter of a sublayer ("forward_gru_6": the count
        # of GRUs this process made before, which depends on the tests run before it).
        paths = [re.sub(r"_\d+(?=/)", "", w.path.split("/", 1)[1])
                 for w in loaded[family].weights]
        assert {"embeddings", "lstm_cell/kernel", "forward_gru/gru_cell/recurrent_kernel",
                "attention_output/kernel"} <= set(paths), paths
        assert any(p.startswith("forward_gru") for p in paths), paths


def test_from_config_reads_keras_configs(files):
    functional = files["recurrent_attention"][0]
    model = pk.Model.from_config(functional.get_config())
    assert [layer.name for layer in model.layers] == \
        [layer.name for layer in functional.layers if type(layer).__name__ != "InputLayer"]
    sequential = files["conv_pooling_normalization"][0]
    model = pk.Sequential.from_config(sequential.get_config())
    assert isinstance(model, pk.Sequential) and len(model.layers) == len(sequential.layers)
    with pytest.raises(ConfigError, match="Sequential model's config.*pk.Sequential"):
        pk.Model.from_config(pk.Sequential([pk.layers.Dense(2)]).get_config())
    with pytest.raises(ConfigError, match="functional model's config.*pk.Model.from_config"):
        pk.Sequential.from_config(functional.get_config())


def test_the_suffix_chooses_the_format_as_in_keras(loaded, tmp_path):
    model = loaded["conv1d_pooling"]
    with pytest.raises(ConfigError, match=r"legacy HDF5 model format; save to a \.keras"):
        model.save(str(tmp_path / "m.h5"))
    with pytest.raises(ConfigError, match=r"ends in \.weights\.h5"):
        model.save_weights(str(tmp_path / "m.h5"))
    model.save_weights(str(tmp_path / "m.weights.h5"))
    with pytest.raises(ConfigError, match=r"weights file.*model\.load_weights"):
        pk.models.load_model(str(tmp_path / "m.weights.h5"))
    model.save(str(tmp_path / "plain"))  # no suffix: podkit's own directory, as before
    assert (tmp_path / "plain" / "model.json").exists()


# -- a layer of the user's, a subclass written as Keras users write it ------------------------
class _AffineModule(nnx.Module):
    """x @ w * scale + bias + shift: the non-trainable `shift` made first, and `scale` and
    `bias` of one shape, so that a misplaced weight is a wrong number, not a shape error."""

    def __init__(self, features, units, rngs):
        self.shift = nnx.BatchStat(jnp.zeros(units))
        self.w = nnx.Param(nnx.initializers.glorot_uniform()(rngs.params(), (features, units)))
        self.scale = nnx.Param(jnp.ones(units))
        self.bias = nnx.Param(jnp.zeros(units))

    def __call__(self, x):
        return x @ self.w[...] * self.scale[...] + self.bias[...] + self.shift[...]


@pk.interop.register_keras_serializable(package="podkit_tests")
class Affine(pk.layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    def build(self, input_shape, rngs):
        return _AffineModule(input_shape[-1], self.units, rngs)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="podkit_tests", name="Affine")
class KerasAffine(L.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.shift = self.add_weight(shape=(self.units,), initializer="zeros",
                                     trainable=False, name="shift")
        self.w = self.add_weight(shape=(input_shape[-1], self.units), name="w")
        self.scale = self.add_weight(shape=(self.units,), initializer="ones", name="scale")
        self.bias = self.add_weight(shape=(self.units,), initializer="zeros", name="bias")

    def call(self, x):
        return keras.ops.matmul(x, self.w) * self.scale + self.bias + self.shift

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@pk.interop.register_keras_serializable(package="podkit_tests")
class Head(pk.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = pk.layers.Dense(units, activation="relu")
        self.affine = Affine(2)

    def call(self, inputs, training=False):
        return self.affine(self.hidden(inputs))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable(package="podkit_tests", name="Head")
class KerasHead(keras.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = L.Dense(units, activation="relu")
        self.affine = KerasAffine(2)

    def call(self, inputs, training=False):
        return self.affine(self.hidden(inputs))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def _both_ways(model, x, tmp_path):
    """Keras saves, podkit loads (the same weights, Keras's outputs); podkit saves, Keras
    loads (the same weights and outputs)."""
    _randomize(model)
    model.save(str(tmp_path / "k.keras"))
    mine = pk.models.load_model(str(tmp_path / "k.keras"))
    for a, b in zip(mine.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(_predict(mine, x), _predict(model, x), rtol=1e-5, atol=1e-5)
    mine.save(str(tmp_path / "p.keras"))
    back = keras.saving.load_model(str(tmp_path / "p.keras"))
    for a, b in zip(back.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(_predict(back, x), _predict(model, x), rtol=1e-5, atol=1e-5)
    return mine, back


def test_a_registered_layer_of_the_users_goes_both_ways(tmp_path):
    inputs = keras.Input((5,))
    model = keras.Model(inputs, L.Dense(2)(KerasAffine(3)(L.Dense(4)(inputs))))
    x = RNG.normal(size=(N, 5)).astype("float32")
    mine, back = _both_ways(model, x, tmp_path)
    affine = mine.layers[1]
    assert isinstance(affine, Affine) and affine.units == 3
    assert [w.name for w in affine.weights] == ["w", "scale", "bias", "shift"]  # Keras's
    assert type(back.layers[2]) is KerasAffine
    mine.save(str(tmp_path / "own"))  # podkit's directory names the class by its key too
    again = pk.models.load_model(str(tmp_path / "own"))
    np.testing.assert_allclose(_predict(again, x), _predict(model, x), rtol=1e-5, atol=1e-5)


def test_a_subclass_with_keras_s_get_config_goes_both_ways(tmp_path):
    model = KerasHead(units=4)
    x = RNG.normal(size=(N, 5)).astype("float32")
    model(x)
    mine, back = _both_ways(model, x, tmp_path)
    assert isinstance(mine, Head) and mine.units == 4
    config = mine.get_config()  # Keras's base config under the subclass's own
    assert {k: config[k] for k in ("name", "trainable", "units")} == \
        {"name": model.name, "trainable": True, "units": 4}
    assert config["dtype"]["config"]["name"] == "float32"
    assert isinstance(back, KerasHead) and back.units == 4


def test_a_subclass_made_frozen_is_frozen():
    """Model(trainable=False), as a frozen Keras model's config gives it: every layer the
    subclass makes after super().__init__() is frozen, as in Keras."""
    model = Head(units=3, trainable=False)
    assert not model.trainable and model.get_config()["trainable"] is False
    assert [layer.trainable for layer in model.layers] == [False, False]
    model.trainable = True
    assert model.trainable and all(layer.trainable for layer in model.layers)


@pytest.mark.filterwarnings("ignore::podkit.layers.symbolic.DtypeNote")
def test_a_model_split_off_its_text_vectorization_goes_back_to_keras(tmp_path):
    """The golden file Keras (TensorFlow backend) wrote with a TextVectorization: podkit's
    model of the ids, saved, is a model Keras (JAX) loads, with Keras's outputs on the
    ids."""
    from pathlib import Path

    from podkit.interop.keras_text import SplitOffWarning

    golden = Path(__file__).resolve().parents[1] / "golden" / "keras"
    data = np.load(golden / "text_functional.npz")
    with pytest.warns(SplitOffWarning):
        mine = pk.models.load_model(str(golden / "text_functional.keras"))
    mine.save(str(tmp_path / "ids.keras"))
    back = keras.saving.load_model(str(tmp_path / "ids.keras"))
    np.testing.assert_allclose(_predict(back, data["ids"]), data["y"], rtol=1e-5, atol=1e-5)
