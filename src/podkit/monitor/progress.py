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


# Off a terminal (a log file, CI, a pipe) a long epoch would print nothing until it ends: with
# verbose=1, a log point at least this many seconds after the last line printed gets a line of
# its own, with the metrics of the steps since the previous log point (the window).
QUIET_LINE_S = 15.0


class ProgbarLogger(Callback):
    """Keras's progress bar: redraws one line per epoch on a terminal, prints one line per
    epoch elsewhere (and with verbose=2). fit() adds it for verbose 1, 2 and "auto".

    Where Keras prints nothing off a terminal until the epoch ends, podkit (verbose=1) also
    prints a line every QUIET_LINE_S seconds, so a long epoch in a log shows its loss falling.

    `total_steps`: the bar counts the run's optimizer steps up to this many (a step-based
    run's `train.steps`, which `podkit train` passes), not each epoch's steps: its epochs are
    validation intervals, and the last one ends where the run does. Given among fit()'s
    callbacks, it replaces the bar fit() would add, as in Keras.
    """

    def __init__(self, stream: TextIO | None = None, total_steps: int | None = None,
                 initial_step: int = 0) -> None:
        super().__init__()
        self.stream = stream or sys.stdout
        self.total_steps, self.initial_step = total_steps, initial_step  # resumed at
        self._t0 = time.perf_counter()

    def set_params(self, params: dict) -> None:
        super().set_params(params)
        self.epochs = params.get("epochs", 1)
        self.steps = self.total_steps or params.get("steps") or 0
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.live = is_tty and params.get("verbose", 1) == 1
        self._stepped = False
        self.quiet_lines = not is_tty and params.get("verbose", 1) == 1
        self._last_line, self._prev_done = time.perf_counter(), None
        self._done = self.initial_step if self.total_steps else 0  # the count the bar shows
        self._rate: float | None = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._t0 = self._last_line = time.perf_counter()
        self._prev_done = None  # the epoch's start, once a log point says it
        if self.live:
            self.stream.write(f"Epoch {epoch + 1}/{self.epochs}\n")
            if not self._stepped:  # the first step compiles: no rate to promise yet
                start = self._done if self.total_steps else 0
                self.stream.write(f"\r{start}/{self.steps} [{'.' * 24}] compiling\x1b[K")
                self.stream.flush()

    def on_log(self, step: int, logs: dict) -> None:
        in_epoch = logs["steps_in_epoch"]
        done = step if self.total_steps else in_epoch
        if self._prev_done is None:  # the epoch's start, or where a resumed run began
            self._since = max(done - in_epoch, self._done if self.total_steps else 0)
            self._prev_done = self._since
        self._done = done
        if self.quiet_lines:
            now = time.perf_counter()
            if now - self._last_line >= QUIET_LINE_S:
                self._last_line = now
                window = {k.split("/", 1)[1]: v for k, v in logs.items()
                          if k.startswith("window/")}
                self.stream.write(
                    f"  {done}/{self.steps} {_fmt_time(now - self._t0)} - {_metrics(window)}"
                    f" (steps {self._prev_done + 1}-{done})\n")
                self.stream.flush()
        self._prev_done = done
        if not self.live:
            return
        self._stepped = True
        # The rate over completed steps (compiling excluded) when fit() measured it.
        step_s = logs.get("telemetry/step_time_s")
        if step_s is None:
            step_s = (time.perf_counter() - self._t0) / max(done - self._since, 1)
        eta = step_s * max(self.steps - done, 0)
        width = 24
        filled = min(width, int(width * done / max(self.steps, 1)))
        bar = "=" * filled + ("." * (width - filled))
        self._rate = logs.get("samples_per_s", self._rate)  # measured at most twice a second
        rate = f" - {self._rate:,.0f} samples/s" if self._rate is not None else ""
        self.stream.write(
            f"\r{done}/{self.steps} [{bar}] ETA {_fmt_time(eta)} - {_metrics(logs)}"
            f"{rate}\x1b[K"
        )
        self.stream.flush()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        elapsed = time.perf_counter() - self._t0
        done = self._done if self.total_steps else self.steps
        filled = min(24, int(24 * done / max(self.steps, 1)))
        head = (
            f"\r{done}/{self.steps} [{'=' * filled}{'.' * (24 - filled)}]"
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
