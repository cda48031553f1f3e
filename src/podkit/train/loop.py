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
        inflight: collections.deque = collections.deque()
        last = {"sums": {k: 0.0 for k in model._spec.sum_names()}, "samples": 0,
                "time": time.perf_counter(), "step": step}
        steps_in_epoch = samples = 0

        def report(entry: tuple, force: bool = False) -> None:
            ex_sums, ex_step, ex_steps_in_epoch, ex_samples = entry
            due_step = log_every is not None and ex_step // log_every > last["step"] // log_every
            due_time = log_every is None and time.perf_counter() - last["time"] > LIVE_LOG_S
            if not (force or due_step or due_time):
                return
            host = {k: float(v) for k, v in jax.device_get(ex_sums).items()}
            now = time.perf_counter()
            window = {k: host[k] - last["sums"][k] for k in host}
            entry_logs = {"epoch": epoch, "steps_in_epoch": ex_steps_in_epoch, **_means(host)}
            entry_logs.update({f"window/{k}": v for k, v in _means(window).items()})
            entry_logs["samples_per_s"] = (ex_samples - last["samples"]) / max(
                now - last["time"], 1e-9
            )
            last.update(sums=host, samples=ex_samples, time=now, step=ex_step)
            for cb in callbacks:
                cb.on_log(ex_step, entry_logs)

        for execution in feed.epoch(epoch):
            model.state, sums = train_step(model.state, sums, execution.inputs)
            steps_in_epoch += execution.steps
            samples += execution.samples
            step += execution.steps
            inflight.append((sums, step, steps_in_epoch, samples))
            if len(inflight) > IN_FLIGHT:
                oldest = inflight.popleft()
                jax.block_until_ready(oldest[0]["weight"])
                report(oldest)
        while len(inflight) > 1:
            report(inflight.popleft())
        if inflight:
            report(inflight.popleft(), force=log_every is None or step % log_every == 0)
        logs = {**_means({k: float(v) for k, v in jax.device_get(sums).items()})}
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
    fetch = _fetch_global
    out = np.concatenate([fetch(o).reshape(-1, *o.shape[2:]) for o in outs])
    mask = np.concatenate([fetch(m).reshape(-1) for m in masks]) > 0
    return out[mask]


def _fetch_global(array: jax.Array) -> np.ndarray:
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
