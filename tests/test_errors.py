"""Bad input raises a clear error, naming the value and the fix, before XLA sees it."""

import jax
import numpy as np
import pytest

import podkit as pk
from helpers import seed_model


@pytest.fixture
def fitted(digits):
    (x, y), _ = digits
    with pk.DataParallel().scope():
        model = seed_model()
    model.fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0)
    return model


def test_features_that_do_not_match_the_built_model(fitted):
    with pytest.raises(pk.InputError, match=r"\(batch, 63\).*built for \(batch, 64\)"):
        fitted.fit(np.zeros((64, 63), np.float32), np.zeros(64, np.int32), verbose=0)
    with pytest.raises(pk.InputError, match="do not match the model"):
        fitted.predict(np.zeros((8, 65), np.float32))


def test_labels_out_of_range(fitted, digits):
    (x, y), _ = digits
    bad = y[:64].copy()
    bad[3] = 10
    with pytest.raises(pk.InputError, match=r"label 10 is out of range for 10 classes"):
        fitted.fit(x[:64], bad, batch_size=64, verbose=0)
    bad[3] = -1
    with pytest.raises(pk.InputError, match=r"label -1 is out of range"):
        fitted.evaluate(x[:64], bad, batch_size=64)
    batches = [(x[:64], y[:64]), (x[64:128], np.full(64, 12))]
    with pytest.raises(pk.InputError, match=r"label 12"):
        fitted.fit(batches, verbose=0)


def test_x_and_y_of_different_lengths(digits):
    (x, y), _ = digits
    with pk.DataParallel().scope():
        model = seed_model()
    with pytest.raises(pk.InputError, match="x has 100 examples but y has 99"):
        model.fit(x[:100], y[:99], verbose=0)


def test_empty_dataset():
    with pk.DataParallel().scope():
        model = seed_model()
    with pytest.raises(pk.InputError, match="empty"):
        model.fit(np.zeros((0, 64), np.float32), np.zeros(0, np.int32), verbose=0)
    with pytest.raises(pk.InputError, match="empty"):
        model.fit([], verbose=0)


def test_global_batch_not_divisible_by_data_parallel_size(digits):
    (x, y), _ = digits
    with pk.DataParallel().scope():
        model = seed_model()
    with pytest.raises(pk.InputError, match=r"batch_size=30 is not divisible by the "
                       r"data-parallel size 8; use batch_size=32 or 24.*remainder='pad'"):
        model.fit(x, y, batch_size=30, verbose=0)
    h = model.fit(x[:120], y[:120], batch_size=30, remainder="pad", epochs=1, verbose=0)
    assert np.isfinite(h.history["loss"][0])
    h = model.fit(x[:120], y[:120], batch_size=30, remainder="drop", epochs=1, verbose=0)
    assert np.isfinite(h.history["loss"][0])
    with pytest.raises(pk.ConfigError, match="remainder='cut'"):
        model.fit(x, y, batch_size=30, remainder="cut", verbose=0)


def test_unknown_strategy_axis():
    with pytest.raises(pk.ConfigError, match=r"unknown strategy axis 'batch'.*data, fsdp, model"):
        pk.Strategy(mesh={"batch": -1})
    with pytest.raises(pk.ConfigError, match=r"asks for 3 devices but the cluster has 8"):
        _ = pk.Strategy(mesh={"data": 3}).mesh
    with pytest.raises(pk.ConfigError, match=r"names mesh axis 'tensor'"):
        pk.Strategy(rules=[("mlp", "tensor")])


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(optimizer="adamm", loss="mse"),
         r"unknown optimizer 'adamm'; valid names: adadelta, adafactor, adagrad"),
        (dict(optimizer="adam", loss="crossentropy"), r"unknown loss 'crossentropy'; valid"),
        (dict(optimizer="adam", loss="mse", metrics="accuracy"), r"must be a list"),
        (dict(optimizer="adam", loss="mse", metrics=["f1"]), r"unknown metric 'f1'"),
        (dict(optimizer="adam", loss="mse", steps_per_execution=0), r"steps_per_execution=0"),
    ],
)
def test_unknown_names_list_the_valid_ones(kwargs, pattern):
    model = pk.Sequential([pk.layers.Dense(1)])
    with pytest.raises(pk.ConfigError, match=pattern):
        model.compile(**kwargs)


def test_bad_layer_arguments():
    with pytest.raises(pk.ConfigError, match=r"unknown activation 'rleu'; valid names: elu"):
        pk.layers.Dense(3, activation="rleu")
    with pytest.raises(pk.ConfigError, match=r"units must be a positive int"):
        pk.layers.Dense(0)
    with pytest.raises(pk.ConfigError, match=r"rate must be in \[0, 1\)"):
        pk.layers.Dropout(1.5)
    model = pk.Sequential([pk.layers.Conv2D(4, 3)])
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(pk.ConfigError, match=r"needs inputs of rank 4"):
        model.build((8, 8))


def test_fit_before_compile(digits):
    (x, y), _ = digits
    model = pk.Sequential([pk.layers.Dense(10)])
    with pytest.raises(pk.ConfigError, match=r"call model.compile"):
        model.fit(x, y, verbose=0)
    with pytest.raises(pk.ConfigError, match=r"summary\(\) needs a built model"):
        model.summary()


def test_an_iterator_that_runs_dry_names_the_fix(digits):
    (x, y), _ = digits
    with pk.DataParallel().scope():
        model = seed_model()
    gen = ((x[i : i + 64], y[i : i + 64]) for i in range(0, 256, 64))
    with pytest.raises(pk.InputError, match="exhausted: pass a re-iterable"):
        model.fit(gen, epochs=2, verbose=0)


def test_virtual_devices_after_backend_started():
    assert len(jax.devices()) == 8
    with pytest.raises(pk.ConnectError, match=r"connect\(\) was already called"):
        pk.connect(cpu_devices=4)
    assert pk.connect() is pk.connect()
