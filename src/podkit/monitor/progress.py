"""A Keras-like progress bar: step/total, loss and metrics, throughput, ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from podkit.train.hooks import Callback


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


class ProgbarLogger(Callback):
    """Keras's progress bar: redraws one line per epoch on a terminal, prints one line per
    epoch elsewhere (and with verbose=2). fit() adds it for verbose 1, 2 and "auto"."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream or sys.stdout
        self._t0 = time.perf_counter()

    def set_params(self, params: dict) -> None:
        super().set_params(params)
        self.epochs, self.steps = params.get("epochs", 1), params.get("steps") or 0
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.live = is_tty and params.get("verbose", 1) == 1

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._t0 = time.perf_counter()
        if self.live:
            self.stream.write(f"Epoch {epoch + 1}/{self.epochs}\n")

    def on_log(self, step: int, logs: dict) -> None:
        if not self.live:
            return
        done = logs["steps_in_epoch"]
        elapsed = time.perf_counter() - self._t0
        eta = elapsed / max(done, 1) * max(self.steps - done, 0)
        width = 24
        filled = min(width, int(width * done / max(self.steps, 1)))
        bar = "=" * filled + ("." * (width - filled))
        self.stream.write(
            f"\r{done}/{self.steps} [{bar}] ETA {_fmt_time(eta)} - {_metrics(logs)}"
            f" - {logs['samples_per_s']:,.0f} samples/s\x1b[K"
        )
        self.stream.flush()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        elapsed = time.perf_counter() - self._t0
        head = (
            f"\r{self.steps}/{self.steps} [{'=' * 24}]"
            if self.live
            else f"Epoch {epoch + 1}/{self.epochs}"
        )
        clear = "\x1b[K" if self.live else ""
        self.stream.write(f"{head} {_fmt_time(elapsed)} - {_metrics(logs or {})}{clear}\n")
        self.stream.flush()


def _metrics(logs: dict) -> str:
    keys = [k for k in logs if k not in ("epoch", "steps_in_epoch", "samples_per_s", "step")
            and "/" not in k]
    return " - ".join(f"{k}: {logs[k]:.4f}" for k in keys)


def summary_line(what: str, seconds: float, logs: dict) -> str:
    """One line after evaluate() or predict(): what ran, how long, the results."""
    parts = [f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}" for k, v in logs.items()]
    return f"{what} {_fmt_time(seconds)} - " + " - ".join(parts)
