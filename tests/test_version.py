"""podkit._version: one version for the package, its metadata and what saves record."""

import importlib.metadata
import json

import podkit as pk
from podkit import _version


def test_one_version_everywhere(tmp_path):
    assert pk.__version__ == _version.__version__
    assert importlib.metadata.version("podkit") == _version.__version__  # pyproject reads it
    model = pk.Sequential([pk.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.build((3,))
    model.save_weights(tmp_path / "w")
    assert json.loads((tmp_path / "w" / "weights.json").read_text())["podkit"] == pk.__version__
