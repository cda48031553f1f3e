"""compile(steps_per_execution="auto"), the default: the count podkit chooses, why, and that
nothing a user relies on changes with it (callbacks that need every batch see every batch)."""

import logging

import numpy as np
import pytest

import podkit as pk
from podkit.train import auto_steps
from podkit.train.auto_steps import choose


# -- the rule ---------------------------------------------------------------------------------
def test_small_steps_run_the_largest_divisor_of_the_epoch_up_to_the_bound():
    c = choose(steps=469, seconds_at_peak=1e-4)  # 469 = 7 x 67
    assert c.k == 67 and "67 divides the epoch's 469 steps" in c.why


def test_an_epoch_within_the_bound_is_one_call():
    assert choose(steps=60, seconds_at_peak=1e-3).k == 60
    assert choose(steps=1, seconds_at_peak=1e-3).k == 1


def test_the_time_bound_keeps_an_execution_to_a_few_seconds_of_the_peak():
    c = choose(steps=600, seconds_at_peak=0.2)  # 2 s / 0.2 s = 10; 10 divides 600
    assert c.k == 10 and "a step is 200 ms at the devices. peak" in c.why.replace("'", ".")
    assert choose(steps=600, seconds_at_peak=5.0).k == 1  # a step longer than the budget


def test_host_batches_bound_the_bytes_an_execution_stacks():
    c = choose(steps=1000, seconds_at_peak=1e-5, batch_bytes=40 << 20)  # 128 MiB / 40 MiB
    assert c.k == 2 and "MiB" in c.why  # 3 does not divide 1000; 2 does and is >= 3/4


def test_a_callback_that_needs_every_batch_gets_one_step_per_call():
    c = choose(steps=469, seconds_at_peak=1e-4, every_batch=("Counter",))
    assert c.k == 1 and "Counter" in c.why


def test_eager_models_get_one_step_per_call():
    assert choose(steps=469, seconds_at_peak=1e-4, jit=False).k == 1


def test_log_points_checkpoints_and_profiles_fall_between_executions():
    c = choose(steps=600, seconds_at_peak=1e-4, intervals=(("log_every", 50),))
    assert c.k == 50 and "log_every (50)" in c.why
    c = choose(steps=600, seconds_at_peak=1e-4,
               intervals=(("log_every", 50), ("every_steps", 75)))
    assert c.k == 25  # the largest count dividing both (and the epoch)
    assert choose(steps=4, seconds_at_peak=1e-4, intervals=(("every_steps", 3),)).k == 1
    assert choose(steps=None, seconds_at_peak=1e-4,
                  intervals=(("profile_steps", 30), ("profile_steps", 40))).k == 10


def test_without_a_good_divisor_the_bound_wins_unless_recompiles_are_strict():
    c = choose(steps=467, seconds_at_peak=1e-4)  # 467 is prime
    assert c.k == auto_steps.MAX_STEPS and "compiled once more" in c.why
    assert choose(steps=467, seconds_at_peak=1e-4, strict=True).k == 1


def test_an_unknown_length_runs_the_bound():
    assert choose(steps=None, seconds_at_peak=1e-4).k == auto_steps.MAX_STEPS
    assert choose(steps=None, seconds_at_peak=None).k == auto_steps.MAX_STEPS


# -- fit() with it ------------------------------------------------------------------------------
def _data(n=640):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def _model(**compile_kwargs):
    model = pk.Sequential([pk.layers.Dense(16, activation="relu"),
                           pk.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", **compile_kwargs)
    return model


def test_fit_without_steps_per_execution_chooses_and_says_why_once(capsys, caplog):
    x, y = _data()
    model = _model()
    assert model.steps_per_execution == 1  # nothing chosen before a fit
    with caplog.at_level(logging.INFO, logger="podkit"):
        model.fit(x, y, batch_size=32, epochs=2, verbose=2)
        model.fit(x, y, batch_size=32, epochs=1, verbose=2)
    # 20 steps an epoch, a tiny step: the whole epoch is one call
    assert model.steps_per_execution == 20
    lines = [r.getMessage() for r in caplog.records
             if "steps_per_execution='auto'" in r.getMessage()]
    assert lines == ["podkit: steps_per_execution='auto' runs 20 steps per device call: the "
                     "whole epoch (20 steps) in one call. Pass compile(steps_per_execution=k) "
                     "to choose."]
    assert capsys.readouterr().out.count("steps_per_execution='auto'") == 1
    # one program for the epoch: the second fit compiled nothing
    assert model.recompiles.counts["train"] == 1 and model.recompiles.events == []


def test_the_choice_trains_what_one_step_per_call_trains():
    x, y = _data()
    auto, one = _model(), _model(steps_per_execution=1)
    a = auto.fit(x, y, batch_size=32, epochs=3, verbose=0, shuffle=False)
    b = one.fit(x, y, batch_size=32, epochs=3, verbose=0, shuffle=False)
    assert auto.steps_per_execution == 20 and one.steps_per_execution == 1
    np.testing.assert_allclose(a.history["loss"], b.history["loss"], rtol=1e-5)
    for u, v in zip(auto.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_a_per_batch_callback_sees_every_batch():
    x, y = _data()
    seen = []
    model = _model()
    model.fit(x, y, batch_size=32, epochs=2, verbose=0,
              callbacks=[pk.callbacks.LambdaCallback(
                  on_train_batch_end=lambda batch, logs: seen.append(batch))])
    assert model.steps_per_execution == 1
    assert seen == list(range(20)) * 2
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # without it: chosen again
    assert model.steps_per_execution == 20


def test_an_explicit_count_is_kept():
    x, y = _data()
    model = _model(steps_per_execution=1)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert model.steps_per_execution == 1


def test_evaluate_predict_and_validation_run_one_step_per_call():
    x, y = _data()
    model = _model()
    seen = {}

    class Steps(pk.callbacks.Callback):  # reads the count, needs no batch
        def on_epoch_end(self, epoch, logs=None):
            seen["fit"] = self.model.steps_per_execution

    model.fit(x, y, batch_size=32, epochs=1, verbose=0, validation_data=(x[:96], y[:96]),
              callbacks=[Steps()])
    assert seen["fit"] == 20
    # the validation's program serves evaluate() on the same data: one step per call
    model.evaluate(x[:96], y[:96], batch_size=32, verbose=0)
    model.predict(x[:96], batch_size=32, verbose=0)
    model.predict(x[:96], batch_size=32, verbose=0)
    assert model.recompiles.events == []
    assert model.recompiles.counts["evaluate"] == model.recompiles.counts["predict"] == 1
    loss = model.evaluate(x[:96], y[:96], batch_size=32, verbose=0)
    one = _model(steps_per_execution=1)
    one.predict(x[:2], verbose=0)  # builds it
    one.set_weights(model.get_weights())
    assert loss == pytest.approx(one.evaluate(x[:96], y[:96], batch_size=32, verbose=0),
                                 rel=1e-6)
    np.testing.assert_allclose(model.predict(x[:50], batch_size=16, verbose=0),
                               one.predict(x[:50], batch_size=16, verbose=0), rtol=1e-6)
    assert model.steps_per_execution == 20  # the fit's choice, not evaluate's


def test_a_wrong_value_names_the_choices():
    with pytest.raises(pk.errors.ConfigError, match="'auto'"):
        _model(steps_per_execution="fast")
    with pytest.raises(pk.errors.ConfigError, match="positive int"):
        _model(steps_per_execution=0)


def test_the_compile_config_says_auto_and_keras_files_get_a_count():
    from podkit.interop.keras_compile import keras_compile_config

    model = _model()
    assert model.compile_config()["steps_per_execution"] == "auto"
    assert keras_compile_config(model.compile_config())["steps_per_execution"] == 1
