"""Variable-length sequences (issue 22): batches whose length varies (padded_batch without
padded_shapes, bucket_by_sequence_length, generators) train; each new length bucket compiles
once, reported as such; a model that needs one length says how to give it one."""

import numpy as np
import pytest

import podkit as pk
from podkit.errors import InputError

V = 50


def _sequences(n=1024, seed=0):
    """Token sequences of 3-39 ids; the label: does id 7 or 11 occur (a structure an LSTM
    must find anywhere in the sequence)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(2, V, size=int(rng.integers(3, 40))).astype(np.int32)
        out.append((ids, np.int32((ids == 7).any() or (ids == 11).any())))
    return out


def _dataset(data):
    spec = (pk.data.TensorSpec((None,), "int32"), pk.data.TensorSpec((), "int32"))
    return pk.data.Dataset.from_generator(lambda: iter(data), output_signature=spec)


def _classifier(**compile_args):
    model = pk.Sequential([pk.layers.Embedding(V, 16, mask_zero=True), pk.layers.LSTM(32),
                           pk.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
                  **compile_args)
    return model


def test_an_lstm_learns_from_padded_batches_of_varying_length_in_a_few_programs():
    # a new length is no unexpected recompile; one batch per call, so that each length's
    # program is seen (with several, one call stacks batches padded to one length)
    model = _classifier(strict_recompiles=True, steps_per_execution=1)
    train, test = _sequences(), _sequences(256, seed=1)
    history = model.fit(_dataset(train).padded_batch(32), epochs=5, verbose=0)
    assert history.history["accuracy"][-1] > 0.9
    assert model.evaluate(_dataset(test).padded_batch(32), verbose=0,
                          return_dict=True)["accuracy"] > 0.85
    # The first batch's length, then the bucket every later batch is padded to (a power of
    # two): two programs for 32 batches of lengths up to 39.
    assert model.trace_count["train"] <= 3
    assert model.recompiles.events and all(e.length for e in model.recompiles.events)
    assert "a new input length" in str(model.recompiles.events[0])


def test_a_bucketed_pipeline_compiles_once_per_bucket():
    model = _classifier()
    ds = _dataset(_sequences(512)).bucket_by_sequence_length(
        lambda ids, label: len(ids), bucket_boundaries=[10, 20, 30],
        bucket_batch_sizes=[16, 16, 16, 16])
    model.fit(ds, epochs=2, verbose=0)
    # Lengths padded to each batch's longest, then to a power of two: 8, 16, 32, 64 at most,
    # plus the first batch's own length.
    assert model.trace_count["train"] <= 5


def test_a_model_that_needs_one_length_says_how_to_give_it_one():
    model = pk.Sequential([pk.layers.Embedding(V, 4), pk.layers.Flatten(), pk.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(InputError, match="padded_shapes"):
        model.fit(_dataset(_sequences(256)).padded_batch(8), verbose=0)  # lengths vary


def test_a_functional_model_declares_a_varying_length_with_none(tmp_path):
    inputs = pk.Input((None,), dtype="int32")
    h = pk.layers.Embedding(V, 16, mask_zero=True)(inputs)
    h = pk.layers.Bidirectional(pk.layers.GRU(16, return_sequences=True))(h)
    outputs = pk.layers.Dense(1, activation="sigmoid")(pk.layers.GlobalAveragePooling1D()(h))
    model = pk.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(_dataset(_sequences(512)).padded_batch(32), epochs=2, verbose=0)
    text = model.summary(print_fn=lambda _: None)
    assert "(None, None, 32)" in text and "global_average_pooling1d" in text
    model.save(tmp_path / "m")
    again = pk.models.load_model(tmp_path / "m")
    x = np.zeros((8, 13), np.int32)
    x[:, :5] = 7
    np.testing.assert_allclose(again.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-6)
    with pytest.raises(pk.errors.ConfigError, match="Flatten .* needs fixed dims"):
        pk.layers.Flatten()(pk.Input((None, 4)))
