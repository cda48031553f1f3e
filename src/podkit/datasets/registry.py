"""The data a config names: `[data] name = "digits" | "text" | "instructions" | "images" |
"criteo" | "imagenet_tfrecord"`.

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
    # (x, y) numpy arrays (x may be a dict of arrays), or a pk.data Dataset of (x, y)
    # batches that repeats without end (data read from files as a stream)
    train: Any
    validation: Any  # the same kind, or None when validation_fraction == 0
    info: dict[str, Any]
    rows: int | None = None  # training examples in one pass; None: the arrays' length

    @property
    def streamed(self) -> bool:
        """A Dataset, not arrays: fit() takes it without batch_size, for given steps."""
        return not isinstance(self.train, tuple)

    def train_rows(self) -> int:
        """Training examples in one pass over the data."""
        if self.rows is not None:
            return self.rows
        import jax

        return len(jax.tree.leaves(self.train[1])[0])

    def validation_batches(self, batch_size: int) -> int:
        """Batches of `batch_size` in one pass over the validation split (0: none)."""
        if self.validation is None:
            return 0
        if self.streamed:
            return int(self.info.get("validation_batches", 0))
        import jax

        rows = len(jax.tree.leaves(self.validation[1])[0])
        return -(-rows // batch_size)

    def first(self, n: int) -> tuple[Any, Any]:
        """(x, y): the first `n` training examples as arrays (at least one batch)."""
        import jax
        import numpy as np

        if not self.streamed:
            return jax.tree.map(lambda a: a[:n], self.train)
        xs, ys, got = [], [], 0
        for x, y in self.train:
            xs.append(x)
            ys.append(y)
            got += len(jax.tree.leaves(y)[0])
            if got >= n:
                break
        cat = lambda *parts: np.concatenate(parts)[:n]
        return jax.tree.map(cat, *xs), jax.tree.map(cat, *ys)


# name -> (module, loader(config, seed) -> Data)
REGISTRY: dict[str, tuple[str, str]] = {
    "digits": ("podkit.datasets.registry", "load_digits_data"),
    "text": ("podkit.datasets.text", "load_text"),
    "instructions": ("podkit.datasets.instructions", "load_instructions"),
    "images": ("podkit.datasets.images", "load_images"),
    "criteo": ("podkit.datasets.criteo", "load_criteo"),
    "imagenet_tfrecord": ("podkit.datasets.imagenet_tfrecord", "load_imagenet_tfrecord"),
}


def check_ints(config: Any, lows: dict[str, int]) -> None:
    """Each named int of a `[data]` section is at least its low bound (a config made in Python
    skips the TOML loader's checks)."""
    for key, low in lows.items():
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"data.{key} = {value!r}; use an int >= {low}.")


def split_tail(x: Any, y: Any, config: Any, source: str | None = None,
               ) -> tuple[tuple[Any, Any], tuple[Any, Any] | None]:
    """(train, validation): the last `validation_fraction` of the rows (None when 0) held out
    of generated data (or of rows read from files: `source` says which, for the errors); x may
    be a dict of arrays. At least one batch must stay for training."""
    if not 0.0 <= config.validation_fraction < 1.0:
        raise ConfigError(f"data.validation_fraction = {config.validation_fraction!r}; use a "
                          "number in [0, 1).")
    rows = len(y)
    cut = rows - int(round(rows * config.validation_fraction))
    if cut < config.batch_size:
        fix = ("Raise data.samples." if source is None else
               "Add rows, or lower data.batch_size or data.validation_fraction.")
        raise ConfigError(f"{source or f'data.samples = {rows}'}: that leaves {cut} training "
                          f"rows, fewer than one batch of data.batch_size = "
                          f"{config.batch_size}. {fix}")

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
