"""pk.Input(dtype="int64") without jax_enable_x64: one podkit note, no JAX truncation
warnings (every tf.train.Example integer is int64)."""

import warnings

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.layers import symbolic


@pytest.mark.skipif(jax.config.jax_enable_x64, reason="64-bit types are on: nothing narrows")
def test_an_int64_input_gives_one_note_and_no_jax_truncation_warning(monkeypatch):
    monkeypatch.setattr(symbolic, "_noted", set())  # as in a fresh process
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 10, (8, 3)).astype(np.int64)
    one = rng.integers(0, 10, (8, 1)).astype(np.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = pk.Input((3,), dtype="int64", name="ids")
        b = pk.Input((1,), dtype="int64", name="one")
        h = pk.layers.Concatenate()([pk.layers.Flatten()(pk.layers.Embedding(10, 2)(a)),
                                     pk.layers.Flatten()(pk.layers.Embedding(10, 2)(b))])
        model = pk.Model([a, b], pk.layers.Dense(1)(h))
        model.compile(optimizer="sgd", loss="mse")
        model.fit([ids, one], np.zeros((8, 1), np.float32), batch_size=4, verbose=0)
        out = model.predict([ids, one], verbose=0)
    notes = [w for w in caught if issubclass(w.category, symbolic.DtypeNote)]
    assert len(notes) == 1, [str(w.message) for w in notes]
    text = str(notes[0].message)
    assert "dtype='int64') is computed as int32" in text and "JAX_ENABLE_X64=1" in text
    assert notes[0].filename == __file__  # the user's line, not podkit's
    assert not [w for w in caught if "truncated" in str(w.message)]
    assert out.shape == (8, 1)
    assert a.dtype == np.int64  # the declared dtype is kept (a saved config says int64)


def test_a_32_bit_input_gives_no_note(monkeypatch):
    monkeypatch.setattr(symbolic, "_noted", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pk.Input((3,), dtype="int32")
        pk.Input((3,))
    assert not [w for w in caught if issubclass(w.category, symbolic.DtypeNote)]


@pytest.mark.parametrize("dtype", ["string", str, bytes, "object"])
def test_a_string_input_names_text_vectorization_in_the_pipeline(dtype):
    """Keras's `Input(dtype="string")` (for a TextVectorization in the model): strings never
    enter XLA, so the fix is named, not numpy's "data type 'string' not understood"."""
    with pytest.raises(pk.ConfigError, match=r"strings never enter XLA.*TextVectorization.*"
                                             r"ds\.map\(lambda x, y: \(vectorize\(x\), y\)\)"):
        pk.Input((1,), dtype=dtype)
    with pytest.raises(pk.ConfigError, match=r"'floaty' is not a dtype"):
        pk.Input((1,), dtype="floaty")


POLICY = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"},
          "registered_name": None}


def test_keras_s_dtype_policy_dicts_are_dtypes():
    """Every Keras 3 layer's config holds its dtype as a serialized DTypePolicy: a layer, a
    subclassed model and an input take it where they take a dtype; a policy that is not
    float32 is an error naming it."""

    class Twice(pk.layers.Layer):
        def build(self, input_shape, rngs):
            return pk.layers.base.Fn(lambda x: 2 * x)

    class Net(pk.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.twice = Twice(name="twice", trainable=True, dtype=POLICY)

        def call(self, x, training=False):
            return self.twice(x)

    assert pk.Input((2,), dtype=POLICY).dtype == np.float32
    assert pk.layers.Dense(2, dtype=POLICY).get_config()["units"] == 2
    model = Net(name="net", trainable=True, dtype=POLICY)
    np.testing.assert_array_equal(model.predict(np.ones((8, 2), np.float32), verbose=0), 2.0)
    mixed = {**POLICY, "config": {"name": "mixed_bfloat16"}}
    with pytest.raises(pk.ConfigError, match=r"dtype 'mixed_bfloat16'; podkit's layers "
                                             r"compute in float32"):
        pk.layers.Dense(2, dtype=mixed)
    with pytest.raises(pk.ConfigError, match=r"'mixed_bfloat16'"):
        Net(dtype=mixed)
    with pytest.raises(pk.ConfigError, match=r"not a Keras dtype policy"):
        pk.layers.Dense(2, dtype={"class_name": "DTypePolicyMap", "config": {}})
