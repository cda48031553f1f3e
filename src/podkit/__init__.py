"""podkit: train models across a pod of accelerators, the tf.distribute way, on JAX.

    import podkit as pk
    strategy = pk.DataParallel()
    with strategy.scope():
        model = pk.Sequential([pk.layers.Dense(128, activation="relu"),
                               pk.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    model.fit(x, y, epochs=3)
"""

from podkit import data, datasets, layers, losses, metrics, optimizers
from podkit.cluster import Cluster, connect
from podkit.errors import ConfigError, ConnectError, DataError, InputError, PodkitError
from podkit.model import Model, Sequential
from podkit.strategy import DataParallel, Strategy
from podkit.train import hooks as callbacks
from podkit.train.hooks import Callback, History

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "Cluster",
    "ConfigError",
    "ConnectError",
    "DataError",
    "DataParallel",
    "History",
    "InputError",
    "Model",
    "PodkitError",
    "Sequential",
    "Strategy",
    "callbacks",
    "connect",
    "data",
    "datasets",
    "layers",
    "losses",
    "metrics",
    "optimizers",
]
