"""A TensorFlow user's habits, one by one: logits, Keras loss/optimizer/callback objects,
evaluate's return values, class weights, the functional API, save and load, and the raw
errors that become podkit errors before XLA."""

import csv
import json
import struct
import warnings
from pathlib import Path

import flax.nnx as nnx
import jax
import numpy as np
import pytest

import podkit as pk

L = pk.layers


def one_device():
    return pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1])


def mlp(out_units=10, out_activation="softmax", **compile_kwargs):
    model = pk.Sequential([L.Dense(64, activation="relu"),
                           L.Dense(out_units, activation=out_activation)])
    kwargs = dict(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    kwargs.update(compile_kwargs)
    model.compile(**kwargs)
    return model


# -- logits ---------------------------------------------------------------------------------------
def test_logits_with_from_logits_learn(digits):
    (x, y), (vx, vy) = digits
    with pk.DataParallel().scope():
        model = mlp(out_activation=None,
                    loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=64, epochs=15, verbose=0)
    assert model.evaluate(vx, vy, verbose=0, return_dict=True)["accuracy"] >= 0.95


def test_logits_into_a_probability_loss_are_caught_on_the_first_batch(digits):
    (x, y), _ = digits
    model = mlp(out_activation=None)  # the TensorFlow tutorials' Dense(10): logits
    with pytest.raises(pk.InputError, match=r"not probabilities.*SparseCategoricalCrossentropy"
                       r"\(from_logits=True\).*activation='softmax'"):
        model.fit(x, y, epochs=1, verbose=0)
    assert int(model.state.step) == 0  # caught before a step was taken

    class Logits(nnx.Module):
        def __init__(self, rngs):
            self.out = nnx.Linear(64, 10, rngs=rngs)

        def __call__(self, x):
            return self.out(x)

    wrapped = pk.Model(lambda rngs: Logits(rngs))
    wrapped.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(pk.InputError, match="not probabilities"):
        wrapped.fit(x, y, epochs=1, verbose=0)
    # a softmax that the loss is told to treat as logits is the opposite mistake
    with pytest.raises(pk.ConfigError, match=r"ends in a softmax.*takes logits"):
        mlp(loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(pk.ConfigError, match=r"from_logits belongs to the loss"):
        mlp(from_logits=True)


# -- errors before XLA ----------------------------------------------------------------------------
def test_label_mistakes_are_podkit_errors_naming_the_fix(digits):
    (x, y), _ = digits
    x, y = x[:256], y[:256]
    onehot = np.eye(10, dtype=np.float32)[y]
    with pytest.raises(pk.InputError, match=r"one-hot rows.*categorical_crossentropy.*argmax"):
        mlp().fit(x, onehot, verbose=0)
    with pytest.raises(pk.InputError, match=r"class ids.*sparse_categorical_crossentropy"):
        mlp(loss="categorical_crossentropy").fit(x, y, verbose=0)
    with pytest.raises(pk.InputError, match=r"one prediction per position.*Flatten"):
        mlp().fit(x.reshape(256, 8, 8), y, verbose=0)
    with pytest.raises(pk.InputError, match=r"strings.*ids"):
        mlp().fit(x, np.array([str(v) for v in y]), verbose=0)
    with pytest.raises(pk.InputError, match=r"2 outputs per example.*Dense\(1, "
                       r"activation='sigmoid'\)"):
        mlp(out_units=2, out_activation="sigmoid", loss="binary_crossentropy",
            metrics=[]).fit(x, (y > 4).astype(np.float32), verbose=0)
    with pytest.raises(pk.InputError, match=r"mae.*for a classifier, use 'accuracy'"):
        mlp(metrics=["mae"]).fit(x, y, verbose=0)


def test_the_tensorflow_quickstart_runs(digits):
    """tensorflow.org's beginner quickstart, with pk. for tf.keras."""
    (x, y), (vx, vy) = digits
    model = pk.Sequential([L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.2),
                           L.Dense(10)])
    loss_fn = pk.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="adam", loss=loss_fn, metrics=["accuracy"])
    predictions = model(x[:1])  # before training: logits of one example
    assert predictions.shape == (1, 10)
    assert float(loss_fn(y[:1], predictions)) > 0
    model.fit(x, y, epochs=5, verbose=0)
    loss, acc = model.evaluate(vx, vy, verbose=2)
    assert acc > 0.9
    probability_model = pk.Sequential([L.Activation("softmax")])
    probability_model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    probs = probability_model(model(vx[:5]))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_python_lists_are_accepted_as_keras_does(digits):
    (x, y), _ = digits
    model = mlp()
    history = model.fit(x[:128].tolist(), y[:128].tolist(), batch_size=32, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.predict(x[:3].tolist(), verbose=0).shape == (3, 10)


def test_bad_validation_data_is_refused_before_the_first_step(digits):
    (x, y), (vx, vy) = digits
    model = mlp()
    with pytest.raises(pk.InputError, match=r"features of shape \(batch, 63\)"):
        model.fit(x, y, epochs=2, verbose=0, validation_data=(vx[:, :63], vy))
    assert int(model.state.step) == 0
    with pytest.raises(pk.InputError, match=r"label 1\d is out of range for 10 classes"):
        model.fit(x, y, epochs=2, verbose=0, validation_data=(vx, vy + 10))
    assert int(model.state.step) == 0


# -- evaluate, class weights ----------------------------------------------------------------------
def test_evaluate_returns_what_keras_returns(digits):
    (x, y), (vx, vy) = digits
    plain = mlp(metrics=None)
    plain.fit(x, y, epochs=1, verbose=0)
    loss = plain.evaluate(vx, vy, verbose=0)
    assert isinstance(loss, float)
    with_metrics = mlp(metrics=["acc", pk.metrics.SparseTopKCategoricalAccuracy(k=3)])
    with_metrics.fit(x, y, epochs=1, verbose=0)
    values = with_metrics.evaluate(vx, vy, verbose=0)
    assert isinstance(values, list) and len(values) == 3
    loss, acc, top3 = values  # the Keras idiom: unpack
    d = with_metrics.evaluate(vx, vy, verbose=0, return_dict=True)
    assert list(d) == ["loss", "acc", "sparse_top_k_categorical_accuracy"]  # "acc" stays "acc"
    assert d["acc"] == pytest.approx(acc) and top3 >= acc


def test_class_weights_scale_each_class_in_the_gradient(digits):
    (x, y), _ = digits
    x, y = x[:128], y[:128]
    weights = {c: (3.0 if c < 5 else 0.5) for c in range(10)}

    def one_step(**fit_kwargs):
        with one_device().scope():
            model = mlp(optimizer=pk.optimizers.SGD(learning_rate=0.1), metrics=None)
        model.fit(x, y, batch_size=128, epochs=1, shuffle=False, verbose=0, **fit_kwargs)
        return model.get_weights()

    by_class = one_step(class_weight=weights)
    by_sample = one_step(sample_weight=np.array([weights[c] for c in y], np.float32))
    plain = one_step()
    for a, b in zip(by_class, by_sample, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert any(not np.allclose(a, b) for a, b in zip(by_class, plain, strict=True))
    with pytest.raises(pk.ConfigError, match="class_weight"):
        mlp().fit(x, y, class_weight=[1, 2], verbose=0)


# -- losses, metrics, optimizers ------------------------------------------------------------------
def test_loss_objects_match_their_definitions():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 5)).astype(np.float32)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = rng.integers(0, 5, 8)
    ref = -np.log(p[np.arange(8), y]).mean()
    sparse = pk.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert float(sparse(y, logits)) == pytest.approx(ref, rel=1e-5)
    assert float(pk.losses.SparseCategoricalCrossentropy()(y, p)) == pytest.approx(ref, rel=1e-5)
    assert float(pk.losses.CategoricalCrossentropy()(np.eye(5)[y], p)) == pytest.approx(
        ref, rel=1e-5)
    w = rng.random(8).astype(np.float32)
    assert float(sparse(y, logits, sample_weight=w)) == pytest.approx(
        (-np.log(p[np.arange(8), y]) * w).sum() / 8, rel=1e-5)  # sum_over_batch_size
    t = rng.random((8, 1)).astype(np.float32)
    assert float(pk.losses.MeanSquaredError()(t, t + 2)) == pytest.approx(4.0)


def test_metrics_match_reference_computations():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 400).astype(np.float32)
    score = np.clip(y * 0.3 + rng.random(400) * 0.7, 0, 1).astype(np.float32)
    x = score[:, None]
    model = pk.Model(lambda rngs: _Identity())
    model.compile(optimizer="sgd", loss="binary_crossentropy",
                  metrics=[pk.metrics.AUC(), pk.metrics.Precision(), pk.metrics.Recall(),
                           pk.metrics.MeanAbsoluteError(), "acc"])
    r = model.evaluate(x, y, batch_size=40, verbose=0, return_dict=True)
    pos, neg = score[y == 1], score[y == 0]
    auc = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert r["auc"] == pytest.approx(auc, abs=0.01)  # 200 thresholds: Keras's estimate
    hit = score > 0.5
    assert r["precision"] == pytest.approx((hit & (y == 1)).sum() / hit.sum(), rel=1e-5)
    assert r["recall"] == pytest.approx((hit & (y == 1)).sum() / (y == 1).sum(), rel=1e-5)
    assert r["mean_absolute_error"] == pytest.approx(np.abs(score - y).mean(), rel=1e-5)
    assert r["acc"] == pytest.approx((hit == (y == 1)).mean(), rel=1e-5)


class _Identity(nnx.Module):
    def __init__(self):
        self.scale = nnx.Param(np.ones((), np.float32))

    def __call__(self, x):
        return x * self.scale


def test_optimizer_objects_and_schedules(digits):
    (x, y), _ = digits
    sched = pk.optimizers.schedules.CosineDecay(0.0, decay_steps=100, warmup_target=0.01,
                                                warmup_steps=10)
    assert float(sched(5)) == pytest.approx(0.005)
    assert float(sched(10)) == pytest.approx(0.01)
    assert float(sched(60)) == pytest.approx(0.005, rel=1e-5)  # half way down the cosine
    expo = pk.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5,
                                                    staircase=True)
    assert float(expo(25)) == pytest.approx(0.025)
    piece = pk.optimizers.schedules.PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])
    assert [float(piece(s)) for s in (0, 10, 11, 21)] == pytest.approx([1.0, 1.0, 0.5, 0.1])
    for optimizer in (pk.optimizers.Adam(learning_rate=sched), pk.optimizers.SGD(0.05, 0.9),
                      pk.optimizers.AdamW(), pk.optimizers.RMSprop()):
        model = mlp(optimizer=optimizer)
        h = model.fit(x, y, batch_size=64, epochs=2, verbose=0)
        assert h.history["loss"][1] < h.history["loss"][0], optimizer
    model = mlp(optimizer="adam", learning_rate=sched)  # a schedule by name, too
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    assert model.optimizer.learning_rate == pytest.approx(float(sched(23)), rel=1e-5)
    with pytest.raises(pk.ConfigError, match="follows the schedule"):
        model.optimizer.learning_rate = 0.1


# -- callbacks ------------------------------------------------------------------------------------
def test_early_stopping_stops_at_the_right_epoch_with_the_best_weights(digits):
    (x, y), (vx, vy) = digits
    seen = []

    class Remember(pk.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append((logs["val_loss"], self.model.get_weights()))

    model = mlp(optimizer=pk.optimizers.SGD(learning_rate=0.05))
    # A learning rate that jumps after epoch 3 makes val_loss worse from then on.
    jump = pk.callbacks.LearningRateScheduler(lambda epoch, lr: 0.05 if epoch < 4 else 8.0)
    stop = pk.callbacks.EarlyStopping(monitor="val_loss", patience=2,
                                      restore_best_weights=True)
    history = model.fit(x, y, batch_size=64, epochs=30, validation_data=(vx, vy), verbose=0,
                        callbacks=[jump, Remember(), stop])
    losses = history.history["val_loss"]
    best = int(np.argmin(losses))
    assert len(losses) == best + 3  # two epochs without improvement, then stop
    assert stop.stopped_epoch == best + 2 and len(losses) < 30
    for a, b in zip(model.get_weights(), seen[best][1], strict=True):
        np.testing.assert_array_equal(a, b)  # the best epoch's weights, restored


def test_learning_rate_changes_never_recompile(digits):
    (x, y), (vx, vy) = digits
    model = mlp(optimizer=pk.optimizers.Adam(learning_rate=0.01))
    rates = []
    sched = pk.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 2)
    plateau = pk.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0,
                                             factor=0.5)
    record = pk.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: rates.append(logs["learning_rate"]))
    model.fit(x, y, batch_size=64, epochs=4, verbose=0, callbacks=[sched, plateau, record])
    # each epoch halves at its start; from the second epoch on, the plateau (never "improving"
    # by 10 after the first value) halves again at its end
    assert rates == pytest.approx([0.005, 0.00125, 0.0003125, 0.000078125])
    assert model.trace_count["train"] == 1  # one compiled step for all of it


def test_csv_logger_terminate_on_nan_and_batch_hooks(digits, tmp_path):
    (x, y), (vx, vy) = digits
    model = mlp(steps_per_execution=5)
    batches = []
    hook = pk.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batches.append((batch, logs["loss"])))
    log = tmp_path / "log.csv"
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, validation_data=(vx, vy),
              callbacks=[pk.callbacks.CSVLogger(log), hook])
    rows = list(csv.DictReader(open(log)))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert set(rows[0]) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy",
                            "input_wait"}
    steps = -(-len(x) // 64)
    # one call per execution (5 steps), at its last step, as Keras does
    assert [b for b, _ in batches[:3]] == [4, 9, 14] and len(batches) == 2 * -(-steps // 5)
    bad = x.copy()
    bad[300:] = np.nan
    nan_model = mlp()
    h = nan_model.fit(bad, y, batch_size=64, epochs=5, shuffle=False, verbose=0,
                      callbacks=[pk.callbacks.TerminateOnNaN()])
    assert len(h.history["loss"]) == 1 and not np.isfinite(h.history["loss"][0])
    assert int(nan_model.state.step) < steps  # stopped inside the first epoch


def test_monitoring_a_value_the_fit_does_not_produce_is_an_error(digits):
    (x, y), _ = digits
    with pytest.raises(pk.ConfigError, match=r"monitors 'val_loss'.*produces.*validation_data"):
        mlp().fit(x, y, epochs=2, verbose=0, callbacks=[pk.callbacks.EarlyStopping()])


def read_scalars(directory):
    """Scalars of the TensorBoard event files under `directory` ({tag: [(step, value)]})."""
    from tensorboardX.proto import event_pb2

    out = {}
    for path in sorted(Path(directory).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):  # TFRecord framing: length, crc, payload, crc
            (n,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + n])
            at += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_tensorboard_scalars_read_back(digits, tmp_path):
    (x, y), (vx, vy) = digits
    model = mlp()
    model.fit(x, y, batch_size=64, epochs=3, verbose=0, validation_data=(vx, vy),
              callbacks=[pk.callbacks.TensorBoard(tmp_path / "tb", update_freq=10)])
    train = read_scalars(tmp_path / "tb" / "train")
    val = read_scalars(tmp_path / "tb" / "validation")
    assert [s for s, _ in train["epoch_loss"]] == [0, 1, 2]
    history = model.history.history
    np.testing.assert_allclose([v for _, v in train["epoch_loss"]], history["loss"], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in val["epoch_accuracy"]],
                               history["val_accuracy"], rtol=1e-6)
    assert train["epoch_learning_rate"][0][1] == pytest.approx(0.001)
    assert len(train["batch_loss"]) == 3 * -(-len(x) // 64) // 10


def test_tensorboard_takes_keras_s_default_write_graph_and_says_once(monkeypatch):
    """Keras's TensorBoard(write_graph=True), its default, is accepted: podkit writes no
    graph (its program is XLA's) and says so once per process; histograms still refuse."""
    from podkit import callbacks

    monkeypatch.setattr(callbacks, "_graph_said", False)  # as in a fresh process
    with pytest.warns(callbacks.TensorBoardNote, match=r"writes no graph.*write_graph=False"):
        pk.callbacks.TensorBoard("logs", write_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pk.callbacks.TensorBoard("logs")  # said already
        pk.callbacks.TensorBoard("logs", write_graph=False)
    with pytest.raises(pk.ConfigError, match=r"histogram_freq=.*scalars only"):
        pk.callbacks.TensorBoard("logs", histogram_freq=1)


# -- the functional API ---------------------------------------------------------------------------
def two_inputs(digits):
    (x, y), (vx, vy) = digits
    split = lambda a: {"pixels": a[:, :48], "extra": a[:, 48:]}
    return split(x), y, split(vx), vy


def test_a_two_input_functional_model_trains(digits):
    xs, y, vxs, vy = two_inputs(digits)
    a = pk.Input((48,), name="pixels")
    b = pk.Input((16,), name="extra")
    h = L.Concatenate()([L.Dense(32, activation="relu")(a), L.Dense(8, activation="relu")(b)])
    h = L.Add()([L.Dense(32)(h), L.Reshape((32,))(L.Dense(32)(h))])
    out = L.Dense(10, activation="softmax", name="digit")(L.Activation("relu")(h))
    with pk.DataParallel().scope():
        model = pk.Model(inputs=[a, b], outputs=out)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    model.fit(xs, y, batch_size=64, epochs=12, verbose=0)
    assert model.evaluate(vxs, vy, verbose=0, return_dict=True)["accuracy"] >= 0.93
    as_list = model.predict([vxs["pixels"], vxs["extra"]], verbose=0)  # by position, too
    np.testing.assert_allclose(as_list, model.predict(vxs, verbose=0), rtol=1e-6)
    text = model.summary(print_fn=lambda s: None)
    assert "concatenate" in text and "(None, 40)" in text


def test_several_outputs_with_losses_and_metrics_by_name(digits):
    (x, y), _ = digits
    inp = pk.Input((64,))
    h = L.Dense(32, activation="relu")(inp)
    digit = L.Dense(10, activation="softmax", name="digit")(h)
    big = L.Dense(1, activation="sigmoid", name="big")(h)
    model = pk.Model(inp, [digit, big])
    model.compile(optimizer="adam",
                  loss={"digit": "sparse_categorical_crossentropy",
                        "big": "binary_crossentropy"},
                  loss_weights={"digit": 1.0, "big": 0.5},
                  metrics={"digit": ["accuracy"], "big": [pk.metrics.AUC()]})
    h = model.fit(x, {"digit": y, "big": (y > 4).astype(np.float32)}, batch_size=64, epochs=2,
                  verbose=0)
    assert set(h.history) == {"loss", "digit_loss", "big_loss", "digit_accuracy", "big_auc",
                              "input_wait"}
    total = np.array(h.history["digit_loss"]) + 0.5 * np.array(h.history["big_loss"])
    np.testing.assert_allclose(h.history["loss"], total, rtol=1e-5)
    digit_p, big_p = model.predict(x[:5], verbose=0)
    assert digit_p.shape == (5, 10) and big_p.shape == (5, 1)
    with pytest.raises(pk.ConfigError, match=r"names outputs \['digits'\]"):
        model.compile(optimizer="adam", loss={"digits": "mse"})


def test_functional_shape_errors_name_the_layer():
    a = pk.Input((4,))
    b = pk.Input((5,))
    with pytest.raises(pk.ConfigError, match=r"Add .*\(None, 4\), \(None, 5\)"):
        L.Add()([a, b])
    with pytest.raises(pk.ConfigError, match="called on ndarray"):
        L.Dense(3)(np.zeros((2, 4)))


# -- save and load --------------------------------------------------------------------------------
def test_save_and_load_on_8_4_and_1_devices_give_identical_predictions(digits, tmp_path):
    (x, y), (vx, vy) = digits
    with pk.DataParallel().scope():
        model = pk.Sequential([L.Dense(64, activation="relu"), L.Dropout(0.2),
                               L.Dense(10, activation="softmax")])
        model.compile(optimizer=pk.optimizers.Adam(learning_rate=2e-3),
                      loss="sparse_categorical_crossentropy",
                      metrics=["accuracy",
                               pk.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    expected = model.predict(vx, verbose=0)
    model.save(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "model.json").read_text())["class_name"] == "Sequential"
    for devices in (8, 4, 1):
        strategy = pk.Strategy(mesh={"data": devices}, devices=jax.devices()[:devices])
        with strategy.scope():
            loaded = pk.models.load_model(tmp_path / "m")
        assert loaded.strategy.data_parallel_size == devices
        np.testing.assert_array_equal(loaded.predict(vx, verbose=0), expected)
        assert loaded.optimizer.learning_rate == pytest.approx(2e-3)
        assert int(loaded.state.step) == int(model.state.step)
    # training continues from the saved optimizer state exactly as the original would
    loaded.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_functional_models_save_and_load(digits, tmp_path):
    xs, y, vxs, _ = two_inputs(digits)
    a, b = pk.Input((48,), name="pixels"), pk.Input((16,), name="extra")
    out = L.Dense(10, activation="softmax")(L.Concatenate()([L.Dense(16)(a), b]))
    model = pk.Model([a, b], out)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(xs, y, epochs=1, verbose=0)
    model.save(tmp_path / "f")
    loaded = pk.models.load_model(tmp_path / "f")
    np.testing.assert_array_equal(loaded.predict(vxs, verbose=0), model.predict(vxs, verbose=0))


def test_weights_alone_and_models_from_code(digits, tmp_path, monkeypatch):
    (x, y), (vx, _) = digits
    model = mlp()
    model.fit(x, y, epochs=1, verbose=0)
    model.save_weights(tmp_path / "w")
    other = mlp()
    other.load_weights(tmp_path / "w")
    np.testing.assert_array_equal(other.predict(vx, verbose=0), model.predict(vx, verbose=0))
    fresh = mlp()
    fresh.build((64,))
    fresh.set_weights(model.get_weights())
    np.testing.assert_array_equal(fresh.predict(vx, verbose=0), model.predict(vx, verbose=0))
    with pytest.raises(pk.InputError, match=r"set_weights\(\) got 3 arrays; the model has 4"):
        fresh.set_weights(model.get_weights()[:3])

    coded = pk.Model(lambda rngs: _Identity())
    coded.compile(optimizer="sgd", loss="mse")
    coded.fit(x[:, :1], y.astype(np.float32), epochs=1, verbose=0)
    with pytest.warns(UserWarning, match="architecture is Python code"):
        coded.save(tmp_path / "c")
    with pytest.raises(pk.ConfigError, match=r"built from Python code.*load_weights"):
        pk.models.load_model(tmp_path / "c")
    again = pk.Model(lambda rngs: _Identity())
    again.compile(optimizer="sgd", loss="mse")
    again.load_weights(tmp_path / "c")
    assert again.get_weights() == coded.get_weights()

    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("loading executed pickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    model.save(tmp_path / "m")
    pk.models.load_model(tmp_path / "m")  # JSON and Orbax arrays only


def test_loading_a_damaged_or_foreign_directory_says_so(tmp_path, digits):
    with pytest.raises(pk.InputError, match="no model.json"):
        pk.models.load_model(tmp_path)
    (x, y), _ = digits
    model = mlp()
    model.fit(x, y, epochs=1, verbose=0)
    model.save(tmp_path / "m")
    wide = pk.Sequential([L.Dense(32, activation="relu"), L.Dense(10, activation="softmax")])
    wide.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    wide.build((64,))
    with pytest.raises(pk.InputError,
                       match=r"layers\.0\.\w+ .* has shape \(64,?\d*\).*needs \(\d*,? ?32,?\)"):
        wide.load_weights(tmp_path / "m")


# -- fit() without per-call staging cost ----------------------------------------------------------
def test_staged_arrays_are_reused_and_in_place_changes_are_seen(digits):
    (x, y), _ = digits
    x = x.copy()
    model = mlp(optimizer=pk.optimizers.SGD(learning_rate=1e-9), metrics=None)
    model.fit(x, y, epochs=1, verbose=0)
    cache = model._staging
    misses = cache.misses
    model.fit(x, y, epochs=1, verbose=0)
    assert cache.misses == misses and cache.hits >= 1  # not copied again
    before = model.evaluate(x, y, verbose=0)
    x[:] = 0.0  # changed in place: the next call must see the new contents
    misses = cache.misses
    h = model.fit(x, y, epochs=1, verbose=0, shuffle=False)
    assert cache.misses == misses + 1
    zeros = mlp(optimizer=pk.optimizers.SGD(learning_rate=1e-9), metrics=None)
    zeros.build((64,))
    zeros.set_weights(model.get_weights())
    assert h.history["loss"][0] == pytest.approx(zeros.evaluate(x, y, verbose=0), rel=1e-4)
    assert h.history["loss"][0] != pytest.approx(before, rel=1e-3)


def test_fit_writes_the_run_directory_from_a_notebook(digits, tmp_path):
    (x, y), (vx, vy) = digits
    model = mlp()
    model.fit(x, y, epochs=2, verbose=0, validation_data=(vx, vy), run_dir=tmp_path / "run",
              log_every=10)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["kind"] == "Sequential" and run["compile"]["loss"]["class_name"] == \
        "SparseCategoricalCrossentropy"
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert any("loss" in r and "samples_per_s" in r for r in records)
    assert sum("val_loss" in r for r in records) == 2
    final = json.loads((tmp_path / "run" / "final.json").read_text())
    assert final["val_accuracy"] == pytest.approx(model.history.history["val_accuracy"][-1])


# -- the review's and a new user's findings, each pinned ------------------------------------
def test_load_weights_into_a_model_with_another_optimizer(digits, tmp_path):
    (x, y), (vx, _) = digits
    model = mlp()
    model.fit(x, y, epochs=1, verbose=0)
    model.save(tmp_path / "m")
    other = mlp(optimizer=pk.optimizers.SGD(0.01, clipnorm=1.0))
    other.load_weights(tmp_path / "m")  # the optimizer state in the files is left unread
    np.testing.assert_array_equal(other.predict(vx, verbose=0), model.predict(vx, verbose=0))
    inference = pk.models.load_model(tmp_path / "m", compile=False)
    np.testing.assert_array_equal(inference.predict(vx, verbose=0),
                                  model.predict(vx, verbose=0))


def test_a_process_share_one_batch_short_is_padding_not_data():
    from podkit.train.feeds import BatchFeed, dataset_input

    ds = pk.data.Dataset.from_tensor_slices((np.arange(9.0)[:, None], np.arange(9))).batch(4)
    local, steps = dataset_input(ds, None, training=False, process=(2, 1))
    feed = BatchFeed(local, steps_per_execution=1, steps_per_epoch=steps,
                     batch_sharding=pk.Strategy(mesh={"data": 1},
                                                devices=jax.devices()[:1]).batch_sharding(1))
    masks = [host.mask.sum() for host, _, _, _ in feed._host_groups()]
    assert masks == [2, 2, 0]  # the filler batch counts no example


def test_a_kept_state_must_be_a_copy_and_a_copy_works(digits):
    (x, y), _ = digits

    class KeepFirst(pk.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.kept = self.model.state.copy()

        def on_train_end(self, logs=None):
            self.model.state = self.kept

    model = mlp()
    keep = KeepFirst()
    model.fit(x, y, epochs=3, verbose=0, callbacks=[keep])
    assert int(model.state.step) == -(-len(x) // 32)  # back at the end of epoch 0


def test_dict_outputs_are_named_by_their_keys(digits):
    (x, y), _ = digits
    inp = pk.Input((64,))
    h = L.Dense(16, activation="relu")(inp)
    model = pk.Model(inp, {"cls": L.Dense(10, activation="softmax")(h),
                           "reg": L.Dense(1)(h)})
    model.compile(optimizer="adam", loss={"cls": "sparse_categorical_crossentropy",
                                          "reg": "mse"}, metrics={"cls": "accuracy"})
    h = model.fit(x, {"cls": y, "reg": y.astype(np.float32)}, epochs=1, verbose=0)
    assert {"cls_loss", "reg_loss", "cls_accuracy"} <= set(h.history)


def test_one_input_in_a_list_tuple_or_dict(digits):
    (x, y), (vx, _) = digits
    model = mlp()
    model.fit([x], y, epochs=1, verbose=0)
    model.fit((x,), y, epochs=1, verbose=0)
    model.fit({"input": x}, y, epochs=1, verbose=0)
    model.fit(x, y, epochs=1, verbose=0)
    np.testing.assert_array_equal(model.predict([vx], verbose=0), model.predict(vx, verbose=0))


def test_learning_rate_before_the_model_is_built_and_across_recompiles(digits):
    (x, y), _ = digits
    model = mlp(optimizer=pk.optimizers.Adam(learning_rate=0.01))
    assert not model.built and model.optimizer.learning_rate == pytest.approx(0.01)
    model.optimizer.learning_rate = 0.005
    model.fit(x, y, epochs=1, verbose=0)
    assert model.optimizer.learning_rate == pytest.approx(0.005)
    model.optimizer.learning_rate = 1e-4
    steps = model.optimizer.iterations
    model.compile(optimizer=model.optimizer, loss="sparse_categorical_crossentropy")
    # the same optimizer object: its state (rate, step count, moments) carries on, as Keras
    assert model.optimizer.learning_rate == pytest.approx(1e-4)
    assert model.optimizer.iterations == steps > 0


def test_accuracy_is_chosen_by_the_shapes_as_keras_3(digits):
    (x, y), _ = digits
    onehot = pk.utils.to_categorical(y, 10)
    assert onehot.shape == (len(y), 10) and (onehot.argmax(1) == y).all()
    model = mlp(loss="mse", metrics=["accuracy"])  # one-hot labels: categorical accuracy
    h = model.fit(x, onehot, epochs=3, verbose=0)
    assert 0.5 < h.history["accuracy"][-1] <= 1.0


def test_history_and_old_style_batch_hooks(digits):
    (x, y), _ = digits
    seen = []

    class Old(pk.Callback):
        def on_batch_end(self, batch, logs=None):  # Keras's older name
            seen.append(batch)

    model = mlp()
    h = model.fit(x, y, epochs=2, verbose=0, callbacks=[
        Old(), pk.callbacks.LearningRateScheduler(lambda epoch: 1e-3 / (epoch + 1))])
    assert h.history["learning_rate"] == pytest.approx([1e-3, 5e-4])  # one-argument schedule
    assert len(seen) == 2 * -(-len(x) // 32)


def test_rmsprop_is_keras_3s_formula():
    w0 = np.array([1.0, -2.0], np.float32)
    model = pk.Model(lambda rngs: _Vector(w0))
    model.compile(optimizer=pk.optimizers.RMSprop(learning_rate=0.1, rho=0.9, epsilon=1e-7),
                  loss=lambda yt, yp: (yp * yt).sum(axis=-1))
    x = np.ones((1, 2), np.float32)
    model.fit(x, np.ones((1, 2), np.float32), batch_size=1, epochs=1, verbose=0)
    g = np.ones(2)  # d/dw sum(w * 1)
    velocity = 0.1 * g ** 2
    expected = w0 - 0.1 * g / np.sqrt(velocity + 1e-7)  # epsilon inside the square root
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)


class _Vector(nnx.Module):
    def __init__(self, w0):
        self.w = nnx.Param(np.asarray(w0))

    def __call__(self, x):
        return x * self.w


def test_validation_split_cuts_where_keras_does(digits):
    from podkit.trainer import _split

    (x, y), _ = digits
    head, _, _, (vx, _) = _split(x, y, None, 0.3)
    split_at = int(np.ceil(len(x) * (1 - 0.3)))  # Keras's formula
    assert len(head) == split_at and len(vx) == len(x) - split_at
    np.testing.assert_array_equal(vx, x[split_at:])  # the last part, before any shuffling


def test_binary_metrics_see_probabilities_when_the_loss_takes_logits():
    rng = np.random.default_rng(3)
    score = rng.normal(size=(500, 1)).astype(np.float32)
    y = (score[:, 0] + rng.normal(scale=0.5, size=500) > 0).astype(np.float32)
    model = pk.Model(lambda rngs: _Identity())  # outputs the score itself: logits
    model.compile(optimizer="sgd", loss=pk.losses.BinaryCrossentropy(from_logits=True),
                  metrics=["acc", "auc"])
    r = model.evaluate(score, y, verbose=0, return_dict=True)
    pos, neg = score[y == 1, 0], score[y == 0, 0]
    assert r["auc"] == pytest.approx((pos[:, None] > neg[None, :]).mean(), abs=0.01)
    assert r["acc"] == pytest.approx(((score[:, 0] > 0) == (y == 1)).mean())  # logit 0 = p 0.5
