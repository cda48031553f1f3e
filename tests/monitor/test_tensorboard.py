"""fit(run_dir=...) writes TensorBoard event files beside metrics.jsonl, with the same values
(read back with TensorBoard's own event reader)."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import podkit as pk

TAGS = ["train/loss", "train/accuracy", "optimizer/learning_rate", "optimizer/grad_norm",
        "throughput/samples_per_s", "throughput/step_time_s", "throughput/mfu",
        "idle/device_idle", "idle/input_wait", "goodput/goodput", "goodput/compile_s",
        "compile/count", "compile/seconds", "compile/recompiles", "checkpoint/seconds",
        "validation/loss", "goodput/restore_s", "goodput_run/goodput",
        "goodput_run/startup_s", "goodput_run/productive_s"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 16)).astype(np.float32)
    y = (x.sum(1) > 0).astype(np.int32)
    model = pk.Sequential([pk.layers.Dense(16, activation="relu"), pk.layers.Dense(2)])
    model.compile(optimizer=pk.optimizers.Adam(0.01), metrics=["accuracy"], grad_norm=True,
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=32, epochs=2, validation_split=0.25, log_every=4, verbose=0,
              run_dir=path, checkpoint=path / "ckpt")
    return path


def _events(path):
    acc = EventAccumulator(str(path / "tensorboard"))
    acc.Reload()
    return acc


def test_the_event_files_hold_every_tag(run):
    tags = _events(run).Tags()["scalars"]
    missing = [t for t in TAGS if t not in tags]
    assert not missing, f"missing {missing}; have {sorted(tags)}"
    assert "memory/in_use_gib" not in tags  # CPU devices report no memory


def test_the_event_files_hold_what_metrics_jsonl_holds(run):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # TensorBoard gets the log points that carry the telemetry (at most twice a second of
    # device time, and each epoch's last); every log point has the loss, and the rates come
    # with the telemetry once a second of work is behind them (never a stale repeat).
    assert all("loss" in r for r in records if "val_loss" not in r)
    points = [r for r in records if "loss" in r and "goodput" in r]
    assert len(points) >= 2
    assert all("goodput" in r for r in records if "samples_per_s" in r)
    rated = [r for r in points if "mfu" in r]
    assert rated and len({r["samples_per_s"] for r in rated}) == len(rated)
    acc = _events(run)
    for key, tag in (("loss", "train/loss"), ("grad_norm", "optimizer/grad_norm"),
                     ("mfu", "throughput/mfu"), ("learning_rate", "optimizer/learning_rate")):
        events = {e.step: e.value for e in acc.Scalars(tag)}
        have = [r for r in points if key in r]
        assert [r["step"] for r in have] == sorted(events)
        for r in have:
            assert events[r["step"]] == pytest.approx(r[key], rel=1e-6)
    assert all(r["learning_rate"] == pytest.approx(0.01) for r in points)
    assert all(0 < r["mfu"] <= 1 and 0 <= r["device_idle"] <= 1 for r in rated)
    assert points[-1]["memory"] == "not reported by cpu devices"
    val = [r for r in records if "val_loss" in r]
    assert [e.value for e in acc.Scalars("validation/loss")] == pytest.approx(
        [r["val_loss"] for r in val])


def test_goodput_splits_the_run_time(run):
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if "goodput" in line][-1]
    parts = {k: last[f"time/{k}_s"] for k in ("productive", "compile", "restore",
                                               "checkpoint", "input", "validation", "other")}
    assert last["goodput"] == pytest.approx(parts["productive"] / sum(parts.values()))
    assert parts["compile"] > 0 and parts["productive"] > 0 and parts["checkpoint"] > 0
    assert last["compiles"] >= 1 and last["compile_s"] > 0


def test_the_run_account_across_restarts_starts_with_the_process(run):
    """A fresh run's account across restarts is its process's startup plus its loop's split
    (podkit.monitor.wall_time); the loop's own goodput leaves the startup out."""
    acc = _events(run)
    last = {tag: acc.Scalars(tag)[-1].value for tag in (
        "goodput_run/startup_s", "goodput_run/productive_s", "goodput/productive_s",
        "goodput_run/goodput", "goodput/goodput", "goodput_run/lost_s", "goodput_run/down_s")}
    assert last["goodput_run/productive_s"] == pytest.approx(last["goodput/productive_s"])
    assert last["goodput_run/startup_s"] > 0  # this test process's life before fit()
    assert last["goodput_run/goodput"] < last["goodput/goodput"]
    assert last["goodput_run/lost_s"] == 0 and last["goodput_run/down_s"] == 0
