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

from __future__ import annotations

from typing import TYPE_CHECKING

from podkit import _lazy
from podkit import lifetime as _lifetime  # noqa: F401  (notes when podkit was imported)
from podkit._version import __version__ as __version__
from podkit.errors import ConfigError, ConnectError, DataError, InputError, PodkitError

# The public names load on first use (PEP 562): `import podkit` stays light, so a process that
# needs one part starts fast — input workers import podkit.data, never Flax and the model stack.
_LAZY: dict[str, tuple[str, str | None]] = {
    "data": ("podkit.data", None),
    "datasets": ("podkit.datasets", None),
    "layers": ("podkit.layers", None),
    "losses": ("podkit.losses", None),
    "metrics": ("podkit.metrics", None),
    "optimizers": ("podkit.optimizers", None),
    "callbacks": ("podkit.callbacks", None),
    "checkpoint": ("podkit.checkpoint", None),
    "launch": ("podkit.launch", None),
    "models": ("podkit.models", None),
    "initializers": ("podkit.initializers", None),
    "kernels": ("podkit.kernels", None),
    "io": ("podkit.io", None),
    "image": ("podkit.image", None),
    "interop": ("podkit.interop", None),
    "regularizers": ("podkit.regularizers", None),
    "utils": ("podkit.utils", None),
    "runs": ("podkit.runs", None),
    "Callback": ("podkit.train.hooks", "Callback"),
    "History": ("podkit.train.hooks", "History"),
    "Input": ("podkit.layers.symbolic", "Input"),
    "Variable": ("podkit.layers.variable", "Variable"),
    "TrainState": ("podkit.train.state", "TrainState"),
    "Cluster": ("podkit.cluster", "Cluster"),
    "connect": ("podkit.cluster", "connect"),
    "Model": ("podkit.model", "Model"),
    "Sequential": ("podkit.sequential", "Sequential"),
    "DataParallel": ("podkit.strategy", "DataParallel"),
    "Strategy": ("podkit.strategy", "Strategy"),
    "FSDP": ("podkit.strategy", "FSDP"),
    "TensorParallel": ("podkit.strategy", "TensorParallel"),
    "constrain": ("podkit.strategy", "constrain"),
}

__all__ = [
    "FSDP", "Callback", "Cluster", "ConfigError", "ConnectError", "DataError",
    "DataParallel", "History", "Input", "InputError", "Model", "PodkitError", "Sequential",
    "Strategy", "TensorParallel", "TrainState", "Variable", "callbacks", "checkpoint", "connect",
    "constrain", "data", "datasets", "image", "initializers", "interop", "io", "kernels",
    "launch",
    "layers", "losses", "metrics", "models", "optimizers", "regularizers", "runs", "utils",
]


__getattr__, __dir__ = _lazy.attributes(__name__, _LAZY, globals())


if TYPE_CHECKING:  # what static tools see: the same names, imported eagerly
    from podkit import (
        callbacks,
        checkpoint,
        data,
        datasets,
        image,
        initializers,
        interop,
        io,
        kernels,
        launch,
        layers,
        losses,
        metrics,
        models,
        optimizers,
        regularizers,
        runs,
        utils,
    )
    from podkit.cluster import Cluster, connect
    from podkit.layers.symbolic import Input
    from podkit.layers.variable import Variable
    from podkit.model import Model
    from podkit.sequential import Sequential
    from podkit.strategy import FSDP, DataParallel, Strategy, TensorParallel, constrain
    from podkit.train.hooks import Callback, History
    from podkit.train.state import TrainState
