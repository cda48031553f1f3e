"""podkit.kernels.cross_entropy: the vocabulary-chunked loss against the plain one (value and
gradients, float32 to 1e-5), chunked argmax against jnp.argmax, LMLogits as a value, and the
memory the chunks save in a compiled gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import podkit as pk
from podkit.kernels.cross_entropy import (
    LMLogits,
    chunked_argmax,
    chunked_sparse_cross_entropy,
    chunks_of,
)


def problem(rows=48, embed=16, vocab=101, seed=0, dtype=jnp.float32):
    k = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(k[0], (rows, embed), jnp.float32).astype(dtype)
    head = jax.random.normal(k[1], (embed, vocab), jnp.float32) * 0.5
    labels = jax.random.randint(k[2], (rows,), 0, vocab)
    weights = jax.random.uniform(k[3], (rows,))  # a cotangent that is not all ones
    return hidden, head, labels, weights


def plain(hidden, head, labels):
    logits = (hidden @ head.astype(hidden.dtype)).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


@pytest.mark.parametrize("vocab, chunk", [
    (101, 25),   # 5 chunks of 21: 4 padding columns
    (96, 32),    # 3 chunks of 32: no padding
    (101, 101),  # one chunk
    (64, 1000),  # a chunk larger than the vocabulary
    (7, 1),      # one id per chunk
])
def test_loss_and_gradients_equal_the_plain_loss(vocab, chunk):
    hidden, head, labels, weights = problem(vocab=vocab)
    np.testing.assert_allclose(chunked_sparse_cross_entropy(hidden, head, labels, chunk),
                               plain(hidden, head, labels), rtol=1e-5, atol=1e-5)
    total = lambda f: lambda h, w: (f(h, w, labels) * weights).sum()
    chunked = jax.grad(total(lambda h, w, y: chunked_sparse_cross_entropy(h, w, y, chunk)),
                       argnums=(0, 1))(hidden, head)
    reference = jax.grad(total(plain), argnums=(0, 1))(hidden, head)
    for got, want in zip(chunked, reference, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_bfloat16_hidden_states_stay_close_and_keep_their_dtypes():
    hidden, head, labels, _ = problem(dtype=jnp.bfloat16)
    loss = chunked_sparse_cross_entropy(hidden, head, labels, 32)
    assert loss.dtype == jnp.float32
    np.testing.assert_allclose(loss, plain(hidden, head, labels), rtol=2e-2, atol=2e-2)
    g_hidden, g_head = jax.grad(
        lambda h, w: chunked_sparse_cross_entropy(h, w, labels, 32).sum(), (0, 1))(hidden, head)
    assert (g_hidden.dtype, g_head.dtype) == (jnp.bfloat16, jnp.float32)


def test_under_jit_with_the_vocabulary_split_over_devices():
    """Tensor parallelism's layout: the head split on `vocab` over 4 devices, rows on 2."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    hidden, head, labels, weights = problem(rows=64, vocab=128)
    mesh = jax.make_mesh((2, 4), ("data", "model"), (AxisType.Auto,) * 2)  # as pk.Strategy
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
    args = put(hidden, "data"), put(head, None, "model"), put(labels, "data")
    fn = jax.jit(jax.value_and_grad(
        lambda h, w, y: (chunked_sparse_cross_entropy(h, w, y, 32) * weights).sum(), (0, 1)))
    value, grads = fn(*args)
    want_value, want_grads = jax.value_and_grad(
        lambda h, w: (plain(h, w, labels) * weights).sum(), (0, 1))(hidden, head)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    for got, want in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_chunked_argmax_is_jnp_argmax_ties_included():
    hidden, head, _, _ = problem(vocab=101)
    for chunk in (1, 16, 25, 101, 500):
        np.testing.assert_array_equal(chunked_argmax(hidden, head, chunk),
                                      jnp.argmax(hidden @ head, axis=-1))
    # Ties across chunks: columns 3 and 40 (chunks 3 and 0 of 5) equal and mostly the
    # largest: the lower id wins, as in jnp.argmax.
    big = head[:, 3] * 100.0
    tied = head.at[:, 3].set(big).at[:, 40].set(big)
    np.testing.assert_array_equal(chunked_argmax(hidden, tied, 25),
                                  jnp.argmax(hidden @ tied, axis=-1))


def test_chunks_of():
    assert chunks_of(32768, 4096) == (8, 4096)
    assert chunks_of(50257, 4096) == (13, 3866)
    assert chunks_of(100, 1000) == (1, 100)
    with pytest.raises(ValueError, match="positive"):
        chunks_of(10, 0)


def test_lm_logits_is_a_lazy_array():
    hidden, head, labels, _ = problem(rows=12)
    lazy = LMLogits(hidden.reshape(3, 4, -1), head, 32)
    assert (lazy.shape, lazy.ndim, lazy.dtype, lazy.chunks) == ((3, 4, 101), 3, jnp.float32, 4)
    np.testing.assert_array_equal(lazy.materialize(), (hidden @ head).reshape(3, 4, -1))
    # A pytree: through jit and back, the chunk kept as static data.
    again = jax.jit(lambda v: v)(lazy)
    assert isinstance(again, LMLogits) and again.chunk == 32
    np.testing.assert_allclose(lazy.cross_entropy(labels.reshape(3, 4)),
                               plain(hidden, head, labels).reshape(3, 4), rtol=1e-5)
    np.testing.assert_array_equal(lazy.argmax(), jnp.argmax(lazy.materialize(), -1))
    probs = lazy.with_activation(jax.nn.softmax).materialize()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


def test_the_loss_and_accuracy_classes_read_lm_logits():
    hidden, head, labels, _ = problem(rows=12)
    lazy = LMLogits(hidden.reshape(3, 4, -1), head, 16)
    y = labels.reshape(3, 4)
    logits = lazy.materialize()
    for loss in (pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                 pk.losses.SparseCategoricalCrossentropy(from_logits=True, vocab_chunk=7),
                 pk.losses.SparseCategoricalCrossentropy(from_logits=True, vocab_chunk=0)):
        np.testing.assert_allclose(loss.per_example(y, lazy), loss.per_example(y, logits),
                                   rtol=1e-5)
        np.testing.assert_allclose(loss(y, lazy), loss(y, logits), rtol=1e-5)
    # A loss that cannot read them gets them materialized.
    mse = pk.losses.MeanSquaredError()
    np.testing.assert_allclose(mse(logits, lazy), 0.0, atol=1e-6)
    accuracy = pk.metrics.get("accuracy")
    assert accuracy.lazy_logits
    np.testing.assert_array_equal(accuracy.update(y, lazy, jnp.ones(3))["total"],
                                  accuracy.update(y, logits, jnp.ones(3))["total"])
    assert not pk.metrics.SparseTopKCategoricalAccuracy(k=2).lazy_logits


def test_vocab_chunk_is_checked_and_saved_only_when_given():
    loss = pk.losses.SparseCategoricalCrossentropy(from_logits=True, vocab_chunk=1024)
    config = pk.losses.serialize(loss)
    assert config["config"]["vocab_chunk"] == 1024
    assert pk.losses.deserialize(config).vocab_chunk == 1024
    plain_config = pk.losses.serialize(pk.losses.SparseCategoricalCrossentropy())
    assert "vocab_chunk" not in plain_config["config"]  # model.json as before
    for bad in (-1, 2.5, True):
        with pytest.raises(pk.ConfigError, match="vocab_chunk"):
            pk.losses.SparseCategoricalCrossentropy(from_logits=True, vocab_chunk=bad)


def _grad_temp_bytes(loss_fn, rows, embed, vocab):
    hidden = jax.ShapeDtypeStruct((rows, embed), jnp.float32)
    head = jax.ShapeDtypeStruct((embed, vocab), jnp.float32)
    labels = jax.ShapeDtypeStruct((rows,), jnp.int32)
    step = jax.jit(jax.grad(lambda h, w, y: loss_fn(h, w, y).mean(), argnums=(0, 1)))
    return step.lower(hidden, head, labels).compile().memory_analysis().temp_size_in_bytes


def test_the_chunks_cut_the_compiled_gradients_temporary_memory():
    rows, embed, vocab = 2048, 64, 8192
    whole = _grad_temp_bytes(plain, rows, embed, vocab)
    chunked = _grad_temp_bytes(
        lambda h, w, y: chunked_sparse_cross_entropy(h, w, y, 1024), rows, embed, vocab)
    logits = rows * vocab * 4
    print(f"\ngrad of the loss, {rows} rows x {vocab} vocab (logits {logits / 2**20:.0f} MiB): "
          f"temp {whole / 2**20:.1f} MiB plain, {chunked / 2**20:.1f} MiB in chunks of 1024")
    assert whole >= logits  # the plain gradient holds at least the whole logits
    assert chunked < logits / 2
