"""Core layers: Dense, Activation, Softmax, Dropout, Flatten, Reshape, Rescaling, Embedding."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit import initializers, regularizers
from podkit.errors import ConfigError
from podkit.layers.base import Fn, Layer, Shape, WeightedLayer, activation_name
from podkit.layers.lookup import lookup


class Dense(WeightedLayer):
    """`Dense(units, activation=None, use_bias=True)`: a fully connected layer on the last dim."""

    keeps_mask = True

    def __init__(self, units: int, activation: str | None = None, use_bias: bool = True,
                 kernel_axes: tuple[str | None, str | None] = ("embed", "mlp"),
                 **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, **kwargs)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ConfigError(f"Dense(units={units!r}): units must be a positive int.")
        self.units = units
        self.activation = activation_name(activation)
        self.kernel_axes = tuple(kernel_axes)

    def get_config(self) -> dict:
        return {"units": self.units, "activation": self.activation,
                "kernel_axes": list(self.kernel_axes), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        if not input_shape:
            raise ConfigError(f"Dense layer {self.name!r} got scalar features; add a feature dim.")
        return (*input_shape[:-1], self.units)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return nnx.Linear(
            input_shape[-1], self.units, use_bias=self.use_bias,
            kernel_init=self.kernel_initializer, bias_init=self.bias_initializer, rngs=rngs,
            kernel_metadata={"out_sharding": self.kernel_axes},
            bias_metadata={"out_sharding": (self.kernel_axes[1],)})


class Activation(Layer):
    """`Activation("relu")`: an activation as a layer of its own."""

    keeps_mask = True

    def __init__(self, activation: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.activation = activation_name(activation)

    def get_config(self) -> dict:
        return {"activation": self.activation or "linear", **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return Fn(lambda x: x)  # the activation is applied by the model, as for Dense


class Softmax(Activation):
    """`Softmax()`: a softmax over the last axis, as a layer."""

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        if axis != -1:
            raise ConfigError(f"Softmax(axis={axis!r}): podkit's Softmax is over the last axis.")
        kwargs.pop("activation", None)
        super().__init__("softmax", **kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        config.pop("activation")
        return config


class Dropout(Layer):
    """Zeroes a fraction `rate` of inputs while training; the identity in evaluation."""

    keeps_mask = True

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(rate, int | float) or not 0.0 <= rate < 1.0:
            raise ConfigError(f"Dropout(rate={rate!r}): rate must be in [0, 1).")
        self.rate, self.seed = float(rate), seed

    def get_config(self) -> dict:
        return {"rate": self.rate, "seed": self.seed, **super().get_config()}

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        # A seed of its own makes this layer's masks independent of the model's seed.
        return nnx.Dropout(self.rate, rngs=rngs if self.seed is None else nnx.Rngs(
            dropout=self.seed))


class Flatten(Layer):
    """Flattens every dim but the batch dim."""

    def output_shape(self, input_shape: Shape) -> Shape:
        if None in input_shape:
            raise ConfigError(f"Flatten {self.name!r} needs fixed dims, and inputs of shape "
                              f"{(None, *input_shape)} have one that varies: pool over it "
                              "(GlobalAveragePooling1D) or declare its length in pk.Input.")
        return (math.prod(input_shape),)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return Fn(lambda x: x.reshape(x.shape[0], -1))


class Reshape(Layer):
    """`Reshape(target_shape)`: every dim but the batch dim; one entry may be -1."""

    def __init__(self, target_shape: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        target = tuple(target_shape)
        if not all(isinstance(d, int) and (d > 0 or d == -1) for d in target) or \
                target.count(-1) > 1:
            raise ConfigError(f"Reshape(target_shape={target_shape!r}): positive ints, at most "
                              "one -1.")
        self.target_shape = target

    def get_config(self) -> dict:
        return {"target_shape": list(self.target_shape), **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        if None in input_shape:
            raise ConfigError(f"Reshape {self.name!r} needs fixed dims; inputs of shape "
                              f"{(None, *input_shape)} have one that varies.")
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
        return Fn(lambda x: x.reshape(x.shape[0], *shape))


class Rescaling(Layer):
    """`Rescaling(scale, offset=0.0)`: `x * scale + offset` in float32 (e.g. 1/255 for
    pixels); `scale` and `offset` are numbers or arrays broadcast over the last axes (one per
    channel: `Rescaling([1/58.4, 1/57.1, 1/57.4], [-2.1, -2.0, -1.8])`), as Keras's."""

    keeps_mask = True

    def __init__(self, scale: Any, offset: Any = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scale = _scale_value("scale", scale)
        self.offset = _scale_value("offset", offset)

    def get_config(self) -> dict:
        return {"scale": _plain(self.scale), "offset": _plain(self.offset),
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        for what, value in (("scale", self.scale), ("offset", self.offset)):
            shape = jnp.shape(value)
            try:
                jnp.broadcast_shapes(tuple(1 if d is None else d for d in input_shape), shape)
            except ValueError:
                raise ConfigError(f"Rescaling {self.name!r}: {what} of shape {shape} does not "
                                  f"broadcast over inputs of shape {(None, *input_shape)}; "
                                  "give one value per channel (the last axis).") from None
        return input_shape

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        # numpy constants, embedded in the program (a closed-over jax.Array would become
        # an argument of the compiled step that the state does not carry)
        scale = np.asarray(self.scale, np.float32)
        offset = np.asarray(self.offset, np.float32)
        return Fn(lambda x: x.astype(jnp.float32) * scale + offset)


def _scale_value(what: str, value: Any) -> Any:
    """A number, or a list / array of numbers (kept as a numpy float32 array)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    array = None
    if isinstance(value, list | tuple | np.ndarray):
        try:
            array = np.asarray(value)
        except ValueError:  # ragged
            array = None
    if array is None or array.dtype.kind not in "iuf" or array.ndim == 0:
        raise ConfigError(f"Rescaling({what}={value!r}): a number, or one number per channel "
                          "(a list or array).")
    return array.astype(np.float32)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


class Embedding(Layer):
    """`Embedding(input_dim, output_dim)`: integer ids in [0, input_dim) to vectors.

    `sharded=True` gives the table TPUEmbedding's treatment: its rows are split over the whole
    mesh (logical axis `table`, the parameter-server layout of CTR models: the table and its
    optimizer state cost 1/N of their size per device), and a train step updates only the
    rows its batch looked up (podkit.train.sparse: exactly the dense update with SGD or
    Adagrad, the lazy form — TPUEmbedding's default — with Adam and the others). Without it
    the rows are a `vocab` dim (split by tensor parallelism, replicated otherwise) and the
    whole table is updated each step, as in Keras. `sparse_updates=False` keeps a sharded
    table's layout but updates it densely (Keras's optimizer semantics, at a cost that grows
    with the table)."""

    input_kind = "int"
    weight_order = ("embedding",)
    keras_names = {"embedding": "embeddings"}

    def __init__(self, input_dim: int, output_dim: int,
                 embeddings_initializer: Any = "random_uniform",
                 embeddings_regularizer: Any = None, sharded: bool = False,
                 sparse_updates: bool | None = None, mask_zero: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(mask_zero, bool):
            raise ConfigError(f"Embedding(mask_zero={mask_zero!r}) must be True or False.")
        self.mask_zero = mask_zero
        if not isinstance(sharded, bool):
            raise ConfigError(f"Embedding(sharded={sharded!r}) must be True or False.")
        if sparse_updates is None:
            sparse_updates = sharded
        if not isinstance(sparse_updates, bool):
            raise ConfigError(f"Embedding(sparse_updates={sparse_updates!r}) must be True or "
                              "False.")
        if sparse_updates and not sharded:
            raise ConfigError("Embedding(sparse_updates=True) needs sharded=True: row-sparse "
                              "updates are for tables split over the mesh (a replicated table "
                              "is updated densely, as in Keras).")
        if sparse_updates and embeddings_regularizer is not None:
            raise ConfigError(
                f"Embedding(sharded=True, embeddings_regularizer={embeddings_regularizer!r}): a "
                "sharded table is updated only in the rows a batch looks up, and a penalty on "
                "the whole table would touch every row each step. Use the optimizer's "
                "weight_decay= (applied to the rows looked up), or sparse_updates=False.")
        self.sharded, self.sparse_updates = sharded, sparse_updates
        for what, v in (("input_dim", input_dim), ("output_dim", output_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"Embedding({what}={v!r}) must be a positive int.")
        self.input_dim, self.output_dim = input_dim, output_dim
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.embeddings_regularizer = regularizers.get(embeddings_regularizer)
        if self.embeddings_regularizer is not None:
            self.regularized = (("embedding", self.embeddings_regularizer),)

    def get_config(self) -> dict:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim,
                "sharded": self.sharded, "sparse_updates": self.sparse_updates,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": initializers.serialize(self.embeddings_initializer),
                "embeddings_regularizer": regularizers.serialize(self.embeddings_regularizer),
                **super().get_config()}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        config = dict(config)
        config["embeddings_initializer"] = initializers.deserialize(
            config.get("embeddings_initializer", "random_uniform"))
        config["embeddings_regularizer"] = regularizers.deserialize(
            config.get("embeddings_regularizer"))
        return cls(**config)

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*input_shape, self.output_dim)

    def input_range(self) -> tuple[int, int]:
        return (0, self.input_dim)

    def output_mask(self, inputs: Any, mask: jax.Array | None) -> jax.Array | None:
        """With mask_zero=True, id 0 is padding: the mask is `ids != 0` (as Keras)."""
        return jnp.not_equal(inputs, 0) if self.mask_zero else None

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        return (TableEmbed if self.sparse_updates else IdEmbed)(
            self.input_dim, self.output_dim, rngs=rngs,
            embedding_init=self.embeddings_initializer,
            embedding_metadata={"out_sharding": ("table" if self.sharded else "vocab", "embed")})


class IdEmbed(nnx.Embed):
    """nnx.Embed that takes ids of a float dtype too (cast, as Keras's Embedding casts them;
    the host checks that they are whole numbers in range first)."""

    def __call__(self, inputs: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            inputs = inputs.astype(jnp.int32)
        return super().__call__(inputs, *args, **kwargs)


class TableEmbed(IdEmbed):
    """nnx.Embed whose rows are read with `lookup`, so a train step updates only the rows it
    read (same parameter, same name: checkpoints move between the two)."""

    def __call__(self, inputs: jax.Array, out_sharding: Any = None) -> jax.Array:
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            inputs = inputs.astype(jnp.int32)
        return lookup(self.embedding, inputs)


class Masking(Layer):
    """`Masking(mask_value=0.0)`: timesteps whose features all equal `mask_value` are padding;
    they are zeroed and masked for the layers after (as Keras)."""

    keeps_mask = True

    def __init__(self, mask_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(mask_value, bool) or not isinstance(mask_value, int | float):
            raise ConfigError(f"Masking(mask_value={mask_value!r}) must be a number.")
        self.mask_value = float(mask_value)

    def get_config(self) -> dict:
        return {"mask_value": self.mask_value, **super().get_config()}

    def output_mask(self, inputs: Any, mask: jax.Array | None) -> jax.Array | None:
        return jnp.any(jnp.not_equal(inputs, self.mask_value), axis=-1)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        value = self.mask_value
        return Fn(lambda x: x * jnp.any(jnp.not_equal(x, value), axis=-1,
                                        keepdims=True).astype(x.dtype))


class Lambda(Layer):
    """`Lambda(fn, output_shape=None)`: a function of jax.numpy on the input as a layer.

    Keras saves a Lambda's Python bytecode; podkit runs no code from files, so a model with
    a Lambda saves its weights, and its architecture comes from code (save() warns). Its
    output shape is worked out by tracing `fn` (`output_shape=` to state it)."""

    keeps_mask = False

    def __init__(self, function: Any, output_shape: Any = None, arguments: dict | None = None,
                 **kwargs: Any) -> None:
        if not callable(function):
            raise ConfigError(f"Lambda({function!r}) needs a function of the input.")
        kwargs.setdefault("name", None)
        super().__init__(**kwargs)
        self.function, self.arguments = function, dict(arguments or {})
        self.declared_shape = None if output_shape is None else tuple(output_shape)

    def get_config(self) -> dict:
        raise ConfigError(f"Lambda layer {self.name!r} holds Python code, which podkit does not "
                          "save: build the model from code and load_weights().")

    def _traced(self, shapes: list, many: bool, batch: int, length: int) -> Any:
        """The output of `fn` traced (shapes only) on a batch of `batch`, varying dims at
        `length`."""
        args = [jax.ShapeDtypeStruct((batch, *(length if d is None else d for d in s)),
                                     jnp.float32) for s in shapes]
        try:
            return jax.eval_shape(lambda *xs: self.function(xs if many else xs[0],
                                                            **self.arguments), *args)
        except Exception as e:
            raise ConfigError(f"Lambda {self.name!r} failed on inputs of shape "
                              f"{[(None, *s) for s in shapes]}: {type(e).__name__}: {e}. "
                              "Use jax.numpy inside a Lambda.") from e

    def output_shape(self, input_shape: Any) -> Any:
        """Traced twice, on batches of 5 and 7 (varying lengths at 8 and 9): the output must
        be one array whose first dim is the batch; a dim that follows a varying length is
        None, as Keras's."""
        many = isinstance(input_shape, list)
        shapes = input_shape if many else [input_shape]
        first, second = (self._traced(shapes, many, b, n) for b, n in ((5, 8), (7, 9)))
        if not isinstance(first, jax.ShapeDtypeStruct):
            raise ConfigError(f"Lambda {self.name!r} returns {type(first).__name__} "
                              f"{jax.tree.map(lambda a: (None, *a.shape[1:]), first)!r}; a "
                              "Lambda layer returns one array (split several outputs into "
                              "several Lambdas).")
        if first.ndim == 0 or first.shape[0] != 5 or second.shape[0] != 7:
            raise ConfigError(f"Lambda {self.name!r} returns shape {first.shape} for a batch "
                              f"of 5 inputs of shape {[(5, *s) for s in shapes]}: its output "
                              "must keep the batch as its first dim (slice axis 1 and after: "
                              "lambda t: t[:, :3]).")
        out = tuple(a if a == b else None
                    for a, b in zip(first.shape[1:], second.shape[1:], strict=True))
        if self.declared_shape is not None:
            declared = self.declared_shape
            if len(declared) != len(out) or any(d is not None and o is not None and d != o
                                                 for d, o in zip(declared, out, strict=True)):
                raise ConfigError(f"Lambda {self.name!r} declares output_shape={declared} "
                                  f"but returns {out}; fix output_shape, or leave it out "
                                  "(podkit traces the function).")
            return declared
        return out

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        fn, arguments = self.function, self.arguments
        return Fn(lambda *xs: fn(list(xs) if len(xs) > 1 else xs[0], **arguments))
