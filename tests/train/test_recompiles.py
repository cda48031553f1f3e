"""Every compile of a step after the first is counted and explained (podkit.train.recompiles):
which argument's shape or dtype changed, at which call; a warning after a configurable number;
an error in strict mode, raised before anything runs."""

import warnings

import numpy as np
import pytest

import podkit as pk
from podkit.errors import RecompileError
from podkit.train.recompiles import RecompileWarning


def _model(**compile_args):
    model = pk.Sequential([pk.Input((8,)), pk.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse", **compile_args)
    return model


def _x(n=32, dtype=np.float32):
    return np.random.default_rng(0).standard_normal((n, 8)).astype(dtype)


def test_predict_on_a_new_batch_size_reports_one_recompile_with_its_cause():
    model = _model()
    model.predict(_x(), batch_size=16, verbose=0)
    model.predict(_x(), batch_size=16, verbose=0)
    assert model.recompiles.events == []
    model.predict(_x(), batch_size=8, verbose=0)
    (event,) = model.recompiles.events
    assert event.kind == "predict" and event.context == "predict() call 3"
    assert event.changes == ("the row ids of the batches: int32[1,16] -> int32[1,8] (the "
                             "batch size changed from 16 to 8)",)
    assert "predict step at predict() call 3" in str(event)


def test_fit_on_a_new_input_dtype_reports_the_argument_and_the_call():
    model = _model()
    x = _x()
    y = np.zeros((32, 4), np.float32)
    model.fit(x, y, batch_size=16, verbose=0)
    model.fit(x, y, batch_size=16, verbose=0)  # a second fit compiles nothing
    assert model.recompiles.events == []
    model.fit(x.astype(np.int32), y, batch_size=16, verbose=0)
    events = [e for e in model.recompiles.events if e.kind == "train"]
    assert len(events) == 1
    assert events[0].context == "fit() call 3"
    assert any("float32" in c and "int32" in c and "x" in c for c in events[0].changes), \
        events[0].changes


def test_a_short_last_execution_is_explained_and_evaluation_pads_it_instead():
    model = _model(steps_per_execution=3)
    x, y = _x(64), np.zeros((64, 4), np.float32)
    model.fit(x, y, batch_size=8, verbose=0)  # 8 steps: executions of 3, 3 and 2
    (event,) = model.recompiles.events
    assert event.changes == ("the row ids of the batches: int32[3,8] -> int32[2,8] (2 steps "
                             "in this execution instead of 3: steps_per_execution does not divide "
                             "the epoch's steps)",)
    model.evaluate(x, y, batch_size=8, verbose=0)  # the short one is padded: one program
    model.predict(x, batch_size=8, verbose=0)
    assert [e.kind for e in model.recompiles.events] == ["train"]
    assert model.predict(x, batch_size=8, verbose=0).shape == (64, 4)


def test_strict_mode_raises_before_the_step_runs():
    model = _model(strict_recompiles=True)
    model.predict(_x(), batch_size=16, verbose=0)
    with pytest.raises(RecompileError, match=r"predict step at predict\(\) call 2: .*16.* -> "
                                             r".*8.*Fix: call predict\(\) with one batch size"):
        model.predict(_x(), batch_size=8, verbose=0)
    before = model.state.step
    assert int(model.state.step) == int(before)  # the state is whole (nothing was donated)


def test_a_warning_lists_the_recompiles_after_the_configured_number():
    model = _model(recompile_warning_after=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (32, 16, 8, 4):
            model.predict(_x(), batch_size=batch, verbose=0)
    found = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(found) == 1  # once, when the count reaches 2
    assert "compiled again 2 times" in str(found[0].message)
    assert len(model.recompiles.events) == 3


def test_the_warning_points_at_the_users_line():
    model = _model(recompile_warning_after=1)
    model.predict(_x(), batch_size=16, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.predict(_x(), batch_size=8, verbose=0)
    (found,) = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert found.filename == __file__ and "compiled again once" in str(found.message)


def test_a_refused_recompile_is_neither_counted_nor_the_next_baseline():
    model = _model(strict_recompiles=True)
    model.predict(_x(), batch_size=16, verbose=0)
    with pytest.raises(RecompileError):
        model.predict(_x(), batch_size=8, verbose=0)
    assert model.trace_count["predict"] == 1 and not model.recompiles.events
    with pytest.raises(RecompileError, match=r"\[1,16\] -> int32\[1,4\]"):  # still against 16
        model.predict(_x(), batch_size=4, verbose=0)
    assert "strict=True" in repr(model.recompiles)


def test_a_batch_size_and_dtype_change_are_both_named():
    from podkit.train.recompiles import explain

    (line,) = explain({"2.x": "float16[1,128,32]"}, {"2.x": "float32[1,100,32]"}, "train")
    assert line == ("x: float16[1,128,32] -> float32[1,100,32] (the batch size changed from "
                    "128 to 100; the dtype changed from float16 to float32)")


def test_a_bad_warning_count_is_refused_and_zero_is_off():
    with pytest.raises(pk.errors.ConfigError, match="recompile_warning_after=-1"):
        _model(recompile_warning_after=-1)
    with pytest.raises(pk.errors.ConfigError, match="strict_recompiles='yes'"):
        _model(strict_recompiles="yes")
    assert _model(recompile_warning_after=0).recompiles.warn_after is None


def test_a_new_sequence_length_is_named_and_its_fix_is_padding():
    # Token ids into a model that takes any length: each length is a program of its own, and
    # the fix is padding (or bucketing), not the batch size.
    model = pk.Sequential([pk.layers.Embedding(20, 4), pk.layers.GlobalAveragePooling1D(),
                           pk.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", recompile_warning_after=1)
    model.predict(np.zeros((4, 16), np.int32), verbose=0)
    with pytest.warns(RecompileWarning) as caught:
        model.predict(np.zeros((4, 24), np.int32), verbose=0)
    (event,) = model.recompiles.events
    assert event.changes == ("the arrays staged on the devices, x: int32[4,16] -> int32[4,24] "
                             "(the sequence length changed from 16 to 24)",)
    message = str(caught[0].message)
    assert "Fix: pad the sequences to one length" in message and "batch size" not in message
