"""pk.layers.MultiHeadAttention: Keras's signature and shapes, the same outputs as the
attention written out by hand (causal, padding mask, cross-attention, splash in Pallas's
interpreter), training in a functional model, and its config through save and load."""

import numpy as np
import pytest

import podkit as pk

L = pk.layers


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def by_hand(module, query, value, key=None, mask=None, causal=False):
    """Keras's MultiHeadAttention written out in numpy from the built module's weights."""
    w = lambda name: np.asarray(getattr(module, name)[...], np.float64)
    key = value if key is None else key
    q = np.einsum("btd,dhk->bthk", query, w("query_kernel")) + w("query_bias")
    k = np.einsum("btd,dhk->bthk", key, w("key_kernel")) + w("key_bias")
    v = np.einsum("btd,dhk->bthk", value, w("value_kernel")) + w("value_bias")
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    allowed = np.ones(scores.shape[-2:], bool)
    if causal:
        allowed = np.tril(allowed)
    if mask is not None:
        allowed = allowed & (mask[:, None] > 0)
    probs = softmax(np.where(allowed, scores, -1e30))
    h = np.einsum("bhqk,bkhd->bqhd", probs, v)
    return np.einsum("bqhv,hvo->bqo", h, w("output_kernel")) + w("output_bias")


def attention_module(model):
    return next(m for m in model.module().layers if type(m).__name__.startswith("MultiHead"))


def test_shapes_follow_keras():
    q, v = pk.Input((8, 16)), pk.Input((6, 12))
    assert L.MultiHeadAttention(2, 4)(q, v).shape == (None, 8, 16)  # back to query's dim
    assert L.MultiHeadAttention(2, 4, value_dim=3, output_shape=5)(q, v).shape == (None, 8, 5)
    assert L.MultiHeadAttention(2, 4, output_shape=(2, 3))(q, v, key=pk.Input((6, 7))).shape \
        == (None, 8, 2, 3)
    with pytest.raises(pk.ConfigError, match=r"attention_mask of shape \(None, 6, 8\).*"
                                             r"\(batch, 8, 6\)"):
        L.MultiHeadAttention(2, 4)(q, v, attention_mask=pk.Input((6, 8)))
    with pytest.raises(pk.ConfigError, match="differ in length"):
        L.MultiHeadAttention(2, 4)(q, v, key=pk.Input((5, 12)))
    with pytest.raises(pk.ConfigError, match=r"takes query and value: layer\(query, value\)"):
        L.MultiHeadAttention(2, 4)(q)
    with pytest.raises(pk.ConfigError, match="cannot be a layer of a Sequential"):
        model = pk.Sequential([pk.Input((8, 16)), L.MultiHeadAttention(2, 4)])
        model.compile(optimizer="adam", loss="mse")
        model.build((None, 8, 16))
    with pytest.raises(pk.ConfigError, match=r"attention='flash'.*'auto', 'xla', 'splash'"):
        L.MultiHeadAttention(2, 4, attention="flash")
    with pytest.raises(pk.ConfigError, match=r"num_heads=0"):
        L.MultiHeadAttention(0, 4)
    with pytest.raises(pk.ConfigError, match=r"does not support: attention_axes"):
        L.MultiHeadAttention(2, 4, attention_axes=(1,))


@pytest.mark.parametrize("attention,time", [("auto", 16), ("splash", 128)])
def test_causal_self_attention_is_the_computation_by_hand(attention, time):
    x = pk.Input((time, 16))
    model = pk.Model(x, L.MultiHeadAttention(2, 8, attention=attention)(
        x, x, use_causal_mask=True))
    xs = np.random.default_rng(0).normal(size=(4, time, 16)).astype(np.float32)
    out = model.predict(xs, verbose=0)
    np.testing.assert_allclose(out, by_hand(attention_module(model), xs, xs, causal=True),
                               rtol=1e-4, atol=1e-4)


def test_cross_attention_with_a_padding_mask_is_the_computation_by_hand():
    query, value, key = pk.Input((8, 16), name="q"), pk.Input((12, 6), name="v"), \
        pk.Input((12, 10), name="k")
    mask = pk.Input((8, 12), name="mask")
    layer = L.MultiHeadAttention(3, 4, value_dim=5)
    model = pk.Model([query, value, key, mask], layer(query, value, key=key,
                                                      attention_mask=mask))
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(4, *s)).astype(np.float32) for s in ((8, 16), (12, 6), (12, 10))]
    lengths = np.array([12, 9, 5, 1])
    m = np.broadcast_to(np.arange(12)[None, None] < lengths[:, None, None], (4, 8, 12))
    m = m.astype(np.float32)
    out = model.predict(dict(q=xs[0], v=xs[1], k=xs[2], mask=m), verbose=0)
    np.testing.assert_allclose(out, by_hand(attention_module(model), xs[0], xs[1], xs[2],
                                            mask=m), rtol=1e-4, atol=1e-4)


def test_a_functional_model_with_attention_learns():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(128, 12, 8)).astype(np.float32)
    # the running mean of the first feature: each position needs the ones before it
    y = (np.cumsum(x[..., :1], axis=1) / np.arange(1, 13)[None, :, None]).astype(np.float32)
    inputs = pk.Input((12, 8))
    h = L.MultiHeadAttention(2, 8)(inputs, inputs, use_causal_mask=True)
    model = pk.Model(inputs, L.Dense(1)(h))
    model.compile(optimizer=pk.optimizers.Adam(learning_rate=1e-2), loss="mse")
    losses = model.fit(x, y, batch_size=32, epochs=6, verbose=0).history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses


def test_config_round_trips_through_save_and_load(tmp_path):
    layer = L.MultiHeadAttention(2, 4, value_dim=3, dropout=0.1, use_bias=False,
                                 output_shape=(6,), attention="xla",
                                 kernel_initializer="he_normal", name="mha")
    config = layer.get_config()
    assert config["output_shape"] == [6] and config["attention"] == "xla"
    assert L.MultiHeadAttention.from_config(config).get_config() == config
    assert L.deserialize(L.serialize(layer)).get_config() == config
    x = pk.Input((8, 6))
    model = pk.Model(x, layer(x, x, use_causal_mask=True))
    model.compile(optimizer="adam", loss="mse")
    ops = model.get_config()["ops"]
    assert [op.get("options") for op in ops] == [{"use_causal_mask": True}]
    xs = np.random.default_rng(3).normal(size=(4, 8, 6)).astype(np.float32)
    model.fit(xs, xs, epochs=1, verbose=0)  # with dropout on the probabilities
    assert np.isfinite(model.evaluate(xs, xs, verbose=0))
    model.save(tmp_path / "m")
    loaded = pk.models.load_model(tmp_path / "m")
    # the same weights, and no dropout outside training: the same outputs
    np.testing.assert_array_equal(loaded.predict(xs, verbose=0), model.predict(xs, verbose=0))
    # causal: the first position sees only itself, whatever comes after it
    changed = xs.copy()
    changed[:, 1:] += 1.0
    np.testing.assert_allclose(loaded.predict(changed, verbose=0)[:, 0],
                               loaded.predict(xs, verbose=0)[:, 0], rtol=1e-5, atol=1e-6)
