"""The train step's own sums: the gradient norm of each execution's last step and the
learning rate, logged beside the loss (podkit.train.step.STEP_SUMS)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk


def _fit(tmp_path, **compile_args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    model = pk.Sequential([pk.Input((3,)), pk.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=pk.optimizers.SGD(0.1), loss="mse", **compile_args)
    model.build((None, 3))
    kernel = np.asarray(model.get_weights()[0])
    model.fit(x, y, batch_size=64, epochs=1, verbose=0, run_dir=tmp_path, log_every=1)
    record = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
              .splitlines() if "loss" in json.loads(line)][-1]
    return x, y, kernel, record


def test_the_logged_gradient_norm_is_the_steps(tmp_path):
    x, y, kernel, record = _fit(tmp_path, grad_norm=True)
    grad = jax.grad(lambda w: jnp.mean(jnp.square(x @ w - y)))(kernel)
    assert record["grad_norm"] == pytest.approx(float(jnp.linalg.norm(grad)), rel=1e-5)
    assert record["learning_rate"] == pytest.approx(0.1)


def test_small_models_skip_the_norm_unless_asked(tmp_path):
    *_, record = _fit(tmp_path)  # 3 parameters: under GRAD_NORM_PARAMS
    assert "grad_norm" not in record and record["learning_rate"] == pytest.approx(0.1)


def test_a_bad_grad_norm_is_refused():
    model = pk.Sequential([pk.layers.Dense(1)])
    with pytest.raises(pk.errors.ConfigError, match="grad_norm='yes'"):
        model.compile(optimizer="sgd", loss="mse", grad_norm="yes")


def test_the_logged_learning_rate_is_the_rate_at_that_step(tmp_path, monkeypatch):
    """Under a decaying schedule every line that carries learning_rate gives the rate its step
    used (step n, counted from 1, ran at schedule(n - 1), as optax counts), not a mean over
    the steps since the previous line (0.00049 logged where the schedule said 0.00031)."""
    monkeypatch.setattr("podkit.train.telemetry.EVERY_S", 0.0)  # every log point is full
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    y = rng.standard_normal((64, 1)).astype(np.float32)
    schedule = pk.optimizers.schedules.PolynomialDecay(0.1, decay_steps=40, power=1.0,
                                                       end_learning_rate=0.0)
    model = pk.Sequential([pk.Input((3,)), pk.layers.Dense(1)])
    model.compile(optimizer=pk.optimizers.SGD(schedule), loss="mse", steps_per_execution=2)
    model.fit(x, y, batch_size=8, epochs=4, verbose=0, run_dir=tmp_path, log_every=4,
              shuffle=False)
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["learning_rate"] for r in lines if "learning_rate" in r}
    assert len(logged) >= 6
    for step, rate in logged.items():
        assert rate == pytest.approx(0.1 * (1 - (step - 1) / 40), abs=1e-6), (step, rate)
