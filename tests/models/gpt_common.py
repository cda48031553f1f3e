"""What the GPT's tests share: a small config, token batches, a compiled pk.Model of it, and
its own compiled train step's memory and compile time."""

import time

import jax
import numpy as np

import podkit as pk
from podkit.config import GPTConfig
from podkit.models.gpt import build_gpt
from podkit.train.feeds.inputs import BatchInputs

SMALL = GPTConfig(layers=3, heads=2, embed=32, mlp=64, sample_tokens=0)
VOCAB, SEQ = 64, 16


def one_device():
    return pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1])


def tokens(rows, vocab=VOCAB, seq=SEQ, seed=0):
    x = np.random.default_rng(seed).integers(0, vocab, (rows, seq + 1)).astype(np.int32)
    return x[:, :-1], x[:, 1:]


def gpt_model(config=SMALL, vocab=VOCAB, strategy=None, metrics=None, seed=3, loss=None,
              seq=SEQ):
    with (strategy or one_device()).scope():
        model = build_gpt(config, {"vocab_size": vocab, "seq_len": seq}, seed=seed)
        model.compile(optimizer="adam", metrics=metrics,
                      loss=loss or pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit_history(model, x, y, steps=3):
    history = model.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0)
    return {k: np.array(v) for k, v in history.history.items()}


def build_abstract(model, x):
    """`model` built for inputs like `x` with its state left abstract (the layout's
    ShapeDtypeStructs): for a test of the layout or of a compiled step, which build()'s
    initializer, compiled and run on a thread, would only take the CPU from."""
    model.build_for(model._arch.input_spec(x[:1]), initial_state=lambda layout: layout.abstract)
    return model


def compile_train_step(model, x, y):
    """The model's own train step for one batch, compiled (not run): (compiled, seconds).
    Lowered on the state's abstract values (build_abstract)."""
    build_abstract(model, x)
    program = model._program
    ones = np.ones((1, len(x)), np.float32)
    lowered = program.train.lower(model.state, program.zeros(),
                                  BatchInputs(x[None], y[None], ones, ones))
    start = time.perf_counter()
    compiled = lowered.compile()
    return compiled, time.perf_counter() - start


def train_step(model, x, y):
    """(temporary bytes, compile seconds) of the model's own compiled train step."""
    compiled, seconds = compile_train_step(model, x, y)
    return compiled.memory_analysis().temp_size_in_bytes, seconds
