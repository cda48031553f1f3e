"""The data a config names: `[data] name = "digits" | "text" | "images" | "criteo"`.

`load(config, seed)` returns `Data(train, validation, info)`: (x, y) arrays for fit, and what a
model needs to size itself (`info`: classes, image shape, vocabulary, table rows...). Loaders
import on use, so `import podkit.datasets` stays light.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from podkit.errors import ConfigError


@dataclasses.dataclass
class Data:
    train: tuple[Any, Any]  # (x, y) numpy arrays; x may be a dict of arrays
    validation: tuple[Any, Any] | None  # None when validation_fraction == 0
    info: dict[str, Any]


# name -> (module, loader(config, seed) -> Data)
REGISTRY: dict[str, tuple[str, str]] = {
    "digits": ("podkit.datasets.registry", "load_digits_data"),
    "text": ("podkit.datasets.text", "load_text"),
    "images": ("podkit.datasets.images", "load_images"),
    "criteo": ("podkit.datasets.criteo", "load_criteo"),
}


def check_ints(config: Any, lows: dict[str, int]) -> None:
    """Each named int of a `[data]` section is at least its low bound (a config made in Python
    skips the TOML loader's checks)."""
    for key, low in lows.items():
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"data.{key} = {value!r}; use an int >= {low}.")


def split_tail(x: Any, y: Any, config: Any) -> tuple[tuple[Any, Any], tuple[Any, Any] | None]:
    """(train, validation): the last `validation_fraction` of the rows (None when 0) held out
    of generated data; x may be a dict of arrays. At least one batch must stay for training."""
    if not 0.0 <= config.validation_fraction < 1.0:
        raise ConfigError(f"data.validation_fraction = {config.validation_fraction!r}; use a "
                          "number in [0, 1).")
    rows = len(y)
    cut = rows - int(round(rows * config.validation_fraction))
    if cut < config.batch_size:
        raise ConfigError(f"data.samples = {rows} leaves {cut} training rows: fewer than one "
                          f"batch of data.batch_size = {config.batch_size}. Raise data.samples.")

    def part(rows: slice) -> Any:
        return {k: v[rows] for k, v in x.items()} if isinstance(x, dict) else x[rows]

    train = (part(slice(None, cut)), y[:cut])
    return train, ((part(slice(cut, None)), y[cut:]) if cut < rows else None)


def load(config: Any, seed: int = 0) -> Data:
    """The dataset a `[data]` section describes."""
    name = getattr(config, "name", None)
    if name not in REGISTRY:
        raise ConfigError(f"data.name = {name!r}; valid names: {', '.join(REGISTRY)}.")
    module, loader = REGISTRY[name]
    return getattr(importlib.import_module(module), loader)(config, seed)


def load_digits_data(config: Any, seed: int = 0) -> Data:
    """The bundled UCI digits: x (n, 64) float32 in [0, 1], y int32 in 0..9."""
    from podkit.datasets.digits import load_digits

    (x, y), (vx, vy) = load_digits(validation_fraction=config.validation_fraction, seed=seed)
    return Data((x, y), (vx, vy) if len(vx) else None,
                {"classes": 10, "input_shape": (64,), "image_shape": (8, 8, 1)})
