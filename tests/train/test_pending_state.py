"""A fresh state is initialized on a thread while fit() compiles its train step
(podkit.train.state.PendingState, Program.train_cost): the train step is traced and
compiled once, the state is whole wherever it is read, and an initializer that fails says so
from fit()."""

import logging
import threading

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.train.state import PendingState, TrainState


def _model(**compile_args):
    model = pk.Sequential([pk.layers.Dense(32, activation="relu"), pk.layers.Dense(4)])
    model.compile(optimizer="adam", loss=pk.losses.SparseCategoricalCrossentropy(
        from_logits=True), **compile_args)
    return model


def _data(n=64):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 8), dtype=np.float32), rng.integers(0, 4, n)


def _compiles(caplog, name="traced") -> list[tuple[str, str]]:
    """(message, thread name) of each compile of the jitted function `name`."""
    return [(r.getMessage(), r.threadName) for r in caplog.records
            if r.getMessage().startswith(f"Finished XLA compilation of jit({name})")]


def _wait_for_other_initializers() -> None:
    """An earlier test's model may still be initializing on its thread (a model built and never
    read); its compiles would land in this test's log (seen on CI: a second jit(init))."""
    for thread in threading.enumerate():
        if thread.name.startswith("podkit-init"):
            thread.join(timeout=120)


def test_the_first_fit_compiles_its_train_step_once_while_the_state_initializes(caplog):
    _wait_for_other_initializers()
    x, y = _data()
    model = _model(steps_per_execution=2)
    # globally: the context manager's setting is per thread, and the initializer has its own
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING):
            model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    finally:
        jax.config.update("jax_log_compiles", False)
    assert model.trace_count["train"] == 1
    # the loop compiled the step against the abstract state; the first real call ran that
    # executable (no second compile of the same program)
    assert len(_compiles(caplog)) == 1, _compiles(caplog)
    # the initializer compiled on its own thread, the train step on the caller's
    assert [t for _, t in _compiles(caplog, "init")] == ["podkit-init_0"]
    assert [t for _, t in _compiles(caplog)] == ["MainThread"]
    assert isinstance(model.state, TrainState) and int(model.state.step) == 8


def test_a_state_read_before_fit_is_the_whole_initialized_state():
    model = _model()
    model.build((8,))
    state = model.state  # waits for the initializer's thread
    assert isinstance(state, TrainState) and not isinstance(state, PendingState)
    assert int(state.step) == 0
    weights = model.get_weights()
    assert sorted(w.shape for w in weights) == [(4,), (8, 32), (32,), (32, 4)]
    assert max(np.abs(w).sum() for w in weights) > 0  # initialized, not zeros


def test_a_pending_state_reads_through_and_reports_its_initializers_error():
    abstract = jax.ShapeDtypeStruct((), np.int32)
    ok = PendingState(lambda: TrainState(step=1, params={}, opt_state=(), rest={}, rng={}),
                      abstract)
    assert ok.step == 1 and ok.abstract is abstract  # attributes read through, waiting

    def fail():
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while initializing")

    bad = PendingState(fail, abstract)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        bad.result()
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        _ = bad.params
