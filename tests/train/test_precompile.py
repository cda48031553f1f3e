"""Declared input specs compile ahead of time (model.precompile, as tf.function's
input_signature): batches of those shapes then compile nothing, and strict mode names what
differs from the declaration."""

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError, RecompileError


def _model(**compile_args):
    model = pk.Sequential([pk.Input((8,)), pk.layers.Dense(4)])
    model.compile(optimizer="sgd", loss=pk.losses.SparseCategoricalCrossentropy(
        from_logits=True), steps_per_execution=2, **compile_args)
    return model


def _batches(n=6, dtype=np.float32):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((16, 8)).astype(dtype), rng.integers(0, 4, 16))
            for _ in range(n)]


def test_declared_specs_compile_ahead_and_streamed_batches_reuse_them():
    model = _model(strict_recompiles=True)
    cost = model.precompile(jax.ShapeDtypeStruct((8,), np.float32),
                            jax.ShapeDtypeStruct((), np.int64), batch_size=16)
    assert cost.flops_per_step > 0
    counts = dict(model.trace_count)
    assert counts == {"train": 1, "evaluate": 1, "predict": 1}
    model.fit(_batches(), epochs=2, verbose=0)
    model.evaluate(_batches(), verbose=0)
    model.predict([(x,) for x, _ in _batches()], verbose=0)
    assert model.trace_count == counts  # nothing compiled again


def test_strict_mode_names_what_differs_from_the_declaration():
    model = _model(strict_recompiles=True)
    model.precompile(jax.ShapeDtypeStruct((8,), np.float32),
                     jax.ShapeDtypeStruct((), np.int64), batch_size=16)
    with pytest.raises(RecompileError, match=r"train step at fit\(\) call 1: x: "
                                             r"float32\[2,16,8\] -> int32\[2,16,8\]"):
        model.fit(_batches(dtype=np.int32), verbose=0)


def test_bad_declarations_are_refused():
    with pytest.raises(ConfigError, match="batch_size=0"):
        _model().precompile(jax.ShapeDtypeStruct((8,), np.float32), batch_size=0)
    with pytest.raises(ConfigError, match="is not a spec"):
        _model().precompile([8], batch_size=4)


def test_staged_data_after_a_declaration_is_a_program_of_its_own_not_a_recompile():
    # Arrays and a Dataset that only batches arrays are staged on the devices whole: their
    # step takes row ids, a different program from the streamed one declared, and its first
    # compile is not an unexpected recompile.
    model = _model(strict_recompiles=True)
    model.precompile(jax.ShapeDtypeStruct((8,), np.float32),
                     jax.ShapeDtypeStruct((), np.int64), batch_size=16)
    x = np.concatenate([b[0] for b in _batches()])
    y = np.concatenate([b[1] for b in _batches()])
    model.fit(pk.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True),
              verbose=0)
    model.evaluate(x, y, batch_size=16, verbose=0)
    assert not model.recompiles.events
