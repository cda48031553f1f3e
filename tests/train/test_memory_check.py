"""Memory before launch: the compiled train step's memory analysis against a device's capacity
(podkit.train.program.Program.check_fits), an error with the numbers and the options before
the first step runs."""

import numpy as np
import pytest

import podkit as pk
from podkit import hardware
from podkit.errors import ConfigError, DeviceMemoryError


def _fit(**fit_args):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    y = rng.integers(0, 10, 256)
    model = pk.Sequential([pk.layers.Dense(1024, activation="relu"), pk.layers.Dense(10)])
    model.compile(optimizer="adam", loss=pk.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    return model, model.fit(x, y, batch_size=64, verbose=0, **fit_args)


def test_a_step_too_big_for_the_declared_capacity_fails_before_the_first_step(monkeypatch):
    monkeypatch.setenv(hardware.ENV_DEVICE_MEMORY, "2MiB")
    with pytest.raises(DeviceMemoryError) as info:
        _fit()
    message = str(info.value)
    assert "the train step does not fit in device memory: it needs" in message
    assert "a device holds 2.00 MiB (declared by PODKIT_DEVICE_MEMORY)" in message
    assert "FSDP" in message and "remat" in message and "examples per device" in message
    assert "Nothing ran" in message


def test_a_step_that_fits_trains(monkeypatch):
    monkeypatch.setenv(hardware.ENV_DEVICE_MEMORY, "4GiB")
    model, history = _fit()
    assert model.steps_trained == 4 and len(history.history["loss"]) == 1


def test_a_bad_declared_capacity_names_the_forms(monkeypatch):
    monkeypatch.setenv(hardware.ENV_DEVICE_MEMORY, "lots")
    with pytest.raises(ConfigError, match="PODKIT_DEVICE_MEMORY='lots'.*GiB"):
        _fit()


def test_sizes_parse():
    assert hardware.parse_bytes("16GiB") == 16 << 30
    assert hardware.parse_bytes("512 MiB") == 512 << 20
    assert hardware.parse_bytes("1.5G") == int(1.5 * (1 << 30))
    assert hardware.parse_bytes("1000") == 1000
