"""Each podkit layer against Keras 3 itself (JAX backend): the same weights give the same
outputs to 1e-5. Keras's weights go in through podkit's `set_weights`, so the layouts and the
order of the weights are checked too. Keras is a dev dependency; without it these skip."""

import os

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras's own, numpy 2
L, P = keras.layers, pk.layers

RNG = np.random.default_rng(0)
N = 8  # examples: a multiple of the test process's 8 devices


def _floats(*shape):
    return RNG.normal(size=(N, *shape)).astype(np.float32)


def _ids(*shape, high=10, zero_tail=False):
    ids = RNG.integers(1, high, size=(N, *shape)).astype(np.int32)
    if zero_tail:  # variable lengths: padding (0) at the end of each row
        for i in range(N):
            ids[i, RNG.integers(1, shape[0]):] = 0
    return ids


def _randomize(model):
    """Keras's initial weights, made non-trivial (zero biases and slopes test nothing)."""
    model.set_weights([w + RNG.normal(scale=0.1, size=w.shape).astype(w.dtype)
                       if w.dtype.kind == "f" else w for w in model.get_weights()])


def _compare(keras_layer, podkit_layer, *inputs, randomize=True):
    """Both layers called on inputs shaped like `inputs` (a list: a merge layer)."""
    shapes = [a.shape[1:] for a in inputs]
    dtypes = [a.dtype.name for a in inputs]
    k_in = [keras.Input(s, dtype=d) for s, d in zip(shapes, dtypes, strict=True)]
    k_out = keras_layer(k_in if len(k_in) > 1 else k_in[0])
    k_model = keras.Model(k_in, k_out)
    if randomize:
        _randomize(k_model)
    p_in = [pk.Input(s, dtype=d) for s, d in zip(shapes, dtypes, strict=True)]
    p_out = podkit_layer(p_in if len(p_in) > 1 else p_in[0])
    p_model = pk.Model(p_in, p_out)
    p_model.set_weights(k_model.get_weights())
    args = list(inputs) if len(inputs) > 1 else inputs[0]
    want = k_model.predict(args, verbose=0)
    got = p_model.predict(args, batch_size=N, verbose=0)
    want = list(want) if isinstance(want, list | tuple) else [want]
    got = list(got) if isinstance(got, list | tuple) else [got]
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    for w, g in zip(k_model.get_weights(), p_model.get_weights(), strict=True):
        np.testing.assert_array_equal(g, w)  # the order and layout round trip


CASES = {
    "Dense": (lambda m: m.Dense(5, activation="relu"), [_floats(6)]),
    "Conv1D valid": (lambda m: m.Conv1D(4, 3), [_floats(10, 3)]),
    "Conv1D same strided": (lambda m: m.Conv1D(4, 3, strides=2, padding="same"),
                            [_floats(10, 3)]),
    "Conv1D causal dilated": (lambda m: m.Conv1D(4, 3, padding="causal", dilation_rate=2),
                              [_floats(10, 3)]),
    "Conv2D": (lambda m: m.Conv2D(4, 3, padding="same"), [_floats(7, 7, 2)]),
    "Conv2DTranspose valid": (lambda m: m.Conv2DTranspose(3, 3, strides=2),
                              [_floats(5, 5, 2)]),
    "Conv2DTranspose same": (lambda m: m.Conv2DTranspose(3, 3, strides=2, padding="same"),
                             [_floats(5, 5, 2)]),
    "Conv2DTranspose output_padding": (
        lambda m: m.Conv2DTranspose(3, 4, strides=2, padding="same", output_padding=1),
        [_floats(5, 5, 2)]),
    "DepthwiseConv2D": (lambda m: m.DepthwiseConv2D(3, depth_multiplier=2, padding="same"),
                        [_floats(6, 6, 3)]),
    "SeparableConv2D": (lambda m: m.SeparableConv2D(4, 3, depth_multiplier=2, strides=2),
                        [_floats(7, 7, 3)]),
    "MaxPooling1D": (lambda m: m.MaxPooling1D(3, strides=2), [_floats(9, 2)]),
    "AveragePooling1D same": (lambda m: m.AveragePooling1D(3, strides=2, padding="same"),
                              [_floats(9, 2)]),
    "MaxPooling2D": (lambda m: m.MaxPooling2D(), [_floats(6, 6, 2)]),
    "AveragePooling2D same": (lambda m: m.AveragePooling2D(3, strides=2, padding="same"),
                              [_floats(7, 7, 2)]),
    "GlobalAveragePooling1D": (lambda m: m.GlobalAveragePooling1D(), [_floats(5, 3)]),
    "GlobalMaxPooling1D": (lambda m: m.GlobalMaxPooling1D(keepdims=True), [_floats(5, 3)]),
    "GlobalAveragePooling2D": (lambda m: m.GlobalAveragePooling2D(), [_floats(4, 4, 3)]),
    "GlobalMaxPooling2D": (lambda m: m.GlobalMaxPooling2D(), [_floats(4, 4, 3)]),
    "UpSampling2D nearest": (lambda m: m.UpSampling2D((2, 3)), [_floats(3, 4, 2)]),
    "UpSampling2D bilinear": (lambda m: m.UpSampling2D(2, interpolation="bilinear"),
                              [_floats(3, 4, 2)]),
    "ZeroPadding2D": (lambda m: m.ZeroPadding2D(((1, 2), (0, 1))), [_floats(3, 3, 2)]),
    "Cropping2D": (lambda m: m.Cropping2D(((1, 0), (2, 1))), [_floats(5, 6, 2)]),
    "Permute": (lambda m: m.Permute((2, 1)), [_floats(3, 4)]),
    "RepeatVector": (lambda m: m.RepeatVector(3), [_floats(4)]),
    "LeakyReLU": (lambda m: m.LeakyReLU(), [_floats(6)]),
    "PReLU": (lambda m: m.PReLU(shared_axes=[1]), [_floats(3, 4)]),
    "ELU": (lambda m: m.ELU(0.5), [_floats(6)]),
    "ReLU": (lambda m: m.ReLU(max_value=1.0, negative_slope=0.1, threshold=0.2),
             [_floats(6)]),
    "Softmax": (lambda m: m.Softmax(), [_floats(6)]),
    "Multiply": (lambda m: m.Multiply(), [_floats(4), _floats(4)]),
    "Subtract": (lambda m: m.Subtract(), [_floats(4), _floats(4)]),
    "Average": (lambda m: m.Average(), [_floats(4), _floats(4), _floats(4)]),
    "Maximum": (lambda m: m.Maximum(), [_floats(4), _floats(4)]),
    "Minimum": (lambda m: m.Minimum(), [_floats(4), _floats(4)]),
    "Dot 2D": (lambda m: m.Dot(axes=1), [_floats(4), _floats(4)]),
    "Dot 3D normalized": (lambda m: m.Dot(axes=(2, 2), normalize=True),
                          [_floats(3, 4), _floats(5, 4)]),
    "SimpleRNN": (lambda m: m.SimpleRNN(4), [_floats(6, 3)]),
    "SimpleRNN backwards sequences": (
        lambda m: m.SimpleRNN(4, return_sequences=True, go_backwards=True), [_floats(6, 3)]),
    "LSTM": (lambda m: m.LSTM(5), [_floats(6, 3)]),
    "LSTM sequences and state": (
        lambda m: m.LSTM(5, return_sequences=True, return_state=True), [_floats(6, 3)]),
    "GRU": (lambda m: m.GRU(5, return_sequences=True), [_floats(6, 3)]),
    "GRU reset_before": (lambda m: m.GRU(5, reset_after=False, go_backwards=True),
                         [_floats(6, 3)]),
    "LSTM with dropouts (inference)": (
        lambda m: m.LSTM(5, dropout=0.3, recurrent_dropout=0.4), [_floats(6, 3)]),
    "GRU with dropouts (inference)": (
        lambda m: m.GRU(5, dropout=0.3, recurrent_dropout=0.4), [_floats(6, 3)]),
    "Bidirectional LSTM concat": (
        lambda m: m.Bidirectional(m.LSTM(4, return_sequences=True)), [_floats(6, 3)]),
    "Bidirectional GRU sum": (lambda m: m.Bidirectional(m.GRU(4), merge_mode="sum"),
                              [_floats(6, 3)]),
    "TimeDistributed": (lambda m: m.TimeDistributed(m.Dense(3, activation="tanh")),
                        [_floats(5, 4)]),
    "BatchNormalization": (lambda m: m.BatchNormalization(), [_floats(6)]),
    "LayerNormalization": (lambda m: m.LayerNormalization(), [_floats(6)]),
    "Embedding": (lambda m: m.Embedding(10, 4), [_ids(5)]),
    "CategoryEncoding multi_hot": (lambda m: m.CategoryEncoding(10), [_ids(4)]),
    "CategoryEncoding count": (lambda m: m.CategoryEncoding(10, output_mode="count"),
                               [_ids(4)]),
    "CategoryEncoding one_hot": (lambda m: m.CategoryEncoding(10, output_mode="one_hot"),
                                 [_ids(1)]),
    "GaussianNoise (inference)": (lambda m: m.GaussianNoise(0.5), [_floats(6)]),
    "SpatialDropout1D (inference)": (lambda m: m.SpatialDropout1D(0.5), [_floats(4, 3)]),
    "Lambda": (lambda m: m.Lambda(lambda x: x * 2 + 1), [_floats(4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_layer_matches_keras(name):
    make, inputs = CASES[name]
    _compare(make(L), make(P), *inputs)


def test_normalization_adapts_as_keras():
    data = _floats(3) * 4 + 2
    k, p = L.Normalization(), P.Normalization()
    k.adapt(data)
    p.adapt(data)
    # Keras reads adapted statistics from a copy its adapt made, not from the variables
    # set_weights writes: its own weights, unchanged, are what both use.
    _compare(k, p, _floats(3), randomize=False)


def _same_models(model, x):
    """`model(m)` -> (inputs, outputs) built from Keras's layers and from podkit's: Keras's
    weights in podkit's model give Keras's outputs."""
    k_model = keras.Model(*model(L))
    _randomize(k_model)
    p_model = pk.Model(*model(P))
    p_model.set_weights(k_model.get_weights())
    np.testing.assert_allclose(p_model.predict(x, batch_size=N, verbose=0),
                               k_model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)
    for w, g in zip(k_model.get_weights(), p_model.get_weights(), strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_matches_keras(causal):
    """Cross attention (query and value of different widths), Keras's weight layout:
    (dim, heads, key_dim) projections, (heads, value_dim, dim) output. (value_dim unlike
    key_dim fails inside Keras 3.15's own JAX attention, so they are equal here.)"""
    q, v = _floats(5, 8), _floats(5, 6)

    def model(m):
        lib = keras if m is L else pk
        query, value = lib.Input((5, 8)), lib.Input((5, 6))
        out = m.MultiHeadAttention(num_heads=2, key_dim=3)(
            query, value, use_causal_mask=causal)
        return [query, value], out

    _same_models(model, [q, v])


def test_multi_head_attention_with_a_padding_mask_matches_keras():
    x = _floats(6, 8)
    mask = np.ones((N, 6, 6), bool)
    mask[:, :, 4:] = False  # the last two keys are padding

    def model(m):
        lib = keras if m is L else pk
        tokens, m_in = lib.Input((6, 8)), lib.Input((6, 6), dtype="bool")
        return [tokens, m_in], m.MultiHeadAttention(2, 4)(tokens, tokens,
                                                          attention_mask=m_in)

    _same_models(model, [x, mask])


def test_masked_sequences_match_keras():
    ids = _ids(7, zero_tail=True)

    def model(m):
        inputs = (keras if m is L else pk).Input((7,), dtype="int32")
        h = m.Embedding(10, 4, mask_zero=True)(inputs)
        h = m.LSTM(5, return_sequences=True)(h)
        h = m.Bidirectional(m.GRU(3))(h)
        return inputs, m.Dense(2)(h)

    _same_models(model, ids)


def _tagger(m):
    """A sequence tagger whose output keeps Embedding(mask_zero=True)'s mask."""
    inputs = (keras if m is L else pk).Input((7,), dtype="int32")
    h = m.Embedding(10, 4, mask_zero=True)(inputs)
    h = m.LSTM(5, return_sequences=True)(h)
    return inputs, m.Dense(3, activation="softmax")(h)


def test_a_masked_sequence_output_weights_loss_metrics_and_gradients_as_keras():
    """Keras weights the loss and the metrics of an output that carries a timestep mask by
    that mask (sum(loss * mask * sw) / real steps; accuracy over real steps): the same
    evaluate() at two batch sizes, and one SGD step moves the weights the same."""
    ids = _ids(7, zero_tail=True)
    y = RNG.integers(0, 3, size=(N, 7)).astype(np.int32)
    k_model = keras.Model(*_tagger(L))
    _randomize(k_model)
    p_model = pk.Model(*_tagger(P))
    p_model.set_weights(k_model.get_weights())
    for m in (k_model, p_model):
        m.compile(optimizer=(keras if m is k_model else pk).optimizers.SGD(0.5),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    for batch in (N, 3):
        np.testing.assert_allclose(p_model.evaluate(ids, y, batch_size=batch, verbose=0),
                                   k_model.evaluate(ids, y, batch_size=batch, verbose=0),
                                   rtol=1e-5)
    sw = RNG.uniform(0.5, 2.0, size=N).astype(np.float32)
    k_model.fit(ids, y, sample_weight=np.repeat(sw[:, None], 7, axis=1), batch_size=N,
                epochs=1, shuffle=False, verbose=0)  # Keras 3.15 wants per-step weights here
    p_model.fit(ids, y, sample_weight=sw, batch_size=N, epochs=1, shuffle=False, verbose=0)
    for w, g in zip(k_model.get_weights(), p_model.get_weights(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def _encoder_decoder(m):
    """Keras's seq2seq shape: the encoder's states start the decoder (initial_state); a
    Dense made from a state starts a GRU. Its layers in Keras's order are not the order
    they were called in."""
    lib = keras if m is L else pk
    enc_in, dec_in = lib.Input((6,), dtype="int32"), lib.Input((5,), dtype="int32")
    _, h, c = m.LSTM(8, return_state=True)(m.Embedding(10, 4)(enc_in))
    seq = m.LSTM(8, return_sequences=True)(m.Embedding(10, 4)(dec_in), initial_state=[h, c])
    gru = m.GRU(3)
    start = m.Dense(3)(h)
    return [enc_in, dec_in], [m.Dense(10)(seq), gru(seq, initial_state=start)]


def test_an_encoder_decoder_with_initial_states_matches_keras():
    ids = [_ids(6), _ids(5)]
    k_model = keras.Model(*_encoder_decoder(L))
    _randomize(k_model)
    p_model = pk.Model(*_encoder_decoder(P))
    assert [type(layer).__name__ for layer in p_model.layers] == \
        [type(layer).__name__ for layer in k_model.layers if type(layer).__name__ !=
         "InputLayer"]
    p_model.set_weights(k_model.get_weights())
    for k, p in zip(k_model.predict(ids, verbose=0), p_model.predict(ids, verbose=0),
                    strict=True):
        np.testing.assert_allclose(p, k, rtol=1e-5, atol=1e-5)


def test_initial_state_is_given_in_every_call_or_none_and_shaped_as_the_state():
    tokens = pk.Input((5, 3))
    lstm = P.LSTM(4)
    with pytest.raises(ConfigError, match=r"list of 2 tensors.*\[h, c\]"):
        lstm(tokens, initial_state=[pk.Input((4,))])
    lstm(tokens, initial_state=[pk.Input((4,)), pk.Input((4,))])
    with pytest.raises(ConfigError, match="with initial_state before"):
        lstm(tokens)
    with pytest.raises(ConfigError, match=r"shape \(None, 7\); each must be \(batch, 4\)"):
        P.GRU(4)(tokens, initial_state=pk.Input((7,)))


def test_masking_layer_and_masked_average_match_keras():
    x = _floats(6, 3)
    x[:, 4:] = 0.0  # the last two steps are padding

    def model(m):
        inputs = (keras if m is L else pk).Input((6, 3))
        h = m.Masking(0.0)(inputs)
        h = m.SimpleRNN(4, return_sequences=True)(h)
        return inputs, m.GlobalAveragePooling1D()(h)

    _same_models(model, x)


def test_every_activation_name_computes_what_keras_computes():
    """activation="gelu" is Keras's exact gelu (jax.nn.gelu's default is the tanh form) and
    "leaky_relu" Keras's slope 0.2 (jax.nn.leaky_relu's is 0.01): a .keras file read either
    way predicts the same."""
    from podkit.layers.base import ACTIVATIONS

    x = np.linspace(-6, 6, 241, dtype=np.float32).reshape(1, -1)
    for name, fn in ACTIVATIONS.items():
        if fn is None:
            continue
        ours = np.asarray(fn(x))
        theirs = np.asarray(keras.activations.get(name)(x))
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6, err_msg=name)


def _per_step_tagger(m):
    lib = keras if m is L else pk
    ids = lib.Input((7,), dtype="int32")
    return ids, m.Dense(5)(m.Embedding(10, 4)(ids))


@pytest.mark.parametrize("per_step", [True, False])
def test_ignore_class_leaves_labels_out_of_the_loss_as_keras(per_step):
    """SparseCategoricalCrossentropy(ignore_class=-100), Keras's: the loss is the mean over
    the labels that are not -100, called directly (with per-label sample weights), in
    evaluate(), and in one SGD step, on per-step labels (batch, time) and on one label per
    example."""
    if per_step:
        x = _ids(7)
        y = RNG.integers(0, 5, size=(N, 7)).astype(np.int32)
        y[:, :3] = -100  # a prompt's positions
        y[0] = -100  # an example with no label left: it weighs nothing
        k_model, p_model = keras.Model(*_per_step_tagger(L)), pk.Model(*_per_step_tagger(P))
    else:
        x = _floats(6)
        y = RNG.integers(0, 5, size=N).astype(np.int32)
        y[::3] = -100
        k_model = keras.Sequential([keras.Input((6,)), L.Dense(5)])
        p_model = pk.Sequential([pk.Input((6,)), P.Dense(5)])
    _randomize(k_model)
    p_model.set_weights(k_model.get_weights())
    losses = {}
    for m, lib in ((k_model, keras), (p_model, pk)):
        losses[lib] = lib.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                               ignore_class=-100)
        m.compile(optimizer=lib.optimizers.SGD(0.5), loss=losses[lib])
    out = k_model.predict(x, verbose=0)
    sw = RNG.uniform(0.5, 2.0, size=y.shape).astype(np.float32)
    np.testing.assert_allclose(float(losses[pk](y, out, sample_weight=sw)),
                               float(losses[keras](y, out, sample_weight=sw)), rtol=1e-6)
    np.testing.assert_allclose(p_model.evaluate(x, y, batch_size=N, verbose=0),
                               k_model.evaluate(x, y, batch_size=N, verbose=0), rtol=1e-5)
    for m in (k_model, p_model):
        m.fit(x, y, batch_size=N, epochs=1, shuffle=False, verbose=0)
    for w, g in zip(k_model.get_weights(), p_model.get_weights(), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    with pytest.raises(pk.errors.InputError, match=r"label -7 .* \(or -100, the loss's "):
        p_model.fit(x, np.where(y == -100, -7, y), batch_size=N, verbose=0)


@pytest.mark.parametrize("bad", [True, 1.5, "-100"])
def test_a_bad_ignore_class_is_refused(bad):
    with pytest.raises(ConfigError, match=r"ignore_class=.* must be None or the int label"):
        pk.losses.SparseCategoricalCrossentropy(ignore_class=bad)


@pytest.mark.parametrize("feed", ["arrays", "dataset"])
def test_per_timestep_sample_weights_weigh_each_step_as_keras(feed):
    """sample_weight of shape (batch, time) for per-step labels, as Keras takes them: the
    loss is sum(loss * w) / (batch * time) (with a timestep mask from mask_zero, sum over
    the real steps / real steps), weighted metrics weigh each step; evaluate and one SGD step
    equal Keras 3's, from arrays and from a Dataset of (x, y, w) batches."""
    ids = _ids(7, zero_tail=True)
    y = RNG.integers(0, 3, size=(N, 7)).astype(np.int32)
    w = RNG.uniform(0.0, 2.0, size=(N, 7)).astype(np.float32)
    for masked in (False, True):
        def tagger(m, masked=masked):
            lib = keras if m is L else pk
            inp = lib.Input((7,), dtype="int32")
            return inp, m.Dense(3)(m.Embedding(10, 4, mask_zero=masked)(inp))

        k_model, p_model = keras.Model(*tagger(L)), pk.Model(*tagger(P))
        _randomize(k_model)
        p_model.set_weights(k_model.get_weights())
        for m, lib in ((k_model, keras), (p_model, pk)):
            m.compile(optimizer=lib.optimizers.SGD(0.5), weighted_metrics=["accuracy"],
                      loss=lib.losses.SparseCategoricalCrossentropy(from_logits=True))
        data = ((ids, y, w) if feed == "arrays" else
                (pk.data.Dataset.from_tensor_slices((ids, y, w)).batch(N),))
        kw = {"sample_weight": w} if feed == "arrays" else {}
        got = p_model.evaluate(*data[:2] if feed == "arrays" else data, batch_size=None
                               if feed != "arrays" else N, verbose=0, **kw)
        np.testing.assert_allclose(got, k_model.evaluate(ids, y, sample_weight=w,
                                                         batch_size=N, verbose=0), rtol=1e-5)
        k_model.fit(ids, y, sample_weight=w, batch_size=N, epochs=1, shuffle=False, verbose=0)
        p_model.fit(*data[:2] if feed == "arrays" else data, batch_size=None
                    if feed != "arrays" else N, epochs=1, shuffle=False, verbose=0, **kw)
        for a, b in zip(k_model.get_weights(), p_model.get_weights(), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_sample_weights_of_another_shape_are_named():
    model = pk.Sequential([pk.Input((4,)), P.Dense(2)])
    model.compile(loss="mse")
    x, y = _floats(4), _floats(2)
    with pytest.raises(pk.errors.InputError, match=r"sample_weight has shape \(8, 2, 3\); "
                                                    r"it needs one weight per example"):
        model.fit(x, y, sample_weight=np.ones((N, 2, 3)), verbose=0)
