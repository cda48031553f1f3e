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

    # -- what a callback declares to fit() (podkit's part of the protocol) ---------------------
    #: Keys this callback adds to the epoch's logs (fit() tells monitoring callbacks that
    #: they will exist, e.g. "learning_rate").
    adds_logs: tuple[str, ...] = ()

    def checkpoint_saver(self) -> Any:
        """A callback that saves checkpoints returns the `podkit.train.checkpointing.Saver`
        fit()'s loop drives for it (its manager, schedule, whether the run resumes from it);
        None for the others."""
        return None


_ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}


def overrides(callback: Callback, hook: str) -> bool:
    """Whether a callback does something on `hook` (a method of its class or, as
    LambdaCallback sets them, of the object; or the hook's older Keras name)."""
    names = (hook, _ALIASES[hook]) if hook in _ALIASES else (hook,)
    return any(name in vars(callback) or getattr(type(callback), name, None) is not getattr(
        Callback, name) for name in names)


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
