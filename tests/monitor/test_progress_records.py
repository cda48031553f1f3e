"""The progress bar says "compiling" until the first step is done and takes its ETA from the
measured step time; a finished run's records stay as they were when it is run again."""

import io
import json

import numpy as np

import podkit as pk
from podkit.monitor.progress import ProgbarLogger


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_bar_says_compiling_first_then_an_eta_from_the_step_time():
    stream = Terminal()
    bar = ProgbarLogger(stream)
    bar.set_params({"epochs": 1, "steps": 100, "verbose": 1})
    bar.on_epoch_begin(0)
    assert "0/100" in stream.getvalue() and "compiling" in stream.getvalue()
    bar.on_log(10, {"steps_in_epoch": 10, "loss": 1.0, "samples_per_s": 64.0,
                    "telemetry/step_time_s": 2.0})
    assert "ETA 3:00" in stream.getvalue()  # 90 steps left at 2 s each
    bar.on_epoch_begin(1)
    assert stream.getvalue().count("compiling") == 1  # the first epoch only


def test_a_finished_run_keeps_its_records_when_run_again(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 4)).astype(np.float32)
    y = rng.integers(0, 2, 128)

    def run():
        model = pk.Sequential([pk.layers.Dense(8, activation="relu"), pk.layers.Dense(2)])
        model.compile(optimizer="adam", metrics=["accuracy"],
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=32, epochs=2, verbose=0, run_dir=tmp_path / "run",
                  checkpoint=tmp_path / "run" / "checkpoints")

    run()
    files = ("metrics.jsonl", "final.json", "recompiles.json")
    before = {f: (tmp_path / "run" / f).read_text() for f in files}
    assert json.loads(before["final.json"])["loss"] > 0
    events = sorted((tmp_path / "run" / "tensorboard").iterdir())
    run()  # resumes at its end: nothing left to train
    assert {f: (tmp_path / "run" / f).read_text() for f in files} == before
    assert sorted((tmp_path / "run" / "tensorboard").iterdir()) == events  # no empty file


def test_a_bar_among_the_callbacks_replaces_fits_and_counts_the_runs_steps(monkeypatch):
    """podkit train's bar for a step-based run: given among the callbacks it is the only
    bar (as in Keras); it counts the run's steps to total_steps from the resumed step, across
    epochs of another length."""
    from podkit import callbacks as callbacks_lib
    from podkit.monitor import progress

    stream = Terminal()
    bar = ProgbarLogger(stream, total_steps=70, initial_step=20)
    cbs = callbacks_lib.CallbackList([bar], add_progbar=True, epochs=2, steps=50, verbose=1)
    assert [cb for cb in cbs if isinstance(cb, ProgbarLogger)] == [bar]
    bar.on_epoch_begin(0)
    assert "\r20/70 [" in stream.getvalue() and "compiling" in stream.getvalue()
    bar.on_log(30, {"steps_in_epoch": 30, "loss": 1.0, "telemetry/step_time_s": 1.0})
    assert "\r30/70 [==========..............] ETA 0:40" in stream.getvalue()
    bar.on_epoch_end(0, {"loss": 1.0})
    bar.on_epoch_begin(1)
    bar.on_log(70, {"steps_in_epoch": 20, "loss": 0.5})
    bar.on_epoch_end(1, {"loss": 0.5})
    assert stream.getvalue().endswith("\r70/70 [========================] 0:00 - loss: "
                                      "0.5000\x1b[K\n")
    # Off a terminal: the window of a resumed run's first line starts at its step.
    monkeypatch.setattr(progress, "QUIET_LINE_S", 0.0)
    log = io.StringIO()
    quiet = ProgbarLogger(log, total_steps=70, initial_step=20)
    quiet.set_params({"epochs": 2, "steps": 50, "verbose": 1})
    quiet.on_epoch_begin(0)
    quiet.on_log(30, {"steps_in_epoch": 30, "loss": 1.0, "window/loss": 1.0})
    assert "  30/70 0:00 - loss: 1.0000 (steps 21-30)" in log.getvalue(), log.getvalue()
