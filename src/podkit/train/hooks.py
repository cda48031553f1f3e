"""Callbacks (Keras's name for hooks): the Keras 3 events, plus `on_log`.

The loop calls, as Keras does: `on_train_begin/end`, `on_epoch_begin/end(epoch, logs)`,
`on_train_batch_begin/end(batch, logs)` once per execution (with steps_per_execution=k, at
steps k-1, 2k-1, ... — Keras's behaviour), `on_test_*` and `on_predict_*` in evaluate() and
predict(). Batch logs cost a device-to-host copy per execution, so the loop fetches them only
when a callback overrides a batch hook; otherwise nothing waits on the device.

`on_log(step, logs)` is podkit's own: at each log point, with sums the loop fetched from an
execution that had already finished (so it never waits): the epoch's running means, the
window's (`window/loss`, ...), `samples_per_s`, `input_wait`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin",
                "on_test_batch_end", "on_predict_batch_begin", "on_predict_batch_end")


class Callback:
    """Base class: override the events you need. `model` and `params` are set by fit()."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: dict = {}

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict) -> None:
        self.params = params

    def on_train_begin(self, logs: dict | None = None) -> None: ...
    def on_train_end(self, logs: dict | None = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None: ...
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.on_batch_begin(batch, logs)  # Keras's older names, still routed as Keras does

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.on_batch_end(batch, logs)

    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_test_begin(self, logs: dict | None = None) -> None: ...
    def on_test_end(self, logs: dict | None = None) -> None: ...
    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None: ...
    def on_predict_begin(self, logs: dict | None = None) -> None: ...
    def on_predict_end(self, logs: dict | None = None) -> None: ...
    def on_predict_batch_begin(self, batch: int, logs: dict | None = None) -> None: ...
    def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None: ...

    def on_log(self, step: int, logs: dict) -> None:
        """At each log point (see the module docstring)."""


_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


def overrides(callback: Callback, hook: str) -> bool:
    """Whether a callback does something on `hook` (a method of its class or, as
    LambdaCallback sets them, of the object; or the hook's older Keras name)."""
    names = (hook, _ALIASES[hook]) if hook in _ALIASES else (hook,)
    return any(name in vars(callback) or getattr(type(callback), name, None) is not getattr(
        Callback, name) for name in names)


class CallbackList:
    """Calls every callback's hook in order; knows whether any wants batch events."""

    def __init__(self, callbacks: Sequence[Callback], model: Any = None,
                 params: dict | None = None) -> None:
        from podkit.errors import ConfigError

        if not isinstance(callbacks, list | tuple):
            raise ConfigError(f"callbacks={callbacks!r} must be a list of pk.callbacks objects.")
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise ConfigError(f"callbacks must be pk.callbacks.Callback objects (e.g. "
                                  f"pk.callbacks.EarlyStopping()), got {cb!r}.")
        self.callbacks = list(callbacks)
        self.model = model
        for cb in self.callbacks:
            if model is not None:
                cb.set_model(model)
            cb.set_params(dict(params or {}))
        self.wants = {hook: any(overrides(cb, hook) for cb in self.callbacks)
                      for hook in _BATCH_HOOKS}

    @property
    def stop_training(self) -> bool:
        return bool(getattr(self.model, "stop_training", False))

    def call(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    def __getattr__(self, hook: str) -> Any:
        if not hook.startswith("on_"):
            raise AttributeError(hook)
        return lambda *args: self.call(hook, *args)


class History(Callback):
    """Per-epoch means, as Keras's History: `history.history["loss"][epoch]`."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.history, self.epoch = {}, []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)
