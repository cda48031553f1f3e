"""The figures a log point adds beside loss and metrics: throughput over completed device work,
MFU, where the time went (goodput), compiles, checkpoints, memory, gradient norm and learning
rate. `MetricsLog` (podkit.train.instruments) asks for them at every log point; the run
directory writes them to metrics.jsonl and TensorBoard (podkit.monitor).

    telemetry = Telemetry(tokens_per_sample=1024, devices=mesh_devices, recompiles=lambda: 2)
    logs.update(telemetry.at_log_point(run, ex, steps, samples))   # keys "telemetry/..."

Rates divide by the time less compiling, restoring, validation and checkpoint stalls (the
devices' idle time the timeline attributes to them: goodput reports those), so the first
window's figures are the step's, not the compiler's, and a save does not read as slow steps;
and they span at least RATE_SPAN_S of that time (several log points when they come faster): a
finish time is noted by a Python thread, late by up to the interpreter's switch interval
(5 ms), which over a window of a few executions would be noise. MFU: the compiled train
program's FLOPs (podkit.train.flops) per second, over the devices' peak (podkit.hardware).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from podkit import hardware
from podkit.train import compiles
from podkit.train import step as step_lib
from podkit.train.timeline import LABELS

PREFIX = "telemetry/"
GIB = float(1 << 30)
RATE_SPAN_S = 1.0
EVERY_S = 0.5
"""The telemetry is computed at log points at least this far apart in device time; the log
points between carry loss and metrics only (a seed-sized step logs every 0.3 ms: computing
and writing ~30 figures each time would cost more than the step)."""


@dataclasses.dataclass(frozen=True)
class _Point:
    """Totals of a fit at one log point (what rates are differences of)."""

    working: float = 0.0  # seconds, less compile, validation and checkpoint stalls
    samples: int = 0
    steps: int = 0
    productive: float = 0.0  # seconds the devices were busy


@dataclasses.dataclass
class Telemetry:
    tokens_per_sample: int | None = None  # language models: tokens per sequence
    devices: Sequence[Any] = ()  # the mesh's devices (MFU's peak, memory)
    recompiles: Callable[[], int] | None = None  # this fit's recompiles so far
    _peak: float | None = None
    _peak_known: bool = False
    _mark: int = 0
    _started: bool = False
    _points: collections.deque = dataclasses.field(default_factory=collections.deque)
    _last_full: float | None = None
    _step_sums: Any = None
    _pending: list = dataclasses.field(default_factory=list)  # (steps, samples) not yet counted

    def begin(self) -> None:
        self._mark = compiles.mark()
        self._started = True
        self._points = collections.deque([_Point()])
        self._last_full, self._pending = None, []
        self.peak()  # measured now (once per machine on CPU), not inside a window

    def epoch_begin(self, start: dict | None) -> None:
        """The train step's own sums an epoch starts from (host values, None without them):
        the gradient norm is a mean since the previous full log point of the same epoch, or
        since its start; the learning rate is the one the point's step used."""
        self._step_sums = start

    def peak(self) -> float | None:
        """The devices' peak FLOP/s together (measured once on CPU, see podkit.hardware)."""
        if not self._peak_known:
            self._peak_known = True
            devices = list(self.devices)
            one = hardware.peak_flops(devices[0]) if devices else None
            self._peak = None if one is None else one.flops_per_s * len(devices)
        return self._peak

    def at_log_point(self, run: Any, ex: Any, steps: int, samples: int,
                     step_sums: dict | None = None) -> dict[str, Any]:
        """The figures of the window that ends with `ex` (`steps` and `samples` done in it):
        at most every EVERY_S of device time (and at an epoch's last execution), else none;
        the rates once RATE_SPAN_S of work is behind them. `step_sums`: the train step's own
        sums after `ex` on the host (podkit.train.step.STEP_SUMS), if it has them."""
        if not self._started:
            self.begin()
        self._pending.append((steps, samples))
        timeline = run.timeline
        # When the devices finished it, not when the host got to it: log points the host
        # reaches in a burst (executions retired together) are as far apart as their work.
        finished = timeline.finished(ex.timing)
        if self._last_full is not None and finished - self._last_full < EVERY_S and \
                not ex.last:
            return {}
        self._last_full = finished
        steps = sum(s for s, _ in self._pending)
        samples = sum(n for _, n in self._pending)
        self._pending = []
        out: dict[str, Any] = {}
        t0 = timeline.cursor
        split = timeline.window(finished)
        wall = max(finished - t0, 0.0)
        last = self._points[-1]
        if len(self._points) == 1 and timeline.first_dispatch is not None:
            # The first window: from the first dispatch (setup and compiling come before).
            working = finished - timeline.first_dispatch
        else:
            working = wall - split["compile"] - split["restore"] - split["validation"] - \
                split["checkpoint"]
        point = _Point(last.working + max(working, 0.0), last.samples + samples,
                       last.steps + steps, last.productive + split["productive"])
        self._points.append(point)
        # The newest earlier point at least RATE_SPAN_S of working time back (or the first).
        while len(self._points) > 2 and point.working - self._points[1].working >= RATE_SPAN_S:
            self._points.popleft()
        base = self._points[0]
        span = max(point.working - base.working, 1e-9)
        samples, steps = point.samples - base.samples, point.steps - base.steps
        # Rates need RATE_SPAN_S of work behind them (the first executions of a run are the
        # slowest); an epoch that ends sooner reports what it has.
        rated = span >= RATE_SPAN_S or ex.last
        if rated:
            out["samples_per_s"] = samples / span
        if rated and steps > 0:
            out[PREFIX + "step_time_s"] = span / steps
        if rated and self.tokens_per_sample:
            out[PREFIX + "tokens_per_s"] = samples * self.tokens_per_sample / span
        if rated:
            out[PREFIX + "device_idle"] = min(max(
                1.0 - (point.productive - base.productive) / span, 0.0), 1.0)
        cost = run.cost
        peak = self.peak() if rated and cost is not None and cost.flops > 0 else None
        if peak:
            rate = cost.flops_per_step * steps / span
            devices = list(self.devices)
            if rate > peak and hardware.observed(devices[0], rate / len(devices)):
                self._peak_known = False  # a CPU's peak measured under load, now raised
                peak = self.peak()
            out[PREFIX + "mfu"] = rate / peak
        totals = timeline.totals
        total = sum(totals.values())
        if total > 0:
            out[PREFIX + "goodput"] = totals["productive"] / total
        for label in ("productive", *LABELS, "other"):
            out[f"{PREFIX}time/{label}_s"] = totals[label]
        clock = compiles.seconds_since(self._mark)
        out[PREFIX + "compiles"] = clock["compiles"]
        out[PREFIX + "compile_s"] = clock["trace"] + clock["lower"] + clock["compile"]
        if self.recompiles is not None:
            out[PREFIX + "recompiles"] = self.recompiles()
        out[PREFIX + "checkpoint_s"] = totals["checkpoint"]
        out.update(self.memory())
        if step_sums is not None:
            host = step_sums
            if self._step_sums is not None:  # since the previous full point or epoch start
                window = {p: host[p] - self._step_sums[p] for p in self._step_sums}
                out.update({PREFIX + k: v for k, v in step_lib.step_results(
                    {step_lib.STEP_SUMS: window}).items()})
                # The rate this step used, not a mean (see step._execution_sums).
                now = step_lib.step_results({step_lib.STEP_SUMS: host}).get("learning_rate")
                if now is not None and PREFIX + "learning_rate" in out:
                    out[PREFIX + "learning_rate"] = now
            self._step_sums = host
        return out

    def memory(self) -> dict[str, Any]:
        """Live memory of the first device, where its platform reports it."""
        devices = list(self.devices)
        if not devices:
            return {}
        stats = hardware.memory_stats(devices[0])
        if not stats:
            return {PREFIX + "memory": f"not reported by {devices[0].platform} devices"}
        out = {}
        for key, name in (("bytes_in_use", "memory_in_use_gib"),
                          ("peak_bytes_in_use", "memory_peak_gib"),
                          ("bytes_limit", "memory_limit_gib")):
            if key in stats:
                out[PREFIX + name] = stats[key] / GIB
        return out
