"""The base of podkit's layers: a Keras-style *spec* that builds a Flax NNX module.

A layer's constructor takes Keras's arguments; `build(input_shape, rngs)` returns the NNX
module that holds its parameters once the input shape is known. Parameters carry logical axis
names (`embed`, `mlp`, `vocab`) and never mesh axes, so the same layers run under every
strategy. Keras's common layer arguments are understood (`name`, `trainable`, `input_shape`,
`input_dim`); any other unknown argument is an error naming it, never ignored.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit import initializers, regularizers, serialization
from podkit.errors import ConfigError
from podkit.layers.symbolic import call_layer

Shape = tuple[int, ...]

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array] | None] = {
    "linear": None,
    "relu": jax.nn.relu,
    "relu6": jax.nn.relu6,
    "sigmoid": jax.nn.sigmoid,
    "softmax": jax.nn.softmax,
    "log_softmax": jax.nn.log_softmax,
    "tanh": jnp.tanh,
    "gelu": jax.nn.gelu,
    "elu": jax.nn.elu,
    "selu": jax.nn.selu,
    "softplus": jax.nn.softplus,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "leaky_relu": jax.nn.leaky_relu,
}

_counters: dict[str, itertools.count] = {}


def activation_name(activation: str | None) -> str | None:
    if activation is None or activation == "linear":
        return None
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {activation!r}; valid names: "
                          f"{', '.join(sorted(ACTIVATIONS))} (as strings).")
    return activation


def pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    out = (value, value) if isinstance(value, int) else tuple(value)
    if len(out) != 2 or not all(isinstance(v, int) and v > 0 for v in out):
        raise ConfigError(f"{what}={value!r} must be a positive int or a pair of them.")
    return out  # type: ignore[return-value]


def padding_mode(padding: str) -> str:
    if not isinstance(padding, str) or padding.lower() not in ("valid", "same"):
        raise ConfigError(f"padding={padding!r}; valid values: 'valid', 'same'.")
    return padding.upper()


class Fn(nnx.Module):
    """A parameter-free layer: a pure function of its input(s)."""

    def __init__(self, fn: Callable[..., jax.Array]) -> None:
        self.fn = fn

    def __call__(self, *xs: jax.Array) -> jax.Array:
        return self.fn(*xs)


class Layer:
    """Base of the layer specs. Subclasses define `output_shape`, `build`, `get_config`."""

    activation: str | None = None
    #: "one" input tensor, or "many" (a list: Concatenate, Add)
    inputs: str = "one"
    #: dtype the layer expects as input; Embedding wants integers.
    input_kind: str = "float"
    #: (attribute of the built module, regularizer) pairs: penalties added to the loss
    regularized: tuple[tuple[str, regularizers.Regularizer], ...] = ()

    def __init__(self, name: str | None = None, trainable: bool = True,
                 input_shape: Sequence[int] | None = None, input_dim: int | None = None,
                 dtype: Any = None, **unknown: Any) -> None:
        if dtype not in (None, "float32") and jnp.dtype(dtype) != jnp.float32:
            raise ConfigError(f"{type(self).__name__}(dtype={dtype!r}): podkit layers compute "
                              "in float32 here; leave dtype out.")
        if unknown:
            hint = (" Regularize with kernel_regularizer= on Dense/Conv2D, or weight_decay= on "
                    "the optimizer." if "activity_regularizer" in unknown else "")
            raise ConfigError(f"{type(self).__name__}() got arguments podkit does not support: "
                              f"{', '.join(sorted(unknown))}.{hint} See docs/keras.md.")
        base = serialization.snake_case(type(self).__name__)
        if name is None:
            n = next(_counters.setdefault(base, itertools.count()))
            name = base if n == 0 else f"{base}_{n}"
        if not isinstance(trainable, bool):
            raise ConfigError(f"trainable={trainable!r} must be True or False.")
        self.name, self.trainable = name, trainable
        if input_dim is not None:
            input_shape = (input_dim,)
        self.input_shape = None if input_shape is None else tuple(input_shape)

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def get_config(self) -> dict:
        """The constructor's arguments (what `model.save` writes; `from_config` reads)."""
        return {"name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        return cls(**config)

    def __call__(self, inputs: Any) -> Any:
        """Called on `pk.Input` tensors (the functional API): records the call and returns
        the symbolic output. podkit layers are specs, not eager functions."""
        return call_layer(self, inputs)

    def need_rank(self, input_shape: Shape, ranks: Sequence[int]) -> None:
        if len(input_shape) + 1 not in ranks:
            raise ConfigError(
                f"layer {self.name!r} ({type(self).__name__}) needs inputs of rank "
                f"{' or '.join(str(r) for r in ranks)} (batch included) but got shape "
                f"(batch, {', '.join(map(str, input_shape))}); add a Flatten or reshape the data.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class WeightedLayer(Layer):
    """A layer with a kernel and a bias: Keras's initializer and regularizer arguments."""

    def __init__(self, *, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.regularized = tuple((attr, r) for attr, r in (
            ("kernel", self.kernel_regularizer), ("bias", self.bias_regularizer))
            if r is not None and (attr == "kernel" or self.use_bias))

    def get_config(self) -> dict:
        return {"use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer),
                "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": regularizers.serialize(self.bias_regularizer),
                **super().get_config()}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        config = dict(config)
        for key in ("kernel_initializer", "bias_initializer"):
            if key in config:
                config[key] = initializers.deserialize(config[key])
        for key in ("kernel_regularizer", "bias_regularizer"):
            if key in config:
                config[key] = regularizers.deserialize(config[key])
        return cls(**config)
