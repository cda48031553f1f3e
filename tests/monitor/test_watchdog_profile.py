"""The hang watchdog writes every thread's stack and the last completed step when no step
completes in time; profile_steps writes a JAX profiler trace of the chosen steps."""

import re
import time

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError


def _model(**compile_args):
    model = pk.Sequential([pk.layers.Dense(8, activation="relu"), pk.layers.Dense(2)])
    model.compile(optimizer="sgd", loss=pk.losses.SparseCategoricalCrossentropy(
        from_logits=True), **compile_args)
    return model


def _data(n=256):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 2, n)


class StallOnce(pk.callbacks.Callback):
    """Blocks the loop for `seconds` after batch 3: no step completes meanwhile."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        if batch == 3:
            stall_in_user_code(self.seconds)


def stall_in_user_code(seconds):
    time.sleep(seconds)


def test_a_stalled_step_writes_every_threads_stack_and_the_last_step(tmp_path, capsys):
    x, y = _data()
    # A limit well above a step's time on a loaded 2-core machine (at 1 s, a slow step under
    # a parallel test suite was reported as a stall of its own), and a stall well above it.
    _model().fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path, watchdog=3.0,
                 callbacks=[StallOnce(7.0)])
    dump = tmp_path / "watchdog-p0.txt"
    assert dump.exists()
    text = dump.read_text()
    # on_train_batch_end(batch=3) runs once the 4th step was dispatched; up to two
    # executions run ahead of those known to have finished
    assert "no step completed for" in text
    found = re.search(r"the last completed step is (\d)( \(steps up to (\d) were "
                      r"dispatched\))?\.", text)
    assert found, text[:300]
    done, dispatched = int(found.group(1)), int(found.group(3) or found.group(1))
    assert 2 <= done <= dispatched <= 4
    assert "stall_in_user_code" in text  # the main thread's stack shows where it waits
    main = re.search(r"the main thread, (Thread 0x[0-9a-f]+)", text).group(1)
    assert text.count(main) == 2  # named in the header, and its stack follows
    err = capsys.readouterr().err
    assert f"every thread's stack is in {dump}." in err
    assert err.count("podkit watchdog") == 1  # once per stall


def test_no_dump_when_steps_complete_in_time(tmp_path):
    x, y = _data()
    _model().fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path, watchdog=30)
    assert not (tmp_path / "watchdog-p0.txt").exists()


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_a_bad_watchdog_limit_is_refused(bad):
    x, y = _data()
    with pytest.raises(ConfigError, match="watchdog="):
        _model().fit(x, y, batch_size=16, verbose=0, watchdog=bad)


def test_profile_steps_write_a_trace_of_those_steps(tmp_path, capsys):
    x, y = _data()
    _model().fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path, profile_steps="3:5")
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert f"written under {tmp_path / 'profile'}" in capsys.readouterr().err


def test_profile_steps_inside_the_first_execution_are_traced(tmp_path, capsys):
    # 8 steps per call: steps 3-5 are in the first execution, which must be traced whole
    x, y = _data()
    _model(steps_per_execution=8).fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path,
                                      profile_steps="3:5")
    traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_profile_steps_past_the_end_of_the_run_say_so(tmp_path):
    x, y = _data()
    with pytest.warns(UserWarning, match="ended at step 16 before step 100; no profile"):
        _model().fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path,
                     profile_steps="100:200")
    assert not (tmp_path / "profile").exists()


@pytest.mark.parametrize("bad", [dict(log_every=0), dict(log_every=-3),
                                 dict(watchdog=float("nan")), dict(run_dir=123)])
def test_bad_fit_arguments_of_the_run_records_are_refused(tmp_path, bad):
    x, y = _data()
    name = next(iter(bad))
    with pytest.raises(ConfigError, match=f"{name}="):
        _model().fit(x, y, batch_size=16, verbose=0, **bad)


def test_a_run_dir_that_is_a_file_is_refused(tmp_path):
    x, y = _data()
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file; pass a directory"):
        _model().fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path / "f")


@pytest.mark.parametrize("bad", ["5:3", "0:2", "a:b", (1,)])
def test_bad_profile_steps_are_refused(tmp_path, bad):
    x, y = _data()
    with pytest.raises(ConfigError, match="profile_steps="):
        _model().fit(x, y, batch_size=16, verbose=0, run_dir=tmp_path, profile_steps=bad)


def test_progress_during_a_check_does_not_fire_the_stall_again():
    """The polling thread's check and the loop's progress race: a check that measured the
    silence before a step completed must not, once that progress re-armed the watchdog, report
    the stall that just ended as a second one (the launcher named it twice)."""
    import io
    import threading

    from podkit.monitor import watchdog as wd

    class StepDuringCheck(wd.Watchdog):
        race = False

        @property
        def _armed(self):  # read by check() after it measured the silence
            if self.race:
                self.race = False
                step = threading.Thread(target=self._progress, args=(2,))
                step.start()
                step.join(0.3)  # the loop's thread completes a step in the middle of the check
            return self.__dict__.get("armed", False)

        @_armed.setter
        def _armed(self, value):
            self.__dict__["armed"] = value

    dog = StepDuringCheck(0.5, stream=io.StringIO())
    dog._progress(1)
    dog._last -= 10.0  # ten seconds without a step: the first check fires
    dog.check()
    assert len(dog.dumps) == 1
    dog._last -= 10.0  # still stalled; a step completes during the next check
    dog.race = True
    dog.check()
    time.sleep(0.4)
    assert len(dog.dumps) == 1, "a stall that ended was reported a second time"
    assert dog._step == 2
