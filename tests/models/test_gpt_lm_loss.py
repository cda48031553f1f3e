"""The GPT's training loss on lazy logits: the same losses, accuracy and evaluation as whole
logits, less temporary memory in the compiled train step, and whole logits everywhere but the
train step (predict, model(x), generate)."""

import dataclasses
import re

import numpy as np
from gpt_common import SEQ, SMALL, VOCAB, compile_train_step, fit_history, gpt_model, tokens

import podkit as pk
from podkit.config import GPTConfig
from podkit.kernels.cross_entropy import LMLogits


def test_the_chunked_loss_cuts_the_train_steps_temporary_memory():
    """Where logits dominate (vocab 8192, 256 tokens a sequence): the whole logits against
    chunks of 1024. Chunked, no (tokens, vocab) array is left in the compiled step at all."""
    vocab, seq = 8192, 256
    config = GPTConfig(layers=1, heads=2, embed=64, mlp=128, sample_tokens=0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (4, seq)).astype(np.int32)
    y = rng.integers(0, vocab, (4, seq)).astype(np.int32)

    def compiled(chunk):
        model = gpt_model(dataclasses.replace(config, vocab_chunk=chunk), vocab=vocab, seq=seq,
                          metrics=["accuracy"])
        return compile_train_step(model, x, y)[0]

    whole, chunked = compiled(0), compiled(1024)
    temp = {k: c.memory_analysis().temp_size_in_bytes for k, c in
            (("whole", whole), ("chunked", chunked))}
    logits = 4 * seq * vocab * 4
    print(f"\ntrain step temporary memory, logits {logits / 2**20:.0f} MiB: whole logits "
          f"{temp['whole'] / 2**20:.1f} MiB, chunks of 1024 {temp['chunked'] / 2**20:.1f} MiB")
    assert temp["whole"] > logits
    assert temp["chunked"] < temp["whole"] / 3
    tokens_by_vocab = re.compile(rf"\[(4,{seq}|{4 * seq}),{vocab}\]")  # (4, 256, V), (1024, V)
    assert tokens_by_vocab.search(whole.as_text())
    assert not tokens_by_vocab.search(chunked.as_text())


def test_chunked_training_gives_the_losses_and_metrics_of_whole_logits():
    """Three steps each: the loss, the chunked accuracy and top-k (on materialized logits)."""
    vocab = 256
    x, y = tokens(8, vocab=vocab)
    config = dataclasses.replace(SMALL, vocab_chunk=48)  # 6 chunks of 43: padded
    runs = {}
    for name, c, loss in [
        ("chunked", config, None),
        ("whole", dataclasses.replace(config, vocab_chunk=0), None),
        ("loss_chunk_100", config,
         pk.losses.SparseCategoricalCrossentropy(from_logits=True, vocab_chunk=100)),
    ]:
        model = gpt_model(c, vocab=vocab, loss=loss,
                          metrics=["accuracy", pk.metrics.SparseTopKCategoricalAccuracy(k=3)])
        runs[name] = fit_history(model, x, y)
    want = runs["whole"]
    assert want["loss"][-1] < want["loss"][0]
    for name, got in runs.items():
        for key in want.keys() - {"input_wait"}:  # a timing
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=f"{name}: {key}")


def test_lazy_logits_only_in_the_train_step():
    """predict, evaluate, model(x) and generate see the whole logits, as before."""
    from podkit.models.gpt import generate

    model = gpt_model(dataclasses.replace(SMALL, vocab_chunk=16))
    x, y = tokens(4)
    fit_history(model, x, y, steps=1)
    out = model.predict(x, batch_size=4, verbose=0)
    assert out.shape == (4, SEQ, VOCAB) and out.dtype == np.float32
    module = model.module()
    assert module.lazy_logits is False and not isinstance(module(x), LMLogits)
    np.testing.assert_allclose(out, module(x), rtol=1e-5, atol=1e-6)
    module.train(lazy_logits=True)
    lazy = module(x)
    assert isinstance(lazy, LMLogits) and lazy.chunk == 16
    np.testing.assert_allclose(lazy.materialize(), out, rtol=1e-5, atol=1e-6)
    sample = generate(model, [1, 2, 3], 5)
    assert len(sample) == 5 and all(0 <= t < VOCAB for t in sample)
