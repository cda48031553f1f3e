"""Keras habits a new user brought (issue 22): function metrics, numpy in a loss, a Dataset
without .batch(), AUC on a two-class softmax, a schedule beside ReduceLROnPlateau."""

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError, InputError


def _binary(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return x, (x[:, 0] + 0.5 * rng.normal(size=n) > 0).astype(np.int32)


def _two_class_model(**compile_args):
    model = pk.Sequential([pk.layers.Dense(16, activation="relu"), pk.layers.Dense(2)])
    model.compile(optimizer="adam", loss=pk.losses.SparseCategoricalCrossentropy(
        from_logits=True), **compile_args)
    return model


def test_a_plain_function_metric_is_wrapped_and_named_after_it():
    x, y = _binary()

    def mean_margin(y_true, y_pred):
        return y_pred[:, 1] - y_pred[:, 0]

    model = _two_class_model(metrics=[mean_margin])
    history = model.fit(x, y, batch_size=64, verbose=0)
    logits = model.predict(x, verbose=0)
    # The mean of the per-example values, as Keras's wrapper; a function sees what the model
    # outputs, as in Keras: here logits (the loss takes logits), not probabilities.
    assert "mean_margin" in history.history
    assert model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)["mean_margin"] == \
        pytest.approx(float(np.mean(logits[:, 1] - logits[:, 0])), rel=1e-4, abs=1e-5)


def test_a_function_metric_sees_probabilities_when_the_model_ends_in_a_softmax():
    x, y = _binary()

    def mean_top(y_true, y_pred):
        return y_pred.max(axis=-1)

    model = pk.Sequential([pk.layers.Dense(16, activation="relu"),
                           pk.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=[mean_top])  # the softmax is fused into the loss
    model.fit(x, y, batch_size=64, verbose=0)
    p = model.predict(x, verbose=0)
    assert model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)["mean_top"] == \
        pytest.approx(float(p.max(-1).mean()), rel=1e-4)


def test_a_lambda_metric_needs_a_name():
    with pytest.raises(ConfigError, match="no name to log it under"):
        _two_class_model(metrics=[lambda t, p: p])


def test_numpy_inside_a_loss_is_a_podkit_error_naming_jax_numpy():
    x, y = _binary()

    def loss(y_true, y_pred):
        return np.mean(np.asarray(y_pred))

    model = pk.Sequential([pk.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=loss)
    with pytest.raises(ConfigError, match="Use jax.numpy"):
        model.fit(x, np.eye(2, dtype=np.float32)[y], verbose=0)


def test_a_dataset_without_batch_names_the_missing_batch():
    x, y = _binary()
    model = _two_class_model()
    with pytest.raises(InputError, match=r"\.batch\(batch_size\)"):
        model.fit(pk.data.Dataset.from_tensor_slices((x, y)), verbose=0)


def _exact_auc(labels, scores):
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return greater / (len(pos) * len(neg))


def test_auc_scores_the_positive_class_of_a_two_class_softmax():
    # The README's habit: a two-class softmax (logits and a from_logits loss), AUC with or
    # without from_logits=True (podkit's metrics see probabilities; from_logits=True reads the
    # logits and applies the activation itself, as Keras's).
    x, y = _binary(512)
    model = _two_class_model(metrics=[pk.metrics.AUC(num_thresholds=1000, name="auc"),
                                      pk.metrics.AUC(from_logits=True, num_thresholds=1000,
                                                     name="auc_logits")])
    model.fit(x, y, batch_size=64, epochs=6, verbose=0)
    logits = model.predict(x, verbose=0)
    positive = 1 / (1 + np.exp(-(logits[:, 1] - logits[:, 0])))  # softmax's second column
    got = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    for key in ("auc", "auc_logits"):
        assert got[key] == pytest.approx(_exact_auc(y, positive), abs=5e-3), key
    assert got["auc"] > 0.7


def test_auc_with_class_ids_beyond_two_classes_is_an_input_error():
    x, y = _binary()
    model = pk.Sequential([pk.layers.Dense(3)])
    model.compile(optimizer="sgd", metrics=[pk.metrics.AUC()],
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(InputError, match="auc"):
        model.fit(x, y, verbose=0)


@pytest.mark.parametrize("callback", [pk.callbacks.ReduceLROnPlateau(monitor="loss"),
                                      pk.callbacks.LearningRateScheduler(lambda e, lr: lr)])
def test_a_schedule_and_a_callback_that_sets_the_rate_fail_before_the_first_step(callback):
    x, y = _binary()
    schedule = pk.optimizers.schedules.ExponentialDecay(1e-3, decay_steps=10, decay_rate=0.9)
    model = pk.Sequential([pk.layers.Dense(2)])
    model.compile(optimizer=pk.optimizers.Adam(schedule),
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ConfigError, match="follows the schedule"):
        model.fit(x, y, epochs=2, verbose=0, callbacks=[callback])
    assert model.steps_trained == 0
