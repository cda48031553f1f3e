"""The seed example end to end: convergence, data parallelism, steps per execution, layers."""

import flax.nnx as nnx
import jax
import numpy as np
import pytest

import podkit as pk
from helpers import StepLosses, seed_model


def one_device():
    return pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1])


def test_seed_example_converges(digits):
    (x, y), (vx, vy) = digits
    with pk.DataParallel().scope():
        model = seed_model(steps_per_execution=4)
    history = model.fit(x, y, batch_size=64, epochs=12, validation_data=(vx, vy), verbose=0)
    assert history.history["val_accuracy"][-1] >= 0.95
    assert history.history["loss"][-1] < history.history["loss"][0] / 4
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy", "input_wait"}
    assert model.evaluate(vx, vy, return_dict=True)["accuracy"] == pytest.approx(
        history.history["val_accuracy"][-1]
    )


def _train(strategy, x, y, **fit):
    with strategy.scope():
        model = seed_model(steps_per_execution=fit.pop("spe", 1))
    rec = StepLosses()
    model.fit(x, y, batch_size=64, verbose=0, callbacks=[rec], log_every=1, **fit)
    return model, rec.losses


def test_data_parallel_8_devices_matches_one_device(digits):
    (x, y), _ = digits
    m1, l1 = _train(one_device(), x, y, epochs=2)
    m8, l8 = _train(pk.DataParallel(), x, y, epochs=2)
    assert m8.strategy.data_parallel_size == 8
    assert len(l1) == len(l8) == 2 * -(-len(x) // 64)
    np.testing.assert_allclose(l8, l1, rtol=1e-5)
    for leaf in jax.tree.leaves(m8.state.params):
        assert leaf.sharding.is_fully_replicated
        assert len(leaf.sharding.device_set) == 8
        shards = [np.asarray(s.data) for s in leaf.addressable_shards]
        for s in shards[1:]:
            np.testing.assert_array_equal(s, shards[0])


def test_state_is_created_in_its_shardings(digits):
    (x, _), _ = digits
    with pk.DataParallel().scope():
        model = seed_model()
        model.build(x.shape[1:])
    for leaf in jax.tree.leaves((model.state.params, model.state.opt_state)):
        assert leaf.sharding.mesh.shape == {"data": 8}


def test_steps_per_execution_equals_single_steps(digits):
    (x, y), _ = digits
    m1, l1 = _train(pk.DataParallel(), x, y, epochs=2, spe=1)
    m4, l4 = _train(pk.DataParallel(), x, y, epochs=2, spe=4)
    # one log per execution: compare the k-step windows with the means of k single steps
    steps = -(-len(x) // 64)
    per_epoch = [l1[i * steps : (i + 1) * steps] for i in range(2)]
    grouped = []
    for epoch in per_epoch:
        for i in range(0, steps, 4):
            grouped.append(epoch[i : i + 4])
    assert len(grouped) == len(l4)
    for chunk, value in zip(grouped, l4, strict=True):
        if len(chunk) == 4:  # full windows hold equal-weight batches
            assert value == pytest.approx(np.mean(chunk), rel=1e-5)
    for a, b in zip(jax.tree.leaves(m1.get_weights()), jax.tree.leaves(m4.get_weights()),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_eager_mode_matches_jit(digits):
    (x, y), _ = digits
    x, y = x[:256], y[:256]
    with pk.DataParallel().scope():
        a = seed_model(steps_per_execution=2)
        b = seed_model(steps_per_execution=2, jit=False)
    ha = a.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    hb = b.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    assert hb.history["loss"][0] == pytest.approx(ha.history["loss"][0], rel=1e-4)


def test_softmax_with_sparse_crossentropy_stays_finite():
    # A confident, wrong model: a plain log(softmax) would give inf.
    x = np.full((16, 4), 100.0, np.float32)
    y = np.zeros(16, np.int32)
    with one_device().scope():
        model = pk.Sequential([pk.layers.Dense(3, activation="softmax")])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        model.build((4,))
    kernel = np.array([[-50.0, 50.0, 0.0]] * 4, np.float32)
    model.set_weights([kernel, np.zeros(3, np.float32)])  # kernel, bias (Keras's order)
    loss = model.evaluate(x, y, batch_size=16)
    assert np.isfinite(loss) and loss > 1000  # exact cross-entropy from logits: 40,000
    h = model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(h.history["loss"][0])
    assert all(np.isfinite(a).all() for a in jax.tree.leaves(model.get_weights()))


def test_predict_returns_one_row_per_example_with_padding(digits):
    (x, y), _ = digits
    with pk.DataParallel().scope():
        model = seed_model()
    model.fit(x[:512], y[:512], batch_size=64, epochs=1, verbose=0)
    p = model.predict(x[:100], batch_size=64)  # 100 = 64 + 36: last batch padded
    assert p.shape == (100, 10)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    p_small = model.predict(x[:10], batch_size=8)
    np.testing.assert_allclose(p_small, p[:10], rtol=1e-5, atol=1e-6)


def test_iterable_of_batches_matches_arrays(digits):
    (x, y), _ = digits
    x, y = x[:512], y[:512]
    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 512, 64)]
    with pk.DataParallel().scope():
        a = seed_model(steps_per_execution=3)
        b = seed_model(steps_per_execution=3)
    ha = a.fit(x, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
    hb = b.fit(batches, epochs=2, verbose=0)
    np.testing.assert_allclose(hb.history["loss"], ha.history["loss"], rtol=1e-5)


def test_sample_weights_reduce_as_keras(digits):
    """Keras's "sum_over_batch_size": sum(loss * weight) / examples. Zero weights count in the
    denominator (unlike padding, which is no example at all)."""
    (x, y), _ = digits
    x, y = x[:128], y[:128]
    w = np.ones(128, np.float32)
    w[64:] = 0
    with pk.DataParallel().scope():
        a = seed_model(optimizer=pk.optimizers.SGD(learning_rate=1e-9))
        b = seed_model(optimizer=pk.optimizers.SGD(learning_rate=1e-9))
    weighted = a.fit(x, y, sample_weight=w, batch_size=128, epochs=1, verbose=0, shuffle=False)
    half = b.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0, shuffle=False)
    assert weighted.history["loss"][0] == pytest.approx(half.history["loss"][0] / 2, rel=1e-5)
    # padding is not an example: 100 rows in batches of 64 average over 100
    c = seed_model(optimizer=pk.optimizers.SGD(learning_rate=1e-9))
    loss_100 = c.evaluate(x[:100], y[:100], batch_size=64, verbose=0)[0]
    loss_each = [c.evaluate(x[i:i + 1], y[i:i + 1], batch_size=8, verbose=0)[0]
                 for i in range(100)]
    assert loss_100 == pytest.approx(np.mean(loss_each), rel=1e-5)


def test_keras_layers_train_on_images():
    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8, 1), dtype=np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0.5).astype(np.int32)
    with pk.DataParallel().scope():
        model = pk.Sequential([
            pk.layers.Conv2D(8, 3, padding="same", activation="relu"),
            pk.layers.BatchNormalization(),
            pk.layers.MaxPooling2D(2),
            pk.layers.Flatten(),
            pk.layers.Dropout(0.2),
            pk.layers.Dense(16, activation="relu"),
            pk.layers.LayerNormalization(),
            pk.layers.Dense(1, activation="sigmoid"),
        ])
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    h = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert model.output_shape == (None, 1)  # as Keras
    assert np.isfinite(h.history["loss"]).all()
    text = model.summary(print_fn=lambda s: None)
    assert "conv2d" in text and "(None, 4, 4, 8)" in text
    # batch statistics are state that training updates
    stats = model.state.rest["layers"][1]["mean"]
    assert np.abs(np.asarray(stats)).sum() > 0


def test_embedding_and_model_wrapping_any_nnx_module():
    class Bag(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(50, 8, rngs=rngs)
            self.out = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, ids):
            return self.out(self.embed(ids).mean(axis=1))

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (64, 5)).astype(np.int32)
    y = (ids[:, 0] < 25).astype(np.int32)
    with pk.DataParallel().scope():
        wrapped = pk.Model(lambda rngs: Bag(rngs))
        wrapped.compile(optimizer="adam", loss=lambda yt, yp: -jax.nn.log_softmax(yp)[
            np.arange(yp.shape[0]), yt])
        seq = pk.Sequential([pk.layers.Embedding(50, 8), pk.layers.Flatten(),
                             pk.layers.Dense(2, activation="softmax")])
        seq.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    h1 = wrapped.fit(ids, y, batch_size=32, epochs=5, verbose=0)
    h2 = seq.fit(ids, y, batch_size=32, epochs=5, verbose=0)
    assert h1.history["loss"][-1] < h1.history["loss"][0]
    assert h2.history["loss"][-1] < h2.history["loss"][0]
    built = Bag(nnx.Rngs(0))
    with pk.DataParallel().scope():
        placed = pk.Model(built)  # it emits logits: the loss must say so
        placed.compile(optimizer="sgd",
                       loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert np.isfinite(placed.evaluate(ids, y, batch_size=32))


def test_a_one_shot_generator_loses_no_batch(digits):
    (x, y), _ = digits
    x, y = x[:256], y[:256]
    with pk.DataParallel().scope():
        a = seed_model()
        b = seed_model()
    ha = a.fit(x, y, batch_size=64, epochs=1, verbose=0, shuffle=False)
    hb = b.fit(((x[i : i + 64], y[i : i + 64]) for i in range(0, 256, 64)), verbose=0)
    assert hb.history["loss"][0] == pytest.approx(ha.history["loss"][0], rel=1e-5)
