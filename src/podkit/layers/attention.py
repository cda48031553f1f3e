"""MultiHeadAttention, Keras 3's layer: query, key and value projected into heads, attention
by podkit.kernels, the heads projected back.

    tokens = pk.Input((128, 64))
    h = pk.layers.MultiHeadAttention(num_heads=4, key_dim=16)(tokens, tokens,
                                                              use_causal_mask=True)

Keras's semantics: `layer(query, value, key=None, attention_mask=None, use_causal_mask=False)`
with query (B, Tq, dim), value (B, Tv, dim_v), key (B, Tv, dim_k) (value when left out),
attention_mask (B, Tq, Tv) (1 or True where a query may attend); the output is (B, Tq, dim)
(query's last dim) or (B, Tq, *output_shape). Which attention runs (`attention=`):

- with no `attention_mask` (causal or not), `attention`'s kernel: "auto" is Pallas splash
  attention on a TPU and XLA's elsewhere (podkit.kernels.attention; a shape splash cannot
  take falls back to XLA with a warning);
- with an `attention_mask` (padding), always XLA's attention: splash takes only the causal
  or the full mask;
- while training with `dropout` > 0, the attention probabilities are computed in full by XLA
  so that dropout can zero some of them (as Keras does); in evaluation and prediction the
  kernel runs.

The weights are Keras's (query, key, value and output kernels and biases), named
`query_kernel`, `query_bias`, ..., `output_kernel`, `output_bias`, with logical axes `embed`
(model width: FSDP), `heads` (tensor parallelism) and `kv` (per-head width).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit import kernels
from podkit.errors import ConfigError
from podkit.layers.base import Shape, WeightedLayer

_PROJECTIONS = ("query", "key", "value", "output")


class MultiHeadAttention(WeightedLayer):
    """`MultiHeadAttention(num_heads, key_dim, value_dim=None, dropout=0.0, use_bias=True,
    output_shape=None, attention="auto")`, called as
    `layer(query, value, key=None, attention_mask=None, use_causal_mask=False)`.

    `attention`: "auto", "xla" or "splash" (podkit's: which kernel computes the attention;
    see the module docstring). The other arguments are Keras's."""

    inputs = "many"  # query, value, key (value when not given), and the mask if any
    weight_order = tuple(f"{p}_{w}" for p in _PROJECTIONS for w in ("kernel", "bias"))
    # Keras's projections are sublayers named query, key, value and attention_output.
    keras_names = {f"{p}_{w}": f"{'attention_output' if p == 'output' else p}/{w}"
                   for p in _PROJECTIONS for w in ("kernel", "bias")}

    def __init__(self, num_heads: int, key_dim: int, value_dim: int | None = None,
                 dropout: float = 0.0, use_bias: bool = True,
                 output_shape: int | Sequence[int] | None = None, attention: str = "auto",
                 seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, **kwargs)
        for what, v in (("num_heads", num_heads), ("key_dim", key_dim),
                        ("value_dim", key_dim if value_dim is None else value_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"MultiHeadAttention({what}={v!r}): a positive int.")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or \
                not 0.0 <= dropout < 1.0:
            raise ConfigError(f"MultiHeadAttention(dropout={dropout!r}): a rate in [0, 1).")
        dims = (output_shape,) if isinstance(output_shape, int) else output_shape
        if dims is not None and (not isinstance(dims, Sequence) or not dims or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)):
            raise ConfigError(f"MultiHeadAttention(output_shape={output_shape!r}): a positive "
                              "int or a sequence of them (the output's dims after batch and "
                              "time), or None for the query's last dim.")
        self.num_heads, self.key_dim, self.value_dim = num_heads, key_dim, value_dim
        self.dropout, self.seed = float(dropout), seed
        #: Keras's `output_shape` argument (podkit's `output_shape` is the shape method)
        self.output_dims: tuple[int, ...] | None = None if dims is None else tuple(dims)
        self.attention = kernels.check_implementation(attention)
        # Keras's kernel_regularizer / bias_regularizer apply to all four projections.
        self.regularized = tuple((f"{p}_{attr}", r) for attr, r in self.regularized
                                 for p in _PROJECTIONS)

    def __call__(self, query: Any, value: Any = None, key: Any = None,
                 attention_mask: Any = None, use_causal_mask: bool = False,
                 return_attention_scores: bool = False, **kwargs: Any) -> Any:
        """Called on pk.Input tensors (the functional API), as Keras's layer is called."""
        if return_attention_scores:
            raise ConfigError(f"MultiHeadAttention {self.name!r}: return_attention_scores="
                              "True is not supported (the attention kernels never form the "
                              "scores); compute them from the query and key projections "
                              "if you need them.")
        if kwargs:
            raise ConfigError(f"MultiHeadAttention {self.name!r} was called with "
                              f"{sorted(kwargs)}; it takes query, value, key=, "
                              "attention_mask= and use_causal_mask=.")
        if value is None:
            raise ConfigError(f"MultiHeadAttention {self.name!r} takes query and value: "
                              "layer(query, value), e.g. layer(x, x) for self-attention.")
        if not isinstance(use_causal_mask, bool):
            raise ConfigError(f"use_causal_mask={use_causal_mask!r} must be True or False.")
        tensors = [query, value, value if key is None else key]
        if attention_mask is not None:
            tensors.append(attention_mask)
        return self.symbolic_call(tensors,
                                  {"use_causal_mask": True} if use_causal_mask else None)

    def _shapes(self, input_shape: Any) -> list[Shape]:
        """[query, value, key(, mask)] shapes (batch excluded), checked against each other."""
        if not isinstance(input_shape, list) or len(input_shape) not in (3, 4):
            raise ConfigError(f"MultiHeadAttention {self.name!r} is called on query and value "
                              "tensors (the functional API): layer(query, value); it cannot "
                              "be a layer of a Sequential.")
        shapes = [tuple(s) for s in input_shape]
        query, value, key = shapes[:3]
        for what, s in (("query", query), ("value", value), ("key", key)):
            if len(s) != 2:
                raise ConfigError(f"MultiHeadAttention {self.name!r}: {what} of shape "
                                  f"{(None, *s)}; it takes (batch, time, features).")
        if key[0] != value[0]:
            raise ConfigError(f"MultiHeadAttention {self.name!r}: key {(None, *key)} and "
                              f"value {(None, *value)} differ in length.")
        if len(shapes) == 4 and shapes[3] != (query[0], value[0]):
            raise ConfigError(f"MultiHeadAttention {self.name!r}: attention_mask of shape "
                              f"{(None, *shapes[3])}; it must be (batch, {query[0]}, "
                              f"{value[0]}) (query length, value length).")
        return shapes

    def output_shape(self, input_shape: Any) -> Shape:
        query = self._shapes(input_shape)[0]
        return (query[0], *(self.output_dims or query[-1:]))

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        query, value, key = self._shapes(input_shape)[:3]
        return MultiHeadAttentionModule(self, query[-1], key[-1], value[-1], rngs)

    def get_config(self) -> dict:
        return {"num_heads": self.num_heads, "key_dim": self.key_dim,
                "value_dim": self.value_dim, "dropout": self.dropout,
                "output_shape": None if self.output_dims is None else list(self.output_dims),
                "attention": self.attention, "seed": self.seed, **super().get_config()}


class MultiHeadAttentionModule(nnx.Module):
    """The built layer: `(query, value, key, attention_mask=None, *, use_causal_mask=False)`."""

    def __init__(self, layer: MultiHeadAttention, query_dim: int, key_dim: int,
                 value_dim: int, rngs: nnx.Rngs) -> None:
        heads, kd = layer.num_heads, layer.key_dim
        vd = layer.value_dim or kd
        out = layer.output_dims or (query_dim,)
        self.output_dims, self.attention = out, layer.attention
        kernel, bias = layer.kernel_initializer, layer.bias_initializer

        def param(init: Any, shape: tuple[int, ...], axes: tuple[str | None, ...]) -> nnx.Param:
            return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=axes)

        # Keras's EinsumDense shapes: (features, heads, head dim) in, (heads, head dim,
        # output) out.
        self.query_kernel = param(kernel, (query_dim, heads, kd), ("embed", "heads", "kv"))
        self.key_kernel = param(kernel, (key_dim, heads, kd), ("embed", "heads", "kv"))
        self.value_kernel = param(kernel, (value_dim, heads, vd), ("embed", "heads", "kv"))
        self.output_kernel = param(kernel, (heads, vd, *out),
                                   ("heads", "kv", "embed", *(None,) * (len(out) - 1)))
        self.use_bias = layer.use_bias
        if layer.use_bias:
            self.query_bias = param(bias, (heads, kd), ("heads", "kv"))
            self.key_bias = param(bias, (heads, kd), ("heads", "kv"))
            self.value_bias = param(bias, (heads, vd), ("heads", "kv"))
            self.output_bias = param(bias, out, ("embed", *(None,) * (len(out) - 1)))
        self.dropout = None if layer.dropout == 0 else nnx.Dropout(
            layer.dropout, rngs=rngs if layer.seed is None else nnx.Rngs(dropout=layer.seed))

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        h = jnp.einsum("btd,dhk->bthk", x, getattr(self, f"{name}_kernel")[...])
        return h + getattr(self, f"{name}_bias")[...] if self.use_bias else h

    def __call__(self, query: jax.Array, value: jax.Array, key: jax.Array,
                 attention_mask: jax.Array | None = None, *,
                 use_causal_mask: bool = False) -> jax.Array:
        q, k, v = (self._project(x, name) for x, name in ((query, "query"), (key, "key"),
                                                          (value, "value")))
        mask = None if attention_mask is None else attention_mask.astype(bool)[:, None]
        if self.dropout is not None and not self.dropout.deterministic:
            h = _attention_with_dropout(q, k, v, mask, use_causal_mask, self.dropout)
        else:
            h = kernels.dot_product_attention(q, k, v, causal=use_causal_mask, mask=mask,
                                              implementation=self.attention)
        kernel = self.output_kernel[...]
        out = jnp.einsum("bthv,hvo->bto", h, kernel.reshape(*kernel.shape[:2], -1))
        if self.use_bias:
            out = out + self.output_bias[...].reshape(-1)
        return out.reshape(*out.shape[:2], *self.output_dims)


def _attention_with_dropout(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None,
                            causal: bool, dropout: nnx.Dropout) -> jax.Array:
    """Keras's attention while training with dropout: the probabilities in full, some
    zeroed (no kernel keeps them)."""
    probs = kernels.attention_probabilities(q, k, causal=causal, mask=mask)
    return jnp.einsum("bhqk,bkhd->bqhd", dropout(probs).astype(v.dtype), v)
