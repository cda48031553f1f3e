"""Keras-style layers on Flax NNX, their input sizes inferred from the first batch.

A podkit layer is a small *spec*: its constructor takes Keras's arguments; `build(input_shape,
rngs)` returns the Flax NNX module that holds the parameters, once the input shape is known.
Parameters carry logical axis names (`embed`, `mlp`, `vocab`) and never mesh axes, so the same
layers run under every strategy.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit import serialization
from podkit.errors import ConfigError

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

_glorot = nnx.initializers.glorot_uniform()
_counters: dict[str, itertools.count] = {}


def _activation_name(activation: str | None) -> str | None:
    if activation is None or activation == "linear":
        return None
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ConfigError(
            f"unknown activation {activation!r}; valid names: {', '.join(sorted(ACTIVATIONS))}."
        )
    return activation


def _pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ConfigError(f"{what}={value!r} must be a positive int or a pair of them.")
    return pair  # type: ignore[return-value]


def _padding(padding: str) -> str:
    if padding.lower() not in ("valid", "same"):
        raise ConfigError(f"padding={padding!r}; valid values: 'valid', 'same'.")
    return padding.upper()


class Layer:
    """Base of the layer specs. Subclasses define `output_shape` and `build`."""

    activation: str | None = None
    #: "one" input tensor, or "many" (a list: Concatenate, Add)
    inputs: str = "one"
    #: dtype the layer expects as input; Embedding wants integers.
    input_kind: str = "float"

    def __init__(self, name: str | None = None) -> None:
        base = _snake(type(self).__name__)
        if name is None:
            n = next(_counters.setdefault(base, itertools.count()))
            name = base if n == 0 else f"{base}_{n}"
        self.name = name

    def output_shape(self, input_shape: Shape) -> Shape:
        return input_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def get_config(self) -> dict:
        """The constructor's arguments (what `model.save` writes; `from_config` reads)."""
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        return cls(**config)

    def __call__(self, inputs: Any) -> Any:
        """Called on `pk.Input` tensors (the functional API): records the call and returns
        the symbolic output. podkit layers are specs, not eager functions."""
        from podkit.functional import call_layer

        return call_layer(self, inputs)

    def _need_rank(self, input_shape: Shape, ranks: Sequence[int]) -> None:
        if len(input_shape) + 1 not in ranks:
            raise ConfigError(
                f"layer {self.name!r} ({type(self).__name__}) needs inputs of rank "
                f"{' or '.join(str(r) for r in ranks)} (batch included) but got shape "
                f"(batch, {', '.join(map(str, input_shape))}); add a Flatten or reshape the data."
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _snake(name: str) -> str:
    out = []
    for i, c in enumerate(name):
        if c.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(c.lower())
    return "".join(out).replace("2_d", "2d")


class Dense(Layer):
    """`Dense(units, activation=None, use_bias=True)`: a fully connected layer on the last dim."""

    def __init__(
        self,
        units: int,
        activation: str | None = None,
        use_bias: bool = True,
        name: str | None = None,
        kernel_axes: tuple[str | None, str | None] = ("embed", "mlp"),
    ) -> None:
        super().__init__(name)
        if not isinstance(units, int) or units < 1:
            raise ConfigError(f"Dense(units={units!r}): units must be a positive int.")
        self.units = units
        self.activation = _activation_name(activation)
        self.use_bias = use_bias
        self.kernel_axes = tuple(kernel_axes)

    def get_config(self) -> dict:
        return {"units": self.units, "activation": self.activation, "use_bias": self.use_bias,
                "kernel_axes": list(self.kernel_axes), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        if not input_shape:
            raise ConfigError(f"Dense layer {self.name!r} got scalar features; add a feature dim.")
        return (*input_shape[:-1], self.units)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return nnx.Linear(
            input_shape[-1],
            self.units,
            use_bias=self.use_bias,
            kernel_init=_glorot,
            rngs=rngs,
            kernel_metadata={"out_sharding": self.kernel_axes},
            bias_metadata={"out_sharding": (self.kernel_axes[1],)},
        )


class _Fn(nnx.Module):
    """A parameter-free layer: a pure function of its input(s)."""

    def __init__(self, fn: Callable[..., jax.Array]) -> None:
        self.fn = fn

    def __call__(self, *xs: jax.Array) -> jax.Array:
        return self.fn(*xs)


class Flatten(Layer):
    """Flattens every dim but the batch dim."""

    def output_shape(self, input_shape: Shape) -> Shape:
        return (math.prod(input_shape),)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return _Fn(lambda x: x.reshape(x.shape[0], -1))


class Dropout(Layer):
    """Zeroes a fraction `rate` of inputs while training; the identity in evaluation."""

    def __init__(self, rate: float, seed: int | None = None, name: str | None = None) -> None:
        super().__init__(name)
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"Dropout(rate={rate!r}): rate must be in [0, 1).")
        self.rate = float(rate)
        self.seed = seed

    def get_config(self) -> dict:
        return {"rate": self.rate, "seed": self.seed, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        # A seed of its own makes this layer's masks independent of the model's seed.
        return nnx.Dropout(self.rate, rngs=rngs if self.seed is None else nnx.Rngs(
            dropout=self.seed))


class Conv2D(Layer):
    """`Conv2D(filters, kernel_size, strides=1, padding="valid")` on NHWC inputs."""

    def __init__(
        self,
        filters: int,
        kernel_size: int | Sequence[int],
        strides: int | Sequence[int] = 1,
        padding: str = "valid",
        activation: str | None = None,
        use_bias: bool = True,
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        if not isinstance(filters, int) or filters < 1:
            raise ConfigError(f"Conv2D(filters={filters!r}): filters must be a positive int.")
        self.filters = filters
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.strides = _pair(strides, "strides")
        self.padding = _padding(padding)
        self.activation = _activation_name(activation)
        self.use_bias = use_bias

    def get_config(self) -> dict:
        return {"filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding.lower(),
                "activation": self.activation, "use_bias": self.use_bias,
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self._need_rank(input_shape, (4,))
        h, w, _ = input_shape
        return (*_spatial((h, w), self.kernel_size, self.strides, self.padding), self.filters)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return nnx.Conv(
            input_shape[-1],
            self.filters,
            kernel_size=self.kernel_size,
            strides=self.strides,
            padding=self.padding,
            use_bias=self.use_bias,
            kernel_init=_glorot,
            rngs=rngs,
            kernel_metadata={"out_sharding": (None, None, "embed", "mlp")},
            bias_metadata={"out_sharding": ("mlp",)},
        )


def _spatial(
    hw: tuple[int, int], window: tuple[int, int], strides: tuple[int, int], padding: str
) -> tuple[int, int]:
    if padding == "SAME":
        return tuple(-(-d // s) for d, s in zip(hw, strides, strict=True))  # type: ignore
    out = tuple((d - k) // s + 1 for d, k, s in zip(hw, window, strides, strict=True))
    if min(out) < 1:
        raise ConfigError(
            f"a window of {window} does not fit inputs of spatial size {hw} with padding 'valid'; "
            "use padding='same' or larger inputs."
        )
    return out  # type: ignore[return-value]


class MaxPooling2D(Layer):
    """`MaxPooling2D(pool_size=2, strides=None, padding="valid")` on NHWC inputs."""

    def __init__(
        self,
        pool_size: int | Sequence[int] = 2,
        strides: int | Sequence[int] | None = None,
        padding: str = "valid",
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.pool_size = _pair(pool_size, "pool_size")
        self.strides = _pair(strides, "strides") if strides is not None else self.pool_size
        self.padding = _padding(padding)

    def get_config(self) -> dict:
        return {"pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding.lower(), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self._need_rank(input_shape, (4,))
        h, w, c = input_shape
        return (*_spatial((h, w), self.pool_size, self.strides, self.padding), c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        window, strides, padding = self.pool_size, self.strides, self.padding
        return _Fn(lambda x: nnx.max_pool(x, window, strides=strides, padding=padding))


class BatchNormalization(Layer):
    """Normalizes over the batch while training (global batch across devices); running
    statistics in evaluation. Keras's defaults: momentum 0.99, epsilon 1e-3."""

    def __init__(
        self, momentum: float = 0.99, epsilon: float = 1e-3, name: str | None = None
    ) -> None:
        super().__init__(name)
        self.momentum, self.epsilon = momentum, epsilon

    def get_config(self) -> dict:
        return {"momentum": self.momentum, "epsilon": self.epsilon, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.BatchNorm(
            input_shape[-1],
            momentum=self.momentum,
            epsilon=self.epsilon,
            rngs=rngs,
            scale_metadata={"out_sharding": ("embed",)},
            bias_metadata={"out_sharding": ("embed",)},
        )


class LayerNormalization(Layer):
    """Normalizes each example over its last dim. Keras's default epsilon 1e-3."""

    def __init__(self, epsilon: float = 1e-3, name: str | None = None) -> None:
        super().__init__(name)
        self.epsilon = epsilon

    def get_config(self) -> dict:
        return {"epsilon": self.epsilon, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.LayerNorm(
            input_shape[-1],
            epsilon=self.epsilon,
            rngs=rngs,
            scale_metadata={"out_sharding": ("embed",)},
            bias_metadata={"out_sharding": ("embed",)},
        )


class Embedding(Layer):
    """`Embedding(input_dim, output_dim)`: integer ids in [0, input_dim) to vectors."""

    input_kind = "int"

    def __init__(self, input_dim: int, output_dim: int, name: str | None = None) -> None:
        super().__init__(name)
        for what, v in (("input_dim", input_dim), ("output_dim", output_dim)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"Embedding({what}={v!r}) must be a positive int.")
        self.input_dim, self.output_dim = input_dim, output_dim

    def get_config(self) -> dict:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim,
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*input_shape, self.output_dim)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return nnx.Embed(
            self.input_dim,
            self.output_dim,
            rngs=rngs,
            embedding_metadata={"out_sharding": ("vocab", "embed")},
        )


class Activation(Layer):
    """`Activation("relu")`: an activation as a layer of its own."""

    def __init__(self, activation: str, name: str | None = None) -> None:
        super().__init__(name)
        self.activation = _activation_name(activation)

    def get_config(self) -> dict:
        return {"activation": self.activation or "linear", **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return _Fn(lambda x: x)  # the activation is applied by the model, as for Dense


class Reshape(Layer):
    """`Reshape(target_shape)`: every dim but the batch dim; one entry may be -1."""

    def __init__(self, target_shape: Sequence[int], name: str | None = None) -> None:
        super().__init__(name)
        target = tuple(target_shape)
        if not all(isinstance(d, int) and (d > 0 or d == -1) for d in target) or \
                target.count(-1) > 1:
            raise ConfigError(f"Reshape(target_shape={target_shape!r}): positive ints, at most "
                              "one -1.")
        self.target_shape = target

    def get_config(self) -> dict:
        return {"target_shape": list(self.target_shape), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        size = math.prod(input_shape)
        known = math.prod(d for d in self.target_shape if d != -1)
        if -1 in self.target_shape:
            if size % known:
                raise ConfigError(f"Reshape {self.name!r}: {size} values per example cannot "
                                  f"take the shape {self.target_shape}.")
            return tuple(size // known if d == -1 else d for d in self.target_shape)
        if known != size:
            raise ConfigError(f"Reshape {self.name!r}: inputs of shape (batch, "
                              f"{', '.join(map(str, input_shape))}) hold {size} values per "
                              f"example, not the {known} of {self.target_shape}.")
        return self.target_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        shape = self.output_shape(input_shape)
        return _Fn(lambda x: x.reshape(x.shape[0], *shape))


class _Merge(Layer):
    """A layer of several inputs (the functional API)."""

    inputs = "many"

    def _shapes(self, input_shape: Any) -> list[Shape]:
        if not isinstance(input_shape, list) or len(input_shape) < 2:
            raise ConfigError(f"{type(self).__name__} layer {self.name!r} takes a list of at "
                              "least two inputs.")
        return [tuple(s) for s in input_shape]


class Concatenate(_Merge):
    """`Concatenate(axis=-1)([a, b])`: joins inputs along one axis (batch excluded)."""

    def __init__(self, axis: int = -1, name: str | None = None) -> None:
        super().__init__(name)
        if not isinstance(axis, int) or axis == 0:
            raise ConfigError(f"Concatenate(axis={axis!r}): an int other than 0 (the batch).")
        self.axis = axis

    def get_config(self) -> dict:
        return {"axis": self.axis, **super().get_config()}

    def _dim(self, rank: int) -> int:
        dim = self.axis - 1 if self.axis > 0 else rank + self.axis
        if not 0 <= dim < rank:
            raise ConfigError(f"Concatenate {self.name!r}: axis {self.axis} is outside inputs "
                              f"of rank {rank + 1} (batch included).")
        return dim

    def output_shape(self, input_shape: Any) -> Shape:
        shapes = self._shapes(input_shape)
        ranks = {len(s) for s in shapes}
        dim = self._dim(len(shapes[0]))
        rest = {s[:dim] + s[dim + 1:] for s in shapes}
        if len(ranks) > 1 or len(rest) > 1:
            raise ConfigError(f"Concatenate {self.name!r} on axis {self.axis}: inputs of shapes "
                              f"{[(None, *s) for s in shapes]} differ outside that axis.")
        out = list(shapes[0])
        out[dim] = sum(s[dim] for s in shapes)
        return tuple(out)

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        axis = self.axis  # counts the batch dim, as in Keras
        return _Fn(lambda *xs: jnp.concatenate(xs, axis=axis))


class Add(_Merge):
    """`Add()([a, b, ...])`: the elementwise sum of inputs of one shape."""

    def output_shape(self, input_shape: Any) -> Shape:
        shapes = self._shapes(input_shape)
        if len(set(shapes)) > 1:
            raise ConfigError(f"Add {self.name!r}: inputs of shapes "
                              f"{[(None, *s) for s in shapes]} differ; Add needs one shape.")
        return shapes[0]

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return _Fn(lambda *xs: sum(xs[1:], xs[0]))


class SequentialModule(nnx.Module):
    """The built NNX module of a Sequential: layers in order, each with its activation.

    `logits=(True,)` leaves out a final softmax/sigmoid so that cross-entropy can be computed
    from logits (finite for confident predictions, exact gradients).
    """

    def __init__(self, modules: Sequence[nnx.Module], activations: Sequence[str | None]) -> None:
        self.layers = nnx.List(list(modules))
        self.activations = tuple(activations)

    def __call__(self, x: jax.Array, logits: Sequence[bool] = (False,)) -> jax.Array:
        last = len(self.layers) - 1
        for i, (layer, act) in enumerate(zip(self.layers, self.activations, strict=True)):
            x = layer(x)
            if act is not None and not (logits[0] and i == last):
                x = ACTIVATIONS[act](x)
        return x


def build_sequential(
    layers: Sequence[Layer], input_shape: Shape, rngs: nnx.Rngs
) -> tuple[SequentialModule, list[Shape]]:
    """Build every layer in order from `input_shape` (batch excluded); return the module and
    the output shape after each layer."""
    shapes: list[Shape] = []
    modules: list[nnx.Module] = []
    shape = tuple(input_shape)
    for layer in layers:
        modules.append(layer.build(shape, rngs))
        shape = tuple(layer.output_shape(shape))
        shapes.append(shape)
    return SequentialModule(modules, [layer.activation for layer in layers]), shapes


CLASSES: dict[str, type[Layer]] = {c.__name__: c for c in (
    Dense, Flatten, Dropout, Conv2D, MaxPooling2D, BatchNormalization, LayerNormalization,
    Embedding, Activation, Reshape, Concatenate, Add)}


def serialize(layer: Layer) -> dict:
    return serialization.to_config(layer, CLASSES, "layer")


def deserialize(config: dict) -> Layer:
    return serialization.from_config(config, CLASSES, "layer")
