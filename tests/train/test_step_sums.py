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
