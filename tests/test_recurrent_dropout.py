"""Keras's dropout inside recurrent layers: while training one mask per sequence, the same at
every step, on the inputs (`dropout`) and on the previous output where it meets the recurrent
kernel (`recurrent_dropout`); nothing in inference (Keras-equivalence covers that case)."""

import flax.nnx as nnx
import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError

P = pk.layers


def _build(layer, shape):
    """The layer's module as a model builds it (without a mesh), in training mode."""
    with nnx.use_eager_sharding(False):
        return layer.build(shape, nnx.Rngs(params=0, dropout=1))


def _simple_rnn(**kwargs):
    """A linear SimpleRNN with identity kernels: h_t = x_t * m + (h_{t-1} * r) @ I."""
    layer = P.SimpleRNN(3, activation=None, use_bias=False, return_sequences=True, **kwargs)
    module = _build(layer, (6, 3))
    module.kernel[...] = np.eye(3, dtype=np.float32)
    module.recurrent_kernel[...] = np.zeros((3, 3), np.float32)
    return module


def test_input_dropout_draws_one_mask_per_sequence_shared_by_every_step():
    module = _simple_rnn(dropout=0.5)
    out = np.asarray(module(np.ones((64, 6, 3), np.float32)))
    np.testing.assert_array_equal(out, np.broadcast_to(out[:, :1], out.shape))  # every step
    assert set(np.unique(out)) == {0.0, 2.0}  # dropped, or kept and scaled by 1 / (1 - rate)
    again = np.asarray(module(np.ones((64, 6, 3), np.float32)))
    assert not np.array_equal(out, again)  # a new mask per call


def test_recurrent_dropout_masks_the_previous_output_the_same_way_at_every_step():
    layer = P.SimpleRNN(3, activation=None, use_bias=False, return_sequences=True,
                        recurrent_dropout=0.5)
    module = _build(layer, (6, 3))
    module.kernel[...] = np.eye(3, dtype=np.float32)
    module.recurrent_kernel[...] = np.eye(3, dtype=np.float32)
    out = np.asarray(module(np.ones((64, 6, 3), np.float32)))
    # h_t = 1 + r * h_{t-1} with r in {0, 2}, fixed per (example, unit): 1, 1, 1, ... or
    # 1, 3, 7, 15, ... (never a mix of the two within one sequence).
    dropped = np.ones(6, np.float32)
    kept = np.array([1, 3, 7, 15, 31, 63], np.float32)
    rows = out.transpose(0, 2, 1).reshape(-1, 6)
    assert all(np.array_equal(r, dropped) or np.array_equal(r, kept) for r in rows)
    assert any(np.array_equal(r, dropped) for r in rows)
    assert any(np.array_equal(r, kept) for r in rows)


def test_inference_uses_no_mask():
    module = _simple_rnn(dropout=0.5)
    module.deterministic = True
    np.testing.assert_array_equal(np.asarray(module(np.ones((4, 6, 3), np.float32))), 1.0)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_gated_layers_with_both_dropouts_train_and_differ_from_inference(kind):
    layer = getattr(P, kind)(4, dropout=0.3, recurrent_dropout=0.3, return_sequences=True)
    module = _build(layer, (5, 2))
    x = np.random.default_rng(0).normal(size=(8, 5, 2)).astype(np.float32)
    training = np.asarray(module(x))
    module.deterministic = True
    inference = np.asarray(module(x))
    assert training.shape == inference.shape == (8, 5, 4)
    assert np.isfinite(training).all() and not np.allclose(training, inference)


def test_an_lstm_with_dropouts_learns():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8, 2)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int32)  # the sign of a running sum
    model = pk.Sequential([pk.Input((8, 2)), P.LSTM(16, dropout=0.1, recurrent_dropout=0.1),
                           P.Dense(2)])
    model.compile(optimizer=pk.optimizers.Adam(0.02),
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=32, epochs=12, verbose=0)
    assert history.history["accuracy"][-1] > 0.85


def test_fit_trains_with_the_masks_and_evaluate_runs_without_them():
    """With a learning rate of 0 the weights never move: fit's loss (masks drawn) differs
    from evaluate's on the same data (no masks), and evaluate repeats itself exactly."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 6, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=64).astype(np.int32)
    model = pk.Sequential([pk.Input((6, 3)), P.GRU(8, dropout=0.5, recurrent_dropout=0.5),
                           P.Dense(2)])
    model.compile(optimizer=pk.optimizers.SGD(0.0),
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    fitted = model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    first = model.evaluate(x, y, batch_size=64, verbose=0)
    assert model.evaluate(x, y, batch_size=64, verbose=0) == first
    assert abs(fitted.history["loss"][0] - first) > 1e-4


@pytest.mark.parametrize("bad", [{"dropout": 1.0}, {"recurrent_dropout": -0.1},
                                 {"dropout": "0.2"}, {"seed": 1.5}])
def test_bad_rates_and_seeds_are_named(bad):
    what = next(iter(bad))
    with pytest.raises(ConfigError, match=f"{what}="):
        P.GRU(4, **bad)
