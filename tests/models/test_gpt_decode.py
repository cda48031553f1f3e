"""Sampling with a KV cache computes what the whole forward pass computes: the prefill's and
every decode step's logits equal the model's own at those positions, and greedy sampling
(top_k=1) gives the tokens of an argmax loop over the whole window, past a full context."""

import dataclasses

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gpt_common import SEQ, SMALL, VOCAB, fit_history, gpt_model, tokens

from podkit.kernels.cross_entropy import cut_vocab
from podkit.models import gpt_decode
from podkit.models.gpt import generate


@pytest.mark.parametrize("scan_layers", [True, False])
@jax.default_matmul_precision("highest")  # a TPU's default rounds float32 matmuls to bf16
def test_prefill_and_decode_steps_give_the_forward_logits(scan_layers):
    model = gpt_model(dataclasses.replace(SMALL, scan_layers=scan_layers))
    x, y = tokens(4)
    fit_history(model, x, y, steps=2)  # trained weights, not the initial ones
    module = model.module()
    params = gpt_decode.stacked(nnx.to_pure_dict(nnx.state(module, nnx.Param)))
    row = jnp.asarray(x[:1])
    want = np.asarray(module(row))  # (1, SEQ, VOCAB)
    cache = gpt_decode.empty_cache(params, SEQ, jnp.float32)
    logits, full = gpt_decode.forward(params, row, jnp.int32(0), cache, jnp.float32)
    assert logits.shape[-1] == params["head"].shape[1] >= module.vocab_size  # the table's rows
    logits = cut_vocab(logits, module.vocab_size)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    # Prefill the first 5 tokens (the rest of the window is padding), then one token at a time.
    padded = row.at[0, 5:].set(0)
    _, cache = gpt_decode.forward(params, padded, jnp.int32(0), cache, jnp.float32)
    step = jax.jit(gpt_decode.forward, static_argnums=4)
    for i in range(5, SEQ):
        logits, cache = step(params, row[:, i:i + 1], jnp.int32(i), cache, jnp.float32)
        np.testing.assert_allclose(cut_vocab(logits, module.vocab_size)[0, 0], want[0, i],
                                   rtol=1e-5, atol=1e-5)
    for got, whole in zip(cache, full, strict=True):  # the cache ends as the prefill's
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-6)


def test_greedy_generation_is_the_argmax_loop_past_a_full_context():
    """20 tokens after a 3-token prompt in a context of SEQ = 16: the context fills, keeps its
    last 8 tokens and goes on; each token is the argmax of the whole forward pass over the
    context the sampler kept."""
    model = gpt_model()
    x, y = tokens(8)
    fit_history(model, x, y, steps=3)
    module = model.module()
    prompt = [int(v) for v in x[0, :3]]
    got = generate(model, prompt, 20, top_k=1)
    context, want = list(prompt), []
    forward = nnx.jit(lambda m, t: m(t))
    for _ in range(20):
        # The context padded on the right to SEQ: one program for every length (causal
        # attention: the logits at the context's last position do not see the padding).
        padded = jnp.asarray([context + [0] * (SEQ - len(context))])
        nxt = int(np.argmax(np.asarray(forward(module, padded))[0, len(context) - 1]))
        want.append(nxt)
        if len(context) == SEQ:
            context = context[-(SEQ // 2):]
        context.append(nxt)
    assert got == want
    assert len(set(got)) > 1 and all(0 <= t < VOCAB for t in got)


def test_attention_dropout_says_it_trains_without_splash():
    """GPT-2's attn_pdrop needs the probabilities in full: splash, which never holds them,
    is not what trains then, and the model says so (a KernelFallbackWarning naming the key
    and the fix) instead of running XLA's attention silently."""
    import warnings

    from gpt_common import build_abstract

    from podkit.kernels import KernelFallbackWarning

    x, _ = tokens(4)
    config = dataclasses.replace(SMALL, attention="splash", attn_dropout=0.1)
    with pytest.warns(KernelFallbackWarning, match=r"attn_dropout = 0.1.*attn_dropout = 0.0"):
        build_abstract(gpt_model(config), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        build_abstract(gpt_model(dataclasses.replace(config, attn_dropout=0.0)), x)
