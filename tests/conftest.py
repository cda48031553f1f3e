"""Every in-process test runs on 8 virtual CPU devices; one-device runs pick devices[:1]."""

import os

import pytest

os.environ.setdefault("PODKIT_STAGE_BYTES", str(2 << 30))

import podkit as pk  # noqa: E402

pk.connect(cpu_devices=8)


@pytest.fixture(scope="session")
def digits():
    return pk.datasets.load_digits()

