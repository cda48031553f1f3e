"""Every in-process test runs on 8 virtual CPU devices; one-device runs pick devices[:1]."""

import os

import pytest

os.environ.setdefault("PODKIT_STAGE_BYTES", str(2 << 30))

import podkit as pk  # noqa: E402

pk.connect(cpu_devices=8)


@pytest.fixture(scope="session")
def digits():
    return pk.datasets.load_digits()



# Real storage servers on loopback (moto's S3, a GCS emulator), started once per session by
# the tests that ask for them.
from storage_servers import gcs, gcs_endpoint, s3, s3_endpoint  # noqa: E402, F401
