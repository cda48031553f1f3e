"""Softmax cross-entropy over a vocabulary, a chunk of the vocabulary at a time, so that the
(tokens, vocab) logits never exist.

    loss_N = chunked_sparse_cross_entropy(hidden_NxE, head_ExV, labels_N, chunk)

equals `optax.softmax_cross_entropy_with_integer_labels(logits_NxV, labels_N)` with
`logits_NxV = (hidden_NxE @ head_ExV.astype(hidden.dtype)).astype(float32)` (a language
model's output layer), to float32 rounding, value and gradients. Forward: a `lax.scan` over
the n = ceil(V / chunk) chunks keeps a running max, sum of exponentials and the label's logit,
(N,) each. Backward (a custom VJP that keeps only hidden, head and the log-sum-exp (N,)): a
second scan recomputes each chunk's logits, forms its softmax gradient, adds its part of
d hidden (float32) and emits its columns of d head. Only (N, chunk) logits exist at once
(levanter's blockwise cross-entropy does the same; MaxText's vocabulary tiling splits the
tokens instead of the vocabulary).

Chunks are strided, not contiguous: chunk i holds vocabulary ids i, i + n, i + 2n, ... The
head viewed as (E, chunk, n) keeps its `vocab` split (tensor parallelism puts it on `model`)
on each chunk's own columns, so every device computes its share of every chunk; contiguous
chunks would each live on one device. A vocabulary that n does not divide is padded with
columns whose logits are -inf.

`LMLogits(hidden, head, chunk)` is the value a language model returns in training instead of
its logits. A module declares that it can by having a `lazy_logits` attribute: podkit's train
step sets it True (`module.train(lazy_logits=True)`), evaluate and predict set it False. The
loss reads LMLogits chunk by chunk, accuracy takes a chunked argmax, anything else calls
`materialize()`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax


def chunks_of(vocab: int, chunk: int) -> tuple[int, int]:
    """(number of chunks n, columns per chunk c) for a vocabulary, n * c >= vocab."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk!r} must be a positive number of vocabulary entries.")
    n = -(-vocab // chunk)
    return n, -(-vocab // n)


def cut_vocab(logits: jax.Array, vocab: int) -> jax.Array:
    """Logits over a padded head's columns, the padding cut off: (..., vocab)."""
    return logits if logits.shape[-1] == vocab else logits[..., :vocab]


def _columns(head: jax.Array, chunk: int, valid: int | None) -> tuple[int, int, int]:
    """(chunks n, columns per chunk c, the vocabulary: `valid` or every column) of a head."""
    n, c = chunks_of(head.shape[1], chunk)
    return n, c, head.shape[1] if valid is None else valid


def _strided(head: jax.Array, n: int, c: int) -> jax.Array:
    """(E, V) -> (n, E, c): chunk i, column j is vocabulary id j * n + i (padded past V)."""
    e, v = head.shape
    if n * c != v:
        head = jnp.pad(head, ((0, 0), (0, n * c - v)))
    return head.reshape(e, c, n).transpose(2, 0, 1)


def _unstrided(chunks: jax.Array, vocab: int) -> jax.Array:
    """(n, E, c) -> (E, V): the inverse of `_strided`."""
    n, e, c = chunks.shape
    return chunks.transpose(1, 2, 0).reshape(e, c * n)[:, :vocab]


def _chunk_logits(hidden: jax.Array, w: jax.Array, i: jax.Array, n: int, vocab: int
                  ) -> jax.Array:
    """(N, c) float32 logits of chunk i (w: its (E, c) columns, in hidden's dtype), padding
    columns at -inf. The matmul in hidden's dtype, then float32: as the model computes them."""
    logits = (hidden @ w).astype(jnp.float32)
    c = w.shape[1]
    if n * c != vocab:
        ids = jnp.arange(c) * n + i
        logits = jnp.where(ids[None, :] < vocab, logits, -jnp.inf)
    return logits


def _is_label(labels: jax.Array, c: int, i: jax.Array, n: int) -> jax.Array:
    """(N, c) bool: where chunk i's column is the row's label (a compare, no gather)."""
    return (jnp.arange(c)[None, :] == (labels // n)[:, None]) & (labels % n == i)[:, None]


def _forward(hidden: jax.Array, head: jax.Array, labels: jax.Array, chunk: int,
             valid: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(per-row loss, log-sum-exp), both (N,) float32."""
    n, c, vocab = _columns(head, chunk, valid)
    w = _strided(head.astype(hidden.dtype), n, c)

    def body(carry, xs):
        top, total, picked = carry
        i, w_i = xs
        logits = _chunk_logits(hidden, w_i, i, n, vocab)
        new_top = jnp.maximum(top, logits.max(axis=-1))
        total = total * jnp.exp(top - new_top) + jnp.exp(logits - new_top[:, None]).sum(-1)
        picked = picked + jnp.where(_is_label(labels, c, i, n), logits, 0.0).sum(-1)
        return (new_top, total, picked), None

    rows = hidden.shape[0]
    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.zeros((rows,), jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    (top, total, picked), _ = jax.lax.scan(body, init, (jnp.arange(n), w))
    lse = top + jnp.log(total)
    return lse - picked, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def chunked_sparse_cross_entropy(hidden: jax.Array, head: jax.Array, labels: jax.Array,
                                 chunk: int, valid: int | None = None) -> jax.Array:
    """Per-row softmax cross-entropy (N,) float32 of the logits `hidden @ head` against integer
    `labels`, computed `chunk` vocabulary entries at a time (see the module docstring).

        hidden (N, E) in the compute dtype, head (E, V), labels (N,) ints in [0, valid)
        valid: the first columns that are the vocabulary (a padded head's rest: -inf logits)
    """
    return _forward(hidden, head, labels, chunk, valid)[0]


def _fwd(hidden, head, labels, chunk, valid):
    loss, lse = _forward(hidden, head, labels, chunk, valid)
    return loss, (hidden, head, labels, lse)


def _bwd(chunk, valid, residuals, g):
    hidden, head, labels, lse = residuals
    n, c, vocab = _columns(head, chunk, valid)
    w = _strided(head.astype(hidden.dtype), n, c)
    g = g.astype(jnp.float32)

    def body(d_hidden, xs):
        i, w_i = xs
        probs = jnp.exp(_chunk_logits(hidden, w_i, i, n, vocab) - lse[:, None])
        d_logits = g[:, None] * (probs - _is_label(labels, c, i, n))
        # The matmuls in the compute dtype (as autodiff of the plain path), summed in float32.
        d_logits = d_logits.astype(hidden.dtype)
        d_hidden = d_hidden + jnp.matmul(d_logits, w_i.T, preferred_element_type=jnp.float32)
        return d_hidden, jnp.matmul(hidden.T, d_logits, preferred_element_type=jnp.float32)

    d_hidden, d_w = jax.lax.scan(body, jnp.zeros(hidden.shape, jnp.float32), (jnp.arange(n), w))
    return (d_hidden.astype(hidden.dtype), _unstrided(d_w, head.shape[1]).astype(head.dtype),
            None)


chunked_sparse_cross_entropy.defvjp(_fwd, _bwd)


def chunked_argmax(hidden: jax.Array, head: jax.Array, chunk: int, valid: int | None = None
                   ) -> jax.Array:
    """argmax over the vocabulary of `hidden @ head` (N,) int32, a chunk at a time; ties go to
    the lowest id, as jnp.argmax. Columns from `valid` on (a padded head's) never win."""
    n, c, vocab = _columns(head, chunk, valid)
    w = _strided(head.astype(hidden.dtype), n, c)

    def body(carry, xs):
        best, at = carry
        i, w_i = xs
        logits = _chunk_logits(hidden, w_i, i, n, vocab)
        value = logits.max(axis=-1)
        ids = logits.argmax(axis=-1).astype(jnp.int32) * n + i
        better = (value > best) | ((value == best) & (ids < at))
        return (jnp.where(better, value, best), jnp.where(better, ids, at)), None

    rows = hidden.shape[0]
    init = (jnp.full((rows,), -jnp.inf, jnp.float32), jnp.full((rows,), vocab, jnp.int32))
    (_, at), _ = jax.lax.scan(body, init, (jnp.arange(n, dtype=jnp.int32), w))
    return at


@functools.partial(jax.tree_util.register_dataclass, data_fields=["hidden", "head"],
                   meta_fields=["chunk", "activation", "vocab"])
@dataclasses.dataclass(frozen=True)
class LMLogits:
    """Language-model logits not yet computed: `hidden @ head` over the vocabulary.

        hidden (..., E) the final hidden states, in the compute dtype
        head (E, V) the output layer's weights
        chunk: vocabulary entries per chunk when the loss or argmax reads them
        activation: applied by `materialize()` (metrics of a from_logits loss see softmax)
        vocab: the vocabulary, the first columns of a head padded past it (None: all of them)

    `shape`, `ndim` and `dtype` are the logits' (float32). A pytree (hidden and head are its
    leaves), so it passes through jit, grad's aux and scans.
    """

    hidden: jax.Array
    head: jax.Array
    chunk: int
    activation: Callable[[jax.Array], jax.Array] | None = None
    vocab: int | None = None

    @property
    def valid(self) -> int:
        """The vocabulary: the logits' last dim."""
        return self.head.shape[1] if self.vocab is None else self.vocab

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.hidden.shape[:-1], self.valid)

    @property
    def ndim(self) -> int:
        return self.hidden.ndim

    @property
    def dtype(self) -> Any:
        return jnp.dtype(jnp.float32)

    @property
    def chunks(self) -> int:
        return chunks_of(self.head.shape[1], self.chunk)[0]

    def with_activation(self, activation: Callable[[jax.Array], jax.Array]) -> LMLogits:
        return dataclasses.replace(self, activation=activation)

    def materialize(self) -> jax.Array:
        """The whole (..., V) float32 logits (the activation applied, if any): the model's
        plain output, bit for bit."""
        logits = cut_vocab((self.hidden @ self.head.astype(self.hidden.dtype)
                            ).astype(jnp.float32), self.valid)
        return logits if self.activation is None else self.activation(logits)

    def cross_entropy(self, labels: jax.Array, chunk: int | None = None) -> jax.Array:
        """Softmax cross-entropy of the logits against integer labels (...), float32 (...):
        chunked, unless the vocabulary fits in one chunk (then the plain loss: one chunk
        saves nothing and its backward would recompute the logits)."""
        chunk = self.chunk if chunk is None else chunk
        lead, embed = self.hidden.shape[:-1], self.hidden.shape[-1]
        labels = labels.astype(jnp.int32)
        if chunks_of(self.head.shape[1], chunk)[0] == 1:
            return optax.softmax_cross_entropy_with_integer_labels(
                dataclasses.replace(self, activation=None).materialize(), labels)
        loss = chunked_sparse_cross_entropy(self.hidden.reshape(-1, embed), self.head,
                                            labels.reshape(-1), chunk, self.vocab)
        return loss.reshape(lead)

    def argmax(self) -> jax.Array:
        """argmax over the vocabulary (...) int32, chunked (an activation is monotone: it
        changes no argmax)."""
        lead, embed = self.hidden.shape[:-1], self.hidden.shape[-1]
        return chunked_argmax(self.hidden.reshape(-1, embed), self.head,
                              self.chunk, self.vocab).reshape(lead)


def materialize(value: Any) -> Any:
    """`value.materialize()` for LMLogits, the value itself otherwise."""
    return value.materialize() if isinstance(value, LMLogits) else value
