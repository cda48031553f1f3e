"""LARS against Optax's own (it is not in Keras; LAMB is Keras's, in
tests/test_optimizers_keras.py), the trust ratio, and both by name."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import podkit as pk
from podkit.optimizers import Lamb, Lars

PARAMS = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32),
          "b": jnp.ones(3)}


def updates_after(tx, steps=3):
    grads = jax.tree.map(lambda p: p * 0.3 + 0.1, PARAMS)
    state = tx.init(PARAMS)
    for _ in range(steps):
        updates, state = tx.update(grads, state, PARAMS)
    return updates


@pytest.mark.parametrize("ours, reference", [
    (Lars(0.1, weight_decay=0.001), optax.lars(0.1, weight_decay=0.001, momentum=0.9,
                                               weight_decay_mask=True, trust_ratio_mask=True)),
    (Lars(0.1, momentum=0.8, nesterov=True), optax.lars(0.1, momentum=0.8, nesterov=True)),
])
def test_matches_optax(ours, reference):
    got, want = updates_after(ours.transform()), updates_after(reference)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_trust_ratio_makes_the_step_scale_with_the_weights():
    # LARS's step for a parameter is lr * trust * ||w|| in norm, whatever the gradient's scale.
    tx = Lars(1.0, momentum=0.0, trust_coefficient=0.01).transform()
    for scale in (1e-3, 1e3):
        grads = jax.tree.map(lambda p, s=scale: p * 0 + s, PARAMS)
        updates, _ = tx.update(grads, tx.init(PARAMS), PARAMS)
        np.testing.assert_allclose(jnp.linalg.norm(updates["w"]),
                                   0.01 * jnp.linalg.norm(PARAMS["w"]), rtol=1e-5)


def test_by_name_and_config_round_trip():
    assert isinstance(pk.optimizers.get("lamb"), Lamb)
    assert isinstance(pk.optimizers.get("LARS", 0.5), Lars)
    opt = Lars(0.2, momentum=0.8, weight_decay=1e-4, trust_coefficient=0.02)
    again = Lars.from_config(opt.get_config())
    assert again.get_config() == opt.get_config()


def test_bad_lars_arguments_raise():
    with pytest.raises(pk.ConfigError, match=r"momentum=1.5"):
        Lars(momentum=1.5)
    with pytest.raises(pk.ConfigError, match=r"trust_coefficient=0"):
        Lars(trust_coefficient=0)


def test_lamb_trains_a_model():
    x = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    model = pk.Sequential([pk.layers.Dense(16, activation="relu"),
                           pk.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=Lamb(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=64, epochs=8, verbose=0)
    assert history.history["loss"][-1] < 0.7 * history.history["loss"][0]
