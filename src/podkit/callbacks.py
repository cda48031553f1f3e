"""Keras's callbacks: `pk.callbacks.EarlyStopping(...)` and the rest, same names, same arguments.

Where podkit differs, it refuses rather than warns: a monitored value the fit does not produce
is an error naming the values it does produce (Keras warns every epoch and carries on).

Over 500 lines on purpose: Keras's callback set and its CallbackList in one module, as
keras.callbacks exposes them.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from podkit import paths
from podkit.errors import ConfigError, user_stacklevel
from podkit.monitor.progress import ProgbarLogger
from podkit.train.checkpointing import Saver
from podkit.train.hooks import Callback, History, overrides

__all__ = [
    "BackupAndRestore", "CSVLogger", "Callback", "CallbackList", "EarlyStopping", "History",
    "LambdaCallback", "LearningRateScheduler", "ModelCheckpoint", "ProgbarLogger",
    "ReduceLROnPlateau", "TensorBoard", "TerminateOnNaN",
]


_BATCH_EVENTS = ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin",
                 "on_test_batch_end", "on_predict_batch_begin", "on_predict_batch_end")


class CallbackList:
    """Keras's CallbackList: calls each event on every callback, in order.

        CallbackList(user_callbacks, add_history=True, add_progbar=True, model=model)

    As Keras orders them: the given callbacks, then History, then the progress bar, so History
    and the bar see what callbacks add to the logs (the learning rate); a ProgbarLogger among
    the given callbacks is the bar (none is added), as in Keras. `wants[event]` says
    whether any callback does something on a batch event: the loop fetches batch logs (a
    device-to-host copy per execution) only then.
    """

    def __init__(self, callbacks: Sequence[Callback] | None = None, add_history: bool = False,
                 add_progbar: bool = False, model: Any = None, **params: Any) -> None:
        callbacks = [] if callbacks is None else callbacks
        if not isinstance(callbacks, list | tuple):
            raise ConfigError(f"callbacks={callbacks!r} must be a list of pk.callbacks objects.")
        for cb in callbacks:
            if not isinstance(cb, Callback):
                raise ConfigError(f"callbacks must be pk.callbacks.Callback objects (e.g. "
                                  f"pk.callbacks.EarlyStopping()), got {cb!r}.")
        self.callbacks = list(callbacks)
        self.history = History() if add_history else None
        if self.history is not None:
            self.callbacks.append(self.history)
        if add_progbar and not any(isinstance(cb, ProgbarLogger) for cb in self.callbacks):
            self.callbacks.append(ProgbarLogger())
        self.model = model
        if model is not None:
            for cb in self.callbacks:
                cb.set_model(model)
        self.set_params(params)
        self.wants = {event: any(overrides(cb, event) for cb in self.callbacks)
                      for event in _BATCH_EVENTS}

    def set_params(self, params: dict) -> None:
        for cb in self.callbacks:
            cb.set_params(dict(params))

    def __iter__(self) -> Any:
        return iter(self.callbacks)

    @property
    def stop_training(self) -> bool:
        return bool(getattr(self.model, "stop_training", False))

    def on_train_begin(self, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_train_begin(logs)

    def on_train_end(self, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_train_end(logs)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_train_batch_end(batch, logs)

    def on_test_begin(self, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_test_begin(logs)

    def on_test_end(self, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_test_end(logs)

    def on_test_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_test_batch_begin(batch, logs)

    def on_test_batch_end(self, batch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_test_batch_end(batch, logs)

    def on_predict_begin(self, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_predict_begin(logs)

    def on_predict_end(self, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_predict_end(logs)

    def on_predict_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_predict_batch_begin(batch, logs)

    def on_predict_batch_end(self, batch: int, logs: dict | None = None) -> None:
        for cb in self.callbacks:
            cb.on_predict_batch_end(batch, logs)

    def on_log(self, step: int, logs: dict) -> None:
        for cb in self.callbacks:
            cb.on_log(step, logs)


class MonitorCallback(Callback):
    """A callback that watches one logged value (`monitor`) for improvement."""

    def __init__(self, monitor: str = "val_loss", mode: str = "auto",
                 baseline: float | None = None, min_delta: float = 0.0) -> None:
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ConfigError(f"{type(self).__name__}(mode={mode!r}); valid values: 'auto', "
                              "'min', 'max'.")
        self.monitor, self.mode, self.baseline = monitor, mode, baseline
        self.min_delta = abs(min_delta)
        self.best: float | None = baseline
        self._sign: float | None = None  # +1: bigger is better, -1: smaller is

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Refuse a monitor the fit will not produce before the first step (fit() passes the
        keys it will log as params["metrics"])."""
        known = self.params.get("metrics")
        if known is not None and self.monitor not in known:
            self._missing(known)

    def _missing(self, known: Any) -> None:
        raise ConfigError(
            f"{type(self).__name__} monitors {self.monitor!r}, which this fit does not "
            f"produce; it produces {', '.join(sorted(known))}"
            + (" (val_ values need validation_data or validation_split)"
               if self.monitor.startswith("val_") else "") + ".")

    def _direction(self) -> float:
        if self.mode != "auto":
            return 1.0 if self.mode == "max" else -1.0
        name = self.monitor.removeprefix("val_")
        if name == "loss" or name.endswith("_loss"):
            return -1.0
        metric = getattr(self.model, "compiled_metrics", {}).get(name)
        if metric is None:
            raise ConfigError(f"{type(self).__name__} cannot tell whether {self.monitor!r} "
                              "should rise or fall; pass mode='max' or mode='min'.")
        return 1.0 if metric.direction == "up" else -1.0

    def _value(self, logs: dict | None) -> float | None:
        """The monitored value this epoch; None on an epoch without it (validation_freq)."""
        logs = logs or {}
        if self.monitor not in logs:
            if self.monitor in self.params.get("metrics", ()):
                return None
            self._missing(logs)
        if self._sign is None:
            self._sign = self._direction()
        return float(logs[self.monitor])

    def _is_improvement(self, value: float, reference: float | None) -> bool:
        if reference is None:
            return True
        return self._sign * (value - reference) > self.min_delta


class EarlyStopping(MonitorCallback):
    """Stop when `monitor` has not improved for `patience` epochs; optionally restore the
    weights of the best epoch at the end of training (as Keras 3: whenever training ends)."""

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0,
                 verbose: int = 0, mode: str = "auto", baseline: float | None = None,
                 restore_best_weights: bool = False, start_from_epoch: int = 0) -> None:
        super().__init__(monitor, mode, baseline, min_delta)
        self.patience, self.verbose = patience, verbose
        self.restore_best_weights, self.start_from_epoch = restore_best_weights, start_from_epoch
        self.wait = self.stopped_epoch = self.best_epoch = 0
        self.best_weights: list | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        self.wait = self.stopped_epoch = self.best_epoch = 0
        self.best, self.best_weights = self.baseline, None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        current = self._value(logs)
        if current is None or epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights, self.best_epoch = self.model.get_weights(), epoch
        self.wait += 1
        if self._is_improvement(current, self.best):
            self.best, self.best_epoch = current, epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._is_improvement(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.stopped_epoch > 0 and self.verbose > 0:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping")
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose > 0:
                print(f"Restoring model weights from the end of the best epoch: "
                      f"{self.best_epoch + 1}.")
            self.model.set_weights(self.best_weights)


class LearningRateScheduler(Callback):
    """`schedule(epoch, lr) -> new lr`, set at the start of each epoch (no recompile: the rate
    is optimizer state)."""

    adds_logs = ("learning_rate",)

    def __init__(self, schedule: Callable[[int, float], float], verbose: int = 0) -> None:
        super().__init__()
        if not callable(schedule):
            raise ConfigError(f"LearningRateScheduler(schedule={schedule!r}) needs a function "
                              "(epoch, lr) -> lr.")
        self.schedule, self.verbose = schedule, verbose

    def on_train_begin(self, logs: dict | None = None) -> None:
        _settable_learning_rate(self)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        optimizer = self.model.optimizer
        try:  # Keras calls schedule(epoch, lr), and schedule(epoch) for one-argument ones
            lr = self.schedule(epoch, optimizer.learning_rate)
        except TypeError:
            lr = self.schedule(epoch)
        if not isinstance(lr, int | float | np.floating) or not math.isfinite(lr):
            raise ConfigError(f"the schedule returned {lr!r} for epoch {epoch}; it must "
                              "return a finite float.")
        optimizer.learning_rate = float(lr)
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to {lr}.")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["learning_rate"] = self.model.optimizer.learning_rate


def _settable_learning_rate(callback: Callback) -> None:
    """Before the first step: a callback that sets the learning rate needs one it may set."""
    optimizer = callback.model.optimizer
    if optimizer.follows_schedule:
        raise ConfigError(
            f"{type(callback).__name__} sets the learning rate, but the optimizer follows the "
            f"schedule {optimizer.get_config().get('learning_rate')!r}: use one or the other "
            "(compile with a float learning rate for the callback, or drop the callback).")


class ReduceLROnPlateau(MonitorCallback):
    """Multiply the learning rate by `factor` when `monitor` stalls for `patience` epochs."""

    adds_logs = ("learning_rate",)

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10,
                 verbose: int = 0, mode: str = "auto", min_delta: float = 1e-4,
                 cooldown: int = 0, min_lr: float = 0.0) -> None:
        super().__init__(monitor, mode, None, min_delta)
        if not 0.0 < factor < 1.0:
            raise ConfigError(f"ReduceLROnPlateau(factor={factor!r}) must be in (0, 1).")
        self.factor, self.patience, self.verbose = factor, patience, verbose
        self.cooldown, self.min_lr = cooldown, min_lr
        self.wait = self.cooldown_counter = 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        _settable_learning_rate(self)
        self.best, self.wait, self.cooldown_counter = None, 0, 0

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        optimizer = self.model.optimizer
        if logs is not None:
            logs["learning_rate"] = optimizer.learning_rate
        current = self._value(logs)
        if current is None:
            return
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._is_improvement(current, self.best):
            self.best, self.wait = current, 0
            return
        if self.cooldown_counter > 0:
            return
        self.wait += 1
        if self.wait >= self.patience:
            old = optimizer.learning_rate
            if old > np.float32(self.min_lr):
                new = max(old * self.factor, self.min_lr)
                optimizer.learning_rate = new
                if logs is not None:
                    logs["learning_rate"] = new
                if self.verbose > 0:
                    print(f"\nEpoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to "
                          f"{new}.")
                self.cooldown_counter, self.wait = self.cooldown, 0


class CSVLogger(Callback):
    """One row per epoch: `epoch` and every logged value (sorted), as Keras. `filename` may
    be gs:// or s3:// (an object cannot be appended to: the file is kept on this machine and
    uploaded whole after every epoch)."""

    def __init__(self, filename: str | os.PathLike, separator: str = ",",
                 append: bool = False) -> None:
        super().__init__()
        self.filename, self.sep, self.append = os.fspath(filename), separator, append
        self.keys: list[str] | None = None
        self._file = None
        self._writer = None
        self._local = self.filename if not paths.is_url(self.filename) else None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if paths.is_url(self.filename):
            fd, self._local = tempfile.mkstemp(prefix="podkit-csv-", suffix=".csv")
            os.close(fd)
            if self.append and paths.exists(self.filename):
                with paths.open(self.filename, "rb") as src, open(self._local, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        exists = self.append and os.path.exists(self._local) and os.path.getsize(
            self._local) > 0
        os.makedirs(os.path.dirname(self._local) or ".", exist_ok=True)
        self._file = open(self._local, "a" if self.append else "w", newline="")
        self._writer, self.keys, self._header = None, None, not exists

    def _upload(self) -> None:
        if paths.is_url(self.filename):
            with open(self._local, "rb") as src, paths.open(self.filename, "wb") as dst:
                shutil.copyfileobj(src, dst)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if self.keys is None:
            self.keys = sorted(logs)
            self._writer = csv.DictWriter(self._file, fieldnames=["epoch", *self.keys],
                                          delimiter=self.sep)
            if self._header:
                self._writer.writeheader()
        self._writer.writerow({"epoch": epoch, **{k: logs.get(k, "NA") for k in self.keys}})
        self._file.flush()
        self._upload()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            if paths.is_url(self.filename):
                os.unlink(self._local)


class TerminateOnNaN(Callback):
    """Stop training as soon as a batch's loss is NaN or infinite (checked every execution)."""

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(loss):
            print(f"Batch {batch}: Invalid loss, terminating training")
            self.model.stop_training = True


class LambdaCallback(Callback):
    """Callbacks from functions: `LambdaCallback(on_epoch_end=lambda epoch, logs: ...)`."""

    def __init__(self, **hooks: Callable[..., Any]) -> None:
        super().__init__()
        for name, fn in hooks.items():
            if not name.startswith("on_") or not hasattr(Callback, name):
                raise ConfigError(f"LambdaCallback({name}=...): not a callback hook; hooks are "
                                  "on_epoch_begin, on_epoch_end, on_train_begin, on_train_end, "
                                  "on_train_batch_begin, on_train_batch_end, ...")
            if fn is not None:
                setattr(self, name, fn)


class TensorBoardNote(UserWarning):
    """TensorBoard(write_graph=True), Keras's default: podkit writes no graph."""


_graph_said = False


def _say_no_graph() -> None:
    global _graph_said
    if not _graph_said:
        _graph_said = True
        warnings.warn("podkit: TensorBoard writes no graph (write_graph=True is Keras's "
                      "default): a podkit model runs as a compiled XLA program, not the "
                      "TensorFlow graph TensorBoard's Graphs tab reads; model.compile_report() "
                      "shows the program. Scalars are written as Keras writes them. Pass "
                      "write_graph=False to leave this note out.", TensorBoardNote,
                      stacklevel=user_stacklevel())


class TensorBoard(Callback):
    """Scalars for TensorBoard, written with tensorboardX (no TensorFlow needed), as Keras:
    `log_dir/train` and `log_dir/validation`, tags `epoch_loss`, `epoch_accuracy`, ...,
    `epoch_learning_rate`; with `update_freq="batch"` or N, also `batch_loss`, ... every N
    batches (a device fetch per execution)."""

    def __init__(self, log_dir: str | os.PathLike = "logs", histogram_freq: int = 0,
                 write_graph: bool = True, write_images: bool = False,
                 write_steps_per_second: bool = False, update_freq: str | int = "epoch",
                 profile_batch: Any = 0, embeddings_freq: int = 0,
                 embeddings_metadata: Any = None) -> None:
        super().__init__()
        asked = {"histogram_freq": histogram_freq, "write_images": write_images,
                 "write_steps_per_second": write_steps_per_second,
                 "profile_batch": profile_batch, "embeddings_freq": embeddings_freq,
                 "embeddings_metadata": embeddings_metadata}
        unsupported = [k for k, v in asked.items() if v not in (None, 0, False)]
        if unsupported:
            raise ConfigError(f"TensorBoard({', '.join(unsupported)}=...): podkit writes "
                              "scalars only (no histograms, images, graphs or profiles).")
        if write_graph:  # Keras's default: said once per process, not an error
            _say_no_graph()
        if update_freq not in ("epoch", "batch") and not (
                isinstance(update_freq, int) and update_freq > 0):
            raise ConfigError(f"TensorBoard(update_freq={update_freq!r}); use 'epoch', "
                              "'batch' or a positive int.")
        self.log_dir = os.fspath(log_dir)
        paths.is_url(self.log_dir)  # a malformed URL (gs:/b, gcs://) is a ConfigError now
        self.update_freq = 1 if update_freq == "batch" else update_freq
        self._writers: dict[str, Any] = {}
        self._seen = 0
        # A gs:// or s3:// log_dir: the event files are written here and uploaded whole at
        # every epoch's end (through podkit.paths, with its retries), not by tensorboardX's
        # own object-store writers (no retries; GCS's uploads again when garbage collected).
        self._staging: str | None = None
        if self.update_freq != "epoch":  # only then does the loop fetch batch logs
            self.on_train_batch_end = self._batch_end  # type: ignore[method-assign]

    def _writer(self, which: str) -> Any:
        if which not in self._writers:
            from tensorboardX import SummaryWriter

            if paths.is_url(self.log_dir) and self._staging is None:
                self._staging = tempfile.mkdtemp(prefix="podkit-tensorboard-")
            self._writers[which] = SummaryWriter(os.path.join(self._staging or self.log_dir,
                                                              which))
        return self._writers[which]

    def _upload(self) -> None:
        if self._staging is None:
            return
        for root, _, files in os.walk(self._staging):
            for name in files:
                rel = os.path.relpath(os.path.join(root, name), self._staging)
                with open(os.path.join(root, name), "rb") as src, paths.open(
                        paths.join(self.log_dir, *rel.split(os.sep)), "wb") as dst:
                    shutil.copyfileobj(src, dst)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._seen = 0

    def _batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._seen += 1
        if self._seen % self.update_freq == 0:
            step = self.model.steps_trained if self.model is not None else self._seen
            for key, value in (logs or {}).items():
                self._writer("train").add_scalar(f"batch_{key}", value, step)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = dict(logs or {})
        if "learning_rate" not in logs:
            try:
                logs["learning_rate"] = self.model.optimizer.learning_rate
            except ConfigError:
                pass  # an optax transformation that does not expose its rate
        for key, value in logs.items():
            which, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            self._writer(which).add_scalar(f"epoch_{name}", float(value), epoch)
        for w in self._writers.values():
            w.flush()
        self._upload()

    def on_train_end(self, logs: dict | None = None) -> None:
        for w in self._writers.values():
            w.close()
        self._writers.clear()
        self._upload()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None


# -- checkpoints: Keras's two callbacks as faces of pk.checkpoint.CheckpointManager -------------
def _save_freq(owner: str, save_freq: Any) -> int | None:
    if save_freq == "epoch":
        return None
    if isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1:
        raise ConfigError(f"{owner}(save_freq={save_freq!r}): use 'epoch' or a positive "
                          "number of steps.")
    return save_freq


def _manager_for(owner: str, path: Any, every_steps: int | None, keep: int | None) -> Any:
    from podkit.checkpoint import CheckpointManager

    # Keras's filepath names a file or a pattern; podkit's names a directory: say so.
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    if text is not None and ("{" in text or text.endswith((".keras", ".h5"))):
        raise ConfigError(
            f"{owner}({text!r}): podkit writes a checkpoint *directory* (one step directory "
            "per save, all state, verified on restore), not a .keras/.h5 file or a name "
            "pattern; pass a directory such as 'runs/exp/best'.")
    return CheckpointManager.coerce(path if text is None else text, every_steps, keep,
                                    said=f"{owner}({path!r})")


def _keras_file(path: Any) -> str | None:
    """The path when it names Keras files (a `.keras`, `.h5` or `.weights.h5` name, or a
    pattern such as `ckpt/{epoch:02d}.keras`), else None (a podkit checkpoint directory)."""
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    return text if text is not None and text.endswith((".keras", ".h5")) else None


class ModelCheckpoint(MonitorCallback):
    """Keras's ModelCheckpoint, in two forms chosen by `filepath`.

    A Keras file name (`best.keras`, `w.weights.h5` with save_weights_only=True, or a pattern
    such as `ckpt/{epoch:02d}-{loss:.3f}.keras` filled from the epoch and its logs): as Keras,
    `model.save` / `model.save_weights` of that file at each save (Keras 3's files: Keras loads
    them). Any other path is a directory of podkit checkpoints: each save a whole,
    transactional checkpoint (`pk.checkpoint`: every array, the optimizer and the data
    position) that `fit(resume=DIR)` continues from; `save_weights_only=True` is refused there
    (a checkpoint is all state).

    save_best_only: save when `monitor` improves (a directory keeps only the best: keep=1);
    otherwise every epoch (`save_freq="epoch"`) or every N steps (`save_freq=N`).
    """

    def __init__(self, filepath: Any, monitor: str = "val_loss", verbose: int = 0,
                 save_best_only: bool = False, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: str | int = "epoch",
                 initial_value_threshold: float | None = None, keep: int | None = None) -> None:
        super().__init__(monitor=monitor, mode=mode, baseline=initial_value_threshold)
        self.filepath = _keras_file(filepath)
        if self.filepath is not None:
            self._keras_files(save_best_only, save_weights_only, save_freq, keep, verbose)
            return
        if save_weights_only:
            raise ConfigError("ModelCheckpoint(save_weights_only=True): podkit checkpoints "
                              "hold the whole training state; for weights alone call "
                              "model.save_weights(path) (for example from a LambdaCallback).")
        every = _save_freq("ModelCheckpoint", save_freq)
        if save_best_only and every is not None:
            raise ConfigError("ModelCheckpoint(save_best_only=True, save_freq=N): the best "
                              "is judged on epoch logs; use save_freq='epoch'.")
        self.save_best_only, self.verbose, self.save_freq = save_best_only, verbose, save_freq
        self.manager = _manager_for("ModelCheckpoint", filepath, every,
                                    keep if keep is not None else (1 if save_best_only else 3))
        self._saver: Any = None

    def _keras_files(self, save_best_only: bool, save_weights_only: bool, save_freq: Any,
                     keep: int | None, verbose: int) -> None:
        path = self.filepath or ""
        weights = path.endswith(".weights.h5")
        if save_weights_only and not weights:
            raise ConfigError(f"ModelCheckpoint({path!r}, save_weights_only=True): weights "
                              "go to a file ending in '.weights.h5' (Keras 3's rule).")
        if weights and not save_weights_only:
            raise ConfigError(f"ModelCheckpoint({path!r}): a '.weights.h5' file holds weights "
                              "only; pass save_weights_only=True, or name a '.keras' file.")
        if keep is not None:
            raise ConfigError(f"ModelCheckpoint({path!r}, keep={keep!r}): keep= counts podkit "
                              "checkpoint directories; a Keras file is overwritten (or named "
                              "by a pattern such as 'ckpt/{epoch:02d}.keras').")
        every = _save_freq("ModelCheckpoint", save_freq)
        self.save_best_only, self.save_weights_only = save_best_only, save_weights_only
        self.verbose, self.save_freq, self.manager = verbose, save_freq, None
        self._every, self._batches, self._saver = every, 0, None
        self._epoch = 0

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.save_best_only:
            super().on_train_begin(logs)

    def checkpoint_saver(self) -> Saver | None:
        """The saver fit()'s loop drives: it saves at the epoch end this callback asks for.
        None when this callback writes Keras files itself."""
        if self.filepath is not None:
            return None
        self._saver = Saver(self.manager, best_only=self.save_best_only)
        return self._saver

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch = epoch

    def needs_every_batch(self, role: str = "train") -> bool:
        # Keras files every N batches count batches: each must be seen.
        return role == "train" and self.filepath is not None and self._every is not None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.filepath is None or self._every is None:
            return
        self._batches += 1
        if self._batches % self._every == 0:
            self._save_file(self._epoch, logs)

    def _save_file(self, epoch: int, logs: dict | None) -> None:
        """Keras's save: the best only when `monitor` improved; the name filled from the
        epoch (1-based, as Keras's) and the logs."""
        logs = dict(logs or {})
        if self.save_best_only:
            value = self._value(logs)
            if value is None or not self._is_improvement(value, self.best):
                return
            self.best = value
        try:
            path = (self.filepath or "").format(epoch=epoch + 1, **logs)
        except (KeyError, IndexError, ValueError) as e:
            raise ConfigError(f"ModelCheckpoint({self.filepath!r}): the name pattern cannot "
                              f"be filled from the epoch and the logs ({', '.join(logs)}): "
                              f"{e!r}.") from e
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: saving model to {path}")
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.filepath is not None:
            if self.save_freq == "epoch":
                self._save_file(epoch, logs)
            return
        if self._saver is None or self.save_freq != "epoch":
            return
        if self.save_best_only:
            value = self._value(logs)
            if value is None or not self._is_improvement(value, self.best):
                return
            if self.verbose:
                print(f"\nEpoch {epoch + 1}: {self.monitor} improved from {self.best} to "
                      f"{value:.5f}, saving to {self.manager.directory}")
            self.best = value
        self._saver.requested = True


class BackupAndRestore(Callback):
    """Keras's BackupAndRestore: back up every epoch (or every `save_freq` steps) to
    `backup_dir`; a fit() that finds a backup there continues from it — the same epoch and
    step, the same data position — and the backup is deleted when training ends
    (`delete_checkpoint=True`). The same machinery as fit(checkpoint=...)."""

    def __init__(self, backup_dir: Any, save_freq: str | int = "epoch",
                 delete_checkpoint: bool = True, double_checkpoint: bool = False) -> None:
        super().__init__()
        every = _save_freq("BackupAndRestore", save_freq)
        self.save_freq, self.delete_checkpoint = save_freq, delete_checkpoint
        self.manager = _manager_for("BackupAndRestore", backup_dir, every,
                                    2 if double_checkpoint else 1)

    def checkpoint_saver(self) -> Saver:
        """The run resumes from this backup, saved every epoch or by its manager's schedule;
        no final save (Keras deletes the backup when training ends)."""
        return Saver(self.manager, every_epoch=self.save_freq == "epoch", resumes=True)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.delete_checkpoint:
            from podkit.cluster import is_lead_process

            self.manager.wait()
            if is_lead_process():
                self.manager.storage.delete_prefix("")
