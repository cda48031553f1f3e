"""The base of podkit's layers: a Keras-style *spec* that builds a Flax NNX module.

A layer's constructor takes Keras's arguments; `build(input_shape, rngs)` returns the NNX
module that holds its parameters once the input shape is known. Parameters carry logical axis
names (`embed`, `mlp`, `vocab`) and never mesh axes, so the same layers run under every
strategy. Keras's common layer arguments are understood (`name`, `trainable`, `input_shape`,
`input_dim`); any other unknown argument is an error naming it, never ignored.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit import agree, initializers, regularizers, serialization
from podkit.errors import ConfigError
from podkit.layers.symbolic import SymbolicTensor, call_layer
from podkit.layers.variable import Variable, WeightStore

Shape = tuple[int, ...]

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array] | None] = {
    "linear": None,
    "relu": jax.nn.relu,
    "relu6": jax.nn.relu6,
    "sigmoid": jax.nn.sigmoid,
    "softmax": jax.nn.softmax,
    "log_softmax": jax.nn.log_softmax,
    "tanh": jnp.tanh,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # Keras's: the exact erf form
    "elu": jax.nn.elu,
    "selu": jax.nn.selu,
    "softplus": jax.nn.softplus,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    # Keras's activation: slope 0.2 (jax.nn.leaky_relu's default is 0.01; the LeakyReLU
    # layer takes its negative_slope, 0.3 by default, as Keras's)
    "leaky_relu": functools.partial(jax.nn.leaky_relu, negative_slope=0.2),
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


def one_int(value: Any, what: str) -> int:
    """A positive int, or a 1-tuple of one (Keras accepts both for 1D layers' sizes)."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}={value!r} must be a positive int.")
    return value


def padding_mode(padding: str) -> str:
    if not isinstance(padding, str) or padding.lower() not in ("valid", "same"):
        raise ConfigError(f"padding={padding!r}; valid values: 'valid', 'same'.")
    return padding.upper()


class Fn(nnx.Module):
    """A parameter-free layer: a pure function of its input(s)."""

    def __init__(self, fn: Callable[..., jax.Array]) -> None:
        self.fn = fn

    def __call__(self, *xs: jax.Array, **options: Any) -> jax.Array:
        return self.fn(*xs, **options)


CLASSES: dict[str, type[Layer]] = {}
"""podkit's layer classes by name (what a saved config names); each registers itself."""


def serialize(layer: Layer) -> dict:
    return serialization.to_config(layer, CLASSES, "layer")


def deserialize(config: dict) -> Layer:
    return serialization.from_config(config, CLASSES, "layer")


def check_float32(owner: str, dtype: Any) -> None:
    """A layer's (or a model's) `dtype`: None, float32, or Keras's serialized float32
    policy (every Keras 3 layer's config holds one); anything else is a ConfigError."""
    name = serialization.dtype_name(dtype)
    try:
        if name is None or jnp.dtype(name) == jnp.float32:
            return
    except (TypeError, ValueError):
        pass  # a policy such as "mixed_bfloat16" is no numpy dtype
    raise ConfigError(f"{owner}: dtype {name!r}; podkit's layers compute in float32 (mixed "
                      "precision is a model's setting, e.g. the GPT's precision="
                      "'mixed_bfloat16', not a layer's): leave dtype out, or use 'float32'.")


def flag(owner: str, what: str, value: Any) -> bool:
    """`value` if it is True or False; a ConfigError naming `owner(what=value)` otherwise
    (bool("no") is True: a string must not pass as a flag)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}({what}={value!r}) must be True or False.")
    return value


class Layer:
    """Base of the layer specs. Subclasses define `output_shape`, `build`, `get_config`.

    A layer of the user's (a subclass outside podkit) does too: `__init__(self, units,
    **kwargs)` passing `kwargs` (Keras's name, trainable, dtype) to `super().__init__`,
    `build(input_shape, rngs)` returning the NNX module that computes it, `get_config()` as
    `{**super().get_config(), "units": ...}`. Its weights are in Keras's order unless it sets
    `weight_order`: its module's `nnx.Param`s in the order they were made, then its other
    variables (`creation_order`), as a Keras layer's `add_weight` calls order them."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("podkit.") and not cls.__name__.startswith("_"):
            CLASSES[cls.__name__] = cls
        elif not cls.__module__.startswith("podkit.") and "build" in cls.__dict__ and not any(
                "weight_order" in klass.__dict__ for klass in cls.__mro__
                if klass is not Layer):
            # A user's layer that names no order: Keras's, the order its weights are made
            # in (podkit's own layers state theirs: `weight_order`).
            cls.build = _recording_creation_order(cls.build)  # type: ignore[method-assign]

    activation: str | None = None
    #: the layer reads a timestep mask (its module takes `mask=`): recurrent layers, pooling
    supports_masking: bool = False
    #: the output keeps the input's timestep mask (a layer that acts on each step alone)
    keeps_mask: bool = False
    #: called on several tensors, the first one's timestep mask is the layer's (an RNN's
    #: sequence next to its initial states)
    mask_from_first: bool = False
    #: the built module's variables in Keras's order (paths inside the module, "." between
    #: parts): what get_weights() lists; any other variable follows, by path
    weight_order: tuple[str, ...] = ("kernel", "bias")
    #: Keras's names of variables whose path in the built module differs (Embedding's
    #: `embedding` is Keras's `embeddings`): what `weights[i].name` / `.path` show
    keras_names: dict[str, str] = {}
    #: the class name a Keras file gave a layer of the user's registered class, where the
    #: podkit class is named otherwise: Keras names the layer's weight group after it
    keras_class_name: str | None = None
    _store: WeightStore | None = None
    #: "one" input tensor, or "many" (a list: Concatenate, Add)
    inputs: str = "one"
    #: dtype the layer expects as input; Embedding wants integers.
    input_kind: str = "float"
    #: (attribute of the built module, regularizer) pairs: penalties added to the loss
    regularized: tuple[tuple[str, regularizers.Regularizer], ...] = ()

    def __init__(self, name: str | None = None, trainable: bool = True,
                 input_shape: Sequence[int] | None = None, input_dim: int | None = None,
                 dtype: Any = None, **unknown: Any) -> None:
        check_float32(f"{type(self).__name__}(dtype=...)", dtype)
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

    def output_mask(self, inputs: Any, mask: jax.Array | None) -> jax.Array | None:
        """The timestep mask (batch, time) of the output, from the input and its mask: kept by
        layers that act on each step alone, made by Embedding(mask_zero=True) and Masking,
        dropped by the rest (as Keras propagates masks)."""
        return mask if self.keeps_mask else None

    def input_range(self) -> tuple[int, int] | None:
        """[low, high) of the integer ids the layer reads (Embedding: its rows), checked on
        the host before XLA sees a batch: an id out of range reads no row on an
        accelerator (NaN or another row, silently). None: any values."""
        return None

    def compute_mask(self, inputs: Any, mask: Any = None) -> jax.Array | None:
        """Keras's `layer.compute_mask(inputs)`: for a subclassed model's call() to pass on
        (`self.lstm(h, mask=self.embed.compute_mask(ids))`)."""
        return self.output_mask(inputs, mask)

    # -- the layer API (Keras's), once a model built the layer ---------------------------------
    def attach(self, store: WeightStore | None) -> None:
        """Called by the model that built this layer: where its variables live. Every model
        that holds the layer is remembered (weakly: the layer keeps no model alive)."""
        self._store = store
        if store is not None:
            self.__dict__.setdefault("_holders", weakref.WeakSet()).add(store)

    def holders(self) -> list[WeightStore]:
        """Each built model's copy of this layer's variables (a layer shared by models)."""
        return [store for store in self.__dict__.get("_holders", ()) if store.holds()]

    def share(self, arrays: Sequence[jax.Array], source: WeightStore | None = None) -> None:
        """Keras's shared layer is one set of variables in every model that holds it; here
        each built model holds its own, so after one changes them (fit, set_weights, a
        load) they are written into the others (but `source`, where they come from; only
        those whose shapes agree)."""
        shapes = [tuple(a.shape) for a in arrays]
        for other in self.holders():
            if other is not source and [tuple(a.shape) for a, _ in other.read()] == shapes:
                other.write(arrays)

    def _weights(self) -> list[tuple[jax.Array, bool]]:
        if self._store is None:
            raise ConfigError(f"layer {self.name!r} has no weights yet: it gets them when a "
                              "model that holds it is built (fit it, or model.build(...)).")
        return self._store.read()

    @property
    def weights(self) -> list[Variable]:
        """Every variable of the layer, in Keras's order (Dense: kernel, bias;
        BatchNormalization: gamma, beta, moving_mean, moving_variance), as `Variable`s that
        read the model's state when used (`.numpy()`, `.assign()`, `.name`, `.path`)."""
        self._weights()  # the error when the layer is not built
        return [Variable(self._store, i, self.keras_weight_path(name), self.name)
                for i, name in enumerate(self._store.names())]

    def keras_weight_path(self, path: str) -> str:
        """Keras's path, inside this layer, of the variable at `path` in the built module
        ("embeddings"; an LSTM's "lstm_cell/kernel"), as `layer.weights[i].path` shows it
        after the layer's name."""
        return self.keras_names.get(path, path.replace(".", "/"))

    @property
    def trainable_weights(self) -> list[Variable]:
        return [v for v in self.weights if v.trainable]

    @property
    def non_trainable_weights(self) -> list[Variable]:
        return [v for v in self.weights if not v.trainable]

    def get_weights(self) -> list[np.ndarray]:
        """The layer's variables as numpy arrays (writable copies, as Keras's), in
        `weights` order."""
        return [np.array(agree.gather(a)) for a, _ in self._weights()]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set the layer's variables from arrays in `get_weights()` order (as Keras)."""
        if self._store is None:
            self._weights()  # the error that says how to build it
        self._store.write(weights)
        self._store.changed()  # the other models that hold it (or nest its model) see them

    def count_params(self) -> int:
        return sum(int(np.prod(a.shape)) for a, _ in self._weights())

    def get_config(self) -> dict:
        """The constructor's arguments (what `model.save` writes; `from_config` reads)."""
        return {"name": self.name, "trainable": self.trainable}

    # Constructor arguments that get_config writes serialized: from_config reads them back.
    initializer_keys: tuple[str, ...] = ()
    regularizer_keys: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        config = dict(config)
        for keys, module in ((cls.initializer_keys, initializers),
                             (cls.regularizer_keys, regularizers)):
            for key in keys:
                if key in config:
                    config[key] = module.deserialize(config[key])
        return cls(**config)

    def __call__(self, inputs: Any, training: bool | None = None, mask: Any = None,
                 **kwargs: Any) -> Any:
        """Called on `pk.Input` tensors (the functional API): records the call and returns
        the symbolic output. Called on arrays in a pk.Model subclass's `call()`: runs there
        (`training` overrides the model's mode for this call, as Keras's; `mask` is the
        timestep mask of a layer that takes one)."""
        if kwargs:
            raise ConfigError(f"{type(self).__name__} {self.name!r} was called with "
                              f"{sorted(kwargs)}; this layer's call takes inputs, training= "
                              "and mask= only (docs/keras.md lists what podkit's layers "
                              "take).")
        return self.symbolic_call(inputs, call_args={"training": training, "mask": mask})

    def symbolic_call(self, inputs: Any, options: dict[str, Any] | None = None,
                      call_args: dict[str, Any] | None = None) -> Any:
        """call_layer, its several outputs split, and the call remembered on pk.Input
        tensors (Keras's `layer.input` / `layer.output`)."""
        out = split_parts(call_layer(self, inputs, options, call_args))
        if isinstance(out, SymbolicTensor) or (isinstance(out, list) and out and isinstance(
                out[0], SymbolicTensor)):
            self.record_call(inputs, out)
        return out

    def record_call(self, inputs: Any, outputs: Any) -> None:
        """Remember a call on pk.Input tensors (what `input` / `output` give): made by
        symbolic_call, and by a graph rebuilt from its config (load_model, clone_model)."""
        self._calls = [*getattr(self, "_calls", []), (inputs, outputs)]

    def _only_call(self, what: str) -> tuple[Any, Any]:
        calls = getattr(self, "_calls", [])
        if len(calls) != 1:
            raise ConfigError(
                f"layer {self.name!r}.{what}: the layer was called on pk.Input tensors "
                f"{len(calls)} times, and {what} names the tensor of its one call (as Keras); "
                + ("call it in a functional model (or a Sequential with a declared input) "
                   "first." if not calls else "keep the tensors of the call you want."))
        return calls[0]

    @property
    def input(self) -> Any:
        """The tensor(s) the layer was called on (its one call in the functional API)."""
        return self._only_call("input")[0]

    @property
    def output(self) -> Any:
        """The tensor(s) the layer gave (its one call): `pk.Model(model.input,
        model.get_layer("hidden").output)` is a feature extractor, as in Keras."""
        return self._only_call("output")[1]

    def weight_source(self) -> WeightStore | None:
        """Where the layer's variables live now (the model that built it last), if any."""
        return self._store

    def need_rank(self, input_shape: Shape, ranks: Sequence[int]) -> None:
        if len(input_shape) + 1 not in ranks:
            raise ConfigError(
                f"layer {self.name!r} ({type(self).__name__}) needs inputs of rank "
                f"{' or '.join(str(r) for r in ranks)} (batch included) but got shape "
                f"(batch, {', '.join(map(str, input_shape))}); add a Flatten or reshape the data.")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def creation_order(module: nnx.Module) -> tuple[str, ...]:
    """The paths ("." between parts) of a module's variables in Keras's order for a layer's
    own weights: the trainable ones (`nnx.Param`) in the order they were assigned (Keras's
    `add_weight` order), then the others in theirs. NNX's state sorts its keys, so the order
    is read from the module's attributes, which keep it."""
    params: list[str] = []
    others: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, nnx.Variable):
            (params if isinstance(node, nnx.Param) else others).append(prefix[:-1])
        elif isinstance(node, nnx.Pytree):
            for key, value in vars(node).items():
                if not key.startswith("_pytree__"):
                    walk(value, f"{prefix}{key}.")
        elif isinstance(node, list | tuple):
            for i, value in enumerate(node):
                walk(value, f"{prefix}{i}.")
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")

    walk(module, "")
    return (*params, *others)


def _recording_creation_order(build: Callable[..., nnx.Module]) -> Callable[..., nnx.Module]:
    """`build`, then the built module's `creation_order` kept as the layer's `weight_order`
    (what get_weights(), set_weights() and Keras's weight files follow)."""
    @functools.wraps(build)
    def recorded(self: Layer, *args: Any, **kwargs: Any) -> nnx.Module:
        module = build(self, *args, **kwargs)
        self.weight_order = creation_order(module)
        return module
    return recorded


def split_parts(out: Any) -> Any:
    """A symbolic tensor of several outputs as one tensor per output (Item layers read
    them); anything else as it is."""
    parts = getattr(out, "parts", None)
    if parts is None:
        return out
    return [Item(i, name=f"{out.name}_output_{i}")(out) for i in range(len(parts))]


class Item(Layer):
    """`Item(i)`: output i of a layer that gives several (LSTM(return_state=True)), made by
    calling that layer on pk.Input tensors."""

    weight_order = ()

    def __init__(self, index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(f"Item(index={index!r}) must be an int >= 0.")
        self.index = index

    def get_config(self) -> dict:
        return {"index": self.index, **super().get_config()}

    def output_shape(self, input_shape: Any) -> Shape:
        if not isinstance(input_shape, list | tuple) or self.index >= len(input_shape) or \
                not isinstance(input_shape[self.index], list | tuple):
            raise ConfigError(f"Item({self.index}) reads a layer of several outputs.")
        return tuple(input_shape[self.index])

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        index = self.index
        return Fn(lambda parts: parts[index])


class WeightedLayer(Layer):
    """A layer with a kernel and a bias: Keras's initializer and regularizer arguments."""

    initializer_keys = ("kernel_initializer", "bias_initializer")
    regularizer_keys = ("kernel_regularizer", "bias_regularizer")

    def __init__(self, *, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_bias = flag(type(self).__name__, "use_bias", use_bias)
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
