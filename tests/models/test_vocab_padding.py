"""The token table padded to `model.vocab_multiple` (issue 40): rows past the vocabulary are
no tokens (their logits are cut, never predicted, never in the loss), the padding is the
config's (the same on every mesh, so a run resumes anywhere), the model axis must divide it,
and the chunked loss reads a padded head as the whole logits."""

import dataclasses

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import podkit as pk
from podkit.config import GPTConfig, LlamaConfig
from podkit.kernels.cross_entropy import LMLogits, chunked_argmax, chunked_sparse_cross_entropy
from podkit.models.gpt import GPT
from podkit.models.llama import Llama

VOCAB, SEQ = 300, 8
GPT_SMALL = GPTConfig(layers=1, heads=2, embed=16, mlp=32, sample_tokens=0, vocab_chunk=64)
LLAMA_SMALL = LlamaConfig(layers=1, heads=2, kv_heads=1, embed=16, mlp=24, sample_tokens=0,
                          vocab_chunk=64, tie_embeddings=True)


@pytest.mark.parametrize("kind, config", [(GPT, GPT_SMALL), (Llama, LLAMA_SMALL)])
def test_padded_ids_are_never_logits(kind, config):
    with nnx.use_eager_sharding(False):  # a module alone, no mesh
        module = kind(config, VOCAB, SEQ, nnx.Rngs(0))
    assert module.tokens.shape == (384, 16)  # 300 up to a multiple of 128
    # Make every padded id's output weights huge: were they logits, they would win.
    if kind is GPT:
        module.head[...] = module.head[...].at[:, VOCAB:].set(1e3)
    else:
        module.tokens[...] = module.tokens[...].at[VOCAB:].set(1e3)
    x = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (2, SEQ)), jnp.int32)
    logits = module(x)
    assert logits.shape == (2, SEQ, VOCAB)
    assert int(jnp.argmax(logits, -1).max()) < VOCAB
    module.train(lazy_logits=True)
    lazy = module(x)
    assert isinstance(lazy, LMLogits) and lazy.shape == (2, SEQ, VOCAB)
    np.testing.assert_allclose(lazy.materialize(), logits, rtol=1e-6)
    assert int(lazy.argmax().max()) < VOCAB
    labels = x
    np.testing.assert_allclose(
        lazy.cross_entropy(labels),
        optax.softmax_cross_entropy_with_integer_labels(logits, labels), rtol=1e-5)


def test_the_chunked_loss_of_a_padded_head_is_the_cut_logits_loss_value_and_gradients():
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(12, 16)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(16, 128)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 100, (12,)), jnp.int32)

    def cut(h, w):
        return optax.softmax_cross_entropy_with_integer_labels((h @ w)[:, :100], labels).sum()

    def chunked(h, w):
        return chunked_sparse_cross_entropy(h, w, labels, 24, 100).sum()

    np.testing.assert_allclose(chunked(hidden, head), cut(hidden, head), rtol=1e-5)
    for got, want in zip(jax.grad(chunked, (0, 1))(hidden, head),
                         jax.grad(cut, (0, 1))(hidden, head), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    big = head.at[:, 100:].set(1e3)
    assert int(chunked_argmax(hidden, big, 24, 100).max()) < 100
    np.testing.assert_array_equal(chunked_argmax(hidden, head, 24, 100),
                                  jnp.argmax((hidden @ head)[:, :100], -1))


def test_the_padding_is_the_configs_on_every_mesh_and_the_model_axis_must_divide_it():
    shapes = {}
    for name, strategy in (("one", pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1])),
                           ("tp", pk.TensorParallel(model=2, devices=jax.devices()[:4]))):
        with strategy.scope(), nnx.use_eager_sharding(False):
            module = nnx.eval_shape(lambda: GPT(GPT_SMALL, VOCAB, SEQ, nnx.Rngs(0)))
        shapes[name] = module.tokens.shape
    assert shapes["one"] == shapes["tp"] == (384, 16)  # a checkpoint restores on either mesh
    odd = dataclasses.replace(GPT_SMALL, vocab_multiple=10)  # 305 -> 310 rows: not 4 parts
    with pk.TensorParallel(model=4, devices=jax.devices()[:4]).scope(), \
            nnx.use_eager_sharding(False):
        with pytest.raises(pk.ConfigError, match=r"vocabulary of 305 padded to a multiple of "
                           r"model\.vocab_multiple = 10 \(310 rows\) does not split over the "
                           r"model axis's 4 devices; set model\.vocab_multiple = 20"):
            GPT(odd, 305, SEQ, nnx.Rngs(0))
    with pytest.raises(pk.ConfigError, match="model.vocab_multiple = 0; a positive int"), \
            nnx.use_eager_sharding(False):
        GPT(dataclasses.replace(GPT_SMALL, vocab_multiple=0), VOCAB, SEQ, nnx.Rngs(0))
