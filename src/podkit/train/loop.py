"""The loop: drives the compiled steps over a feed, and runs the callbacks at their intervals.

The host stays at most two executions ahead of the devices and never waits for the current
one: metrics are sums on the device, fetched from an execution that has already finished.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from podkit.train.step import zero_sums

if TYPE_CHECKING:
    from podkit.model import Model
    from podkit.train.hooks import Callback

IN_FLIGHT = 2  # executions queued on the devices before the host waits for the oldest
LIVE_LOG_S = 0.25  # progress refresh when no log_every is set


def _means(sums: dict[str, float]) -> dict[str, float]:
    weight = max(sums["weight"], 1e-12)
    return {k: v / weight for k, v in sums.items() if k != "weight"}


class _LogPoints:
    """Decides when an execution is logged and turns its device sums into logs.

    Only executions that already finished are reported, so fetching their sums never waits.
    """

    def __init__(self, epoch: int, step: int, names: tuple[str, ...], log_every: int | None,
                 callbacks: list[Callback]) -> None:
        self.epoch, self.log_every, self.callbacks = epoch, log_every, callbacks
        self.sums = {k: 0.0 for k in names}
        self.samples, self.step, self.time = 0, step, time.perf_counter()
        self.input_wait = 0.0  # seconds the loop has waited for input, this epoch

    def due(self, step: int) -> bool:
        if self.log_every is not None:
            return step // self.log_every > self.step // self.log_every
        return time.perf_counter() - self.time > LIVE_LOG_S

    def report(self, sums: dict, step: int, steps_in_epoch: int, samples: int,
               input_wait: float = 0.0) -> None:
        host = {k: float(v) for k, v in jax.device_get(sums).items()}
        now = time.perf_counter()
        window = {k: host[k] - self.sums[k] for k in host}
        logs = {"epoch": self.epoch, "steps_in_epoch": steps_in_epoch, **_means(host)}
        logs.update({f"window/{k}": v for k, v in _means(window).items()})
        logs["samples_per_s"] = (samples - self.samples) / max(now - self.time, 1e-9)
        # Share of the window's wall time the loop spent waiting for its next input.
        logs["input_wait"] = min((input_wait - self.input_wait) / max(now - self.time, 1e-9), 1.0)
        self.sums, self.samples, self.step, self.time = host, samples, step, now
        self.input_wait = input_wait
        for cb in self.callbacks:
            cb.on_log(step, logs)


def fit_loop(
    model: Model,
    feed: Any,
    *,
    epochs: int,
    callbacks: list[Callback],
    validate: Any,
    log_every: int | None,
) -> None:
    train_step = model._steps["train"]
    sums_sharding = model.strategy.replicated()
    step = int(jax.device_get(model.state["step"]))
    for cb in callbacks:
        cb.on_train_begin()
    logs: dict[str, Any] = {}
    for epoch in range(epochs):
        for cb in callbacks:
            cb.on_epoch_begin(epoch)
        sums = zero_sums(model._spec, sums_sharding)
        epoch_start = time.perf_counter()
        points = _LogPoints(epoch, step, model._spec.sum_names(), log_every, callbacks)
        inflight: collections.deque = collections.deque()
        steps_in_epoch = samples = 0
        # input_wait: the loop's time blocked on the feed, counted only up to the time the
        # input pipeline itself was busy (a feed that waits on a device transfer is not the
        # pipeline starving the step).
        waited = 0.0
        source_start = feed.source_s
        executions = iter(feed.epoch(epoch))
        while True:
            t0 = time.perf_counter()
            execution = next(executions, None)
            waited += time.perf_counter() - t0
            if execution is None:
                break
            model.state, sums = train_step(model.state, sums, execution.inputs)
            steps_in_epoch += execution.steps
            samples += execution.samples
            step += execution.steps
            inflight.append((sums, step, steps_in_epoch, samples,
                             min(waited, feed.source_s - source_start)))
            if len(inflight) > IN_FLIGHT:
                oldest = inflight.popleft()
                jax.block_until_ready(oldest[0]["weight"])
                if points.due(oldest[1]):
                    points.report(*oldest)
        while inflight:
            entry = inflight.popleft()
            last = not inflight
            if points.due(entry[1]) or (last and log_every is None):
                points.report(*entry)
        epoch_s = time.perf_counter() - epoch_start
        logs = _means({k: float(v) for k, v in jax.device_get(sums).items()})
        logs["input_wait"] = min(waited, feed.source_s - source_start) / max(epoch_s, 1e-9)
        if validate is not None:
            logs.update({f"val_{k}": v for k, v in validate().items()})
        logs["step"] = step
        for cb in callbacks:
            cb.on_epoch_end(epoch, logs)
        logs.pop("step")
        if model.stop_training:
            break
    for cb in callbacks:
        cb.on_train_end(logs)


def eval_loop(model: Model, feed: Any) -> dict[str, float]:
    eval_step = model._steps["eval"]
    sums = zero_sums(model._spec, model.strategy.replicated())
    for execution in feed.epoch(0):
        sums = eval_step(model.state, sums, execution.inputs)
    return _means({k: float(v) for k, v in jax.device_get(sums).items()})


def predict_loop(model: Model, feed: Any) -> np.ndarray:
    predict_step = model._steps["predict"]
    outs, masks = [], []
    for execution in feed.epoch(0):
        out = predict_step(model.state, execution.inputs)
        outs.append(out)
        masks.append(execution.inputs["w"])
    out = np.concatenate([_fetch_global(o).reshape(-1, *o.shape[2:]) for o in outs])
    mask = np.concatenate([_fetch_global(m).reshape(-1) for m in masks]) > 0
    return out[mask]


def _fetch_global(array: jax.Array) -> np.ndarray:
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
