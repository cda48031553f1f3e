"""Gradient accumulation is the whole batch's step: with compile(microbatches=k) the loss,
the gradients and the metrics of a step equal the unsplit batch's, for masked, weighted,
ignore_class-ed and packed losses and every reduction Keras has, with uneven token counts
per microbatch, on 1 and on 8 devices. And the reductions are Keras's own (Keras runs here).

A microbatch's own mean over its tokens, averaged over k microbatches, weighs each token by
its microbatch's share of them (the error transformers fixed in 2024): every case below has
microbatches of very different token counts, so such a mean is off by percents, not 1e-7."""

import dataclasses
import os

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.config import LlamaConfig
from podkit.models.llama import build_llama

REDUCTIONS = ("sum_over_batch_size", "sum", "mean", "mean_with_sample_weight")
RTOL = 1e-5
# Every reduction on one device; on 8 the default and the one that divides by weights
# (each case compiles three steps: the suite's time).
MESHES = [*((1, r) for r in REDUCTIONS), (8, "sum_over_batch_size"),
          (8, "mean_with_sample_weight")]


def strategy(devices: int) -> pk.Strategy:
    return pk.Strategy(mesh={"data": devices}, devices=jax.devices()[:devices])


def one_step(make, x, y, k, devices, sample_weight=None, metrics=()):
    """(the step's loss and metrics, the gradient): one SGD step at rate 1 is -gradient."""
    with strategy(devices).scope():
        model = make()
        model.compile(optimizer=pk.optimizers.SGD(1.0), loss=model.test_loss,
                      metrics=list(metrics), microbatches=k, steps_per_execution=1)
        build(model, x)
        before = [np.asarray(w) for w in model.get_weights()]
        logs = model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)
        after = [np.asarray(w) for w in model.get_weights()]
    return logs, [b - a for b, a in zip(before, after, strict=True)]


def build(model, x):
    if isinstance(x, dict):
        model.build({k: v.shape[1:] for k, v in x.items()}, dtype=np.int32)
    else:
        model.build(x.shape[1:], dtype=x.dtype)


def assert_same_step(whole, parts):
    (logs, grads), (plogs, pgrads) = whole, parts
    assert logs.keys() == plogs.keys()
    for key in logs:
        np.testing.assert_allclose(plogs[key], logs[key], rtol=RTOL, atol=1e-7, err_msg=key)
    scale = max(float(np.abs(g).max()) for g in grads)
    assert scale > 0
    for g, pg in zip(grads, pgrads, strict=True):
        # relative to the gradient's scale: a tiny entry of a large gradient is noise
        np.testing.assert_allclose(pg, g, rtol=RTOL, atol=RTOL * scale)


# -- the models ----------------------------------------------------------------------------
def tagger(loss):
    """Tokens -> a class per token, padding (id 0) masked by the model's Embedding."""
    def make():
        model = pk.Sequential([pk.Input((12,), dtype="int32"),
                               pk.layers.Embedding(20, 8, mask_zero=True),
                               pk.layers.Dense(16, activation="tanh"),
                               pk.layers.Dense(5)])
        model.test_loss = loss
        return model
    return make


def regressor(loss):
    """Features -> (4, 3) per example: four values per example for Keras's reductions."""
    def make():
        model = pk.Sequential([pk.Input((4, 6)), pk.layers.Dense(8, activation="tanh"),
                               pk.layers.Dense(3)])
        model.test_loss = loss
        return model
    return make


# A step cuts its batch into parts of rows j, j + k, j + 2k, ... (each device keeps its share
# of every part): token counts that follow the row's index modulo 4 give microbatches of
# very different token counts for k = 2 and 4.
SHARE = (12, 1, 7, 2)


def uneven_tokens(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, labels): rows of 1 to 12 tokens, padded with id 0."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((batch, 12), np.int32)
    for i in range(batch):
        n = max(1, SHARE[i % 4] - int(rng.integers(0, 2)))
        tokens[i, :n] = rng.integers(1, 20, n)
    return tokens, rng.integers(0, 5, (batch, 12)).astype(np.int32)


def ignored_labels(batch: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, labels with -100 on all but a few tokens of most rows): uneven learned
    tokens, as instruction data's replies are."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 20, (batch, 12)).astype(np.int32)
    labels = rng.integers(0, 5, (batch, 12)).astype(np.int32)
    for i in range(batch):
        labels[i, SHARE[i % 4]:] = -100
    return tokens, labels


# -- microbatches = the whole batch --------------------------------------------------------
@pytest.mark.parametrize(("devices", "reduction"), MESHES)
def test_a_masked_loss_over_uneven_microbatches_is_the_whole_batch(devices, reduction):
    x, y = uneven_tokens(32)
    sw = np.random.default_rng(2).uniform(0.2, 2.0, 32).astype(np.float32)
    make = tagger(pk.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                          reduction=reduction))
    for weights in (None, sw):
        whole = one_step(make, x, y, 1, devices, weights, metrics=["accuracy"])
        for k in (2, 4):
            assert_same_step(whole, one_step(make, x, y, k, devices, weights,
                                             metrics=["accuracy"]))


@pytest.mark.parametrize(("devices", "reduction"), MESHES)
def test_an_ignore_class_loss_over_uneven_microbatches_is_the_whole_batch(devices, reduction):
    x, y = ignored_labels(32)
    make = tagger(pk.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=-100, reduction=reduction))
    whole = one_step(make, x, y, 1, devices, metrics=["accuracy"])
    for k in (2, 4):
        assert_same_step(whole, one_step(make, x, y, k, devices, metrics=["accuracy"]))


@pytest.mark.parametrize(("devices", "reduction"), MESHES)
def test_a_weighted_loss_over_microbatches_is_the_whole_batch(devices, reduction):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 4, 6)).astype(np.float32)
    y = rng.normal(size=(32, 4, 3)).astype(np.float32)
    sw = np.concatenate([np.full(16, 3.0), np.full(16, 0.1)]).astype(np.float32)
    per_step = rng.uniform(0, 2, (32, 4)).astype(np.float32)
    make = regressor(pk.losses.MeanSquaredError(reduction=reduction))
    for weights in (None, sw, per_step):
        whole = one_step(make, x, y, 1, devices, weights, metrics=["mae"])
        for k in (2, 4):
            assert_same_step(whole, one_step(make, x, y, k, devices, weights, metrics=["mae"]))


@pytest.mark.parametrize("devices", [1, 8])
def test_a_packed_instruction_loss_over_microbatches_is_the_whole_batch(devices):
    """The Llama on packed examples (tokens, positions, segment ids) with the replies'
    labels only (-100 elsewhere), as instruction tuning runs: the learned tokens per row
    range from 2 to 30."""
    rng = np.random.default_rng(4)
    batch, seq = 32, 32
    tokens = rng.integers(1, 64, (batch, seq)).astype(np.int32)
    positions = np.zeros((batch, seq), np.int32)
    segments = np.zeros((batch, seq), np.int32)
    labels = np.full((batch, seq), -100, np.int32)
    for i in range(batch):
        cut = int(rng.integers(8, seq - 4))
        positions[i, :cut], positions[i, cut:] = np.arange(cut), np.arange(seq - cut)
        segments[i, :cut], segments[i, cut:] = 1, 2
        learned = (30, 2, 17, 5)[i % 4]
        labels[i, seq - learned:] = rng.integers(0, 64, learned)
    x = {"tokens": tokens, "positions": positions, "segment_ids": segments}
    config = LlamaConfig(layers=2, heads=2, embed=32, mlp=48, attention="xla")
    loss = pk.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-100)

    def make():
        model = build_llama(config, {"vocab_size": 64, "seq_len": seq})
        model.test_loss = loss
        return model

    whole = one_step(make, x, labels, 1, devices, metrics=["accuracy"])
    for k in (2, 4):
        assert_same_step(whole, one_step(make, x, labels, k, devices, metrics=["accuracy"]))


def test_a_microbatch_mean_would_differ_here():
    """The cases above can fail: on their batch and model, the mean of each microbatch's
    own token mean (the error they guard against) is off by far more than RTOL."""
    x, y = uneven_tokens(32)
    with strategy(1).scope():
        model = tagger(None)()
        logits = np.asarray(model.predict(x, verbose=0), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_token = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
    tokens = (x != 0).astype(np.float64)
    whole = (per_token * tokens).sum() / tokens.sum()
    for k in (2, 4):
        parts = np.mean([(per_token * tokens)[j::k].sum() / tokens[j::k].sum()
                         for j in range(k)])
        assert abs(parts - whole) / whole > 100 * RTOL, (k, parts, whole)


# -- the reductions are Keras's ------------------------------------------------------------
@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    assert keras.backend.backend() == "jax"
    return keras


def keras_step(keras, layers, loss, x, y, sample_weight, weights):
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss)
    model.set_weights(weights)
    value = float(model.train_on_batch(x, y, sample_weight=sample_weight))
    return value, [w - np.asarray(a) for w, a in zip(weights, model.get_weights(),
                                                      strict=True)]


def assert_as_keras(ours, theirs):
    (logs, grads), (value, kgrads) = ours, theirs
    np.testing.assert_allclose(logs["loss"], value, rtol=2e-5)
    for g, kg in zip(grads, kgrads, strict=True):
        np.testing.assert_allclose(g, kg, rtol=2e-4, atol=2e-6 * max(1.0, np.abs(kg).max()))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_each_reduction_of_a_multi_value_loss_is_keras(keras, reduction):
    """Four values per example (an output (4, 3) under MSE): "sum" and
    "mean_with_sample_weight" add values that the per-example mean averages, as Keras's."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(8, 4, 6)).astype(np.float32)
    y = rng.normal(size=(8, 4, 3)).astype(np.float32)
    sw = rng.uniform(0.2, 2.0, 8).astype(np.float32)
    per_step = rng.uniform(0.2, 2.0, (8, 4)).astype(np.float32)
    make = regressor(pk.losses.MeanSquaredError(reduction=reduction))
    # Keras refuses one weight per example here (it cannot broadcast (8,) over (8, 4)):
    # no weights, or one per value
    del sw
    for weights in (None, per_step):
        ours = one_step(make, x, y, 1, 1, weights)
        with strategy(1).scope():
            start = make()
            build(start, x)
            initial = [np.asarray(w) for w in start.get_weights()]
        theirs = keras_step(keras, [keras.Input((4, 6)), keras.layers.Dense(8, "tanh"),
                                    keras.layers.Dense(3)],
                            keras.losses.MeanSquaredError(reduction=reduction), x, y,
                            weights, initial)
        assert_as_keras(ours, theirs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_each_reduction_of_a_masked_loss_is_keras(keras, reduction):
    """An Embedding(mask_zero=True)'s mask reaches the loss: Keras's apply_mask."""
    x, y = uneven_tokens(8)
    # one weight per token: Keras cannot broadcast one per example over (8, 12) values
    sw = np.random.default_rng(6).uniform(0.2, 2.0, (8, 12)).astype(np.float32)
    make = tagger(pk.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                          reduction=reduction))
    for weights in (None, sw):
        ours = one_step(make, x, y, 1, 1, weights)
        with strategy(1).scope():
            start = make()
            build(start, x)
            initial = [np.asarray(w) for w in start.get_weights()]
        theirs = keras_step(
            keras, [keras.Input((12,), dtype="int32"),
                    keras.layers.Embedding(20, 8, mask_zero=True),
                    keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(5)],
            keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction),
            x, y, weights, initial)
        assert_as_keras(ours, theirs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_a_loss_called_directly_reduces_as_keras(keras, reduction):
    rng = np.random.default_rng(7)
    y, p = rng.normal(size=(6, 4, 3)), rng.normal(size=(6, 4, 3))
    sw = rng.uniform(0.2, 2.0, 6)
    for weights in (None, sw[:, None] * np.ones(4)):
        ours = pk.losses.MeanSquaredError(reduction=reduction)(y, p, sample_weight=weights)
        theirs = keras.losses.MeanSquaredError(reduction=reduction)(y, p, sample_weight=weights)
        np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-5)
    one = pk.losses.MeanSquaredError(reduction=reduction)(y[:, 0], p[:, 0], sample_weight=sw)
    other = keras.losses.MeanSquaredError(reduction=reduction)(y[:, 0], p[:, 0],
                                                               sample_weight=sw)
    np.testing.assert_allclose(float(one), float(other), rtol=1e-5)
    labels = rng.integers(0, 3, (6, 4))
    labels[0, :3] = labels[4, :] = -1
    per = sw[:, None] * rng.uniform(0.5, 1.5, (6, 4))
    ours = pk.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1,
                                                   reduction=reduction)(labels, p, per)
    theirs = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1,
                                                        reduction=reduction)(labels, p, per)
    np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-5)


def test_no_reduction_is_refused_by_compile_naming_the_fix():
    model = regressor(None)()
    for reduction in (None, "none"):
        with pytest.raises(pk.ConfigError, match="reduction=.*sum_over_batch_size"):
            model.compile(loss=pk.losses.MeanSquaredError(reduction=reduction))
    with pytest.raises(pk.ConfigError, match="reduction='average'.*valid reductions"):
        pk.losses.MeanSquaredError(reduction="average")
    values = pk.losses.MeanSquaredError(reduction="none")(np.zeros((3, 2)), np.ones((3, 2)))
    assert values.shape == (3,)


def test_reduction_survives_a_config_round_trip():
    loss = pk.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    again = pk.losses.deserialize(pk.losses.serialize(loss))
    assert again.reduction == "sum" and dataclasses.is_dataclass(loss) is False
