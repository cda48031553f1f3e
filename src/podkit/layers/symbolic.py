"""Symbolic tensors: what `pk.Input` returns and what a layer called on one returns.

    x = pk.Input((8,))              SymbolicTensor: shape (None, 8), no values
    h = pk.layers.Dense(4)(x)       Layer.__call__ -> call_layer: a node and its output shape

This sits below the layers: `Layer.__call__` records its call here, and `podkit.functional`
(above the layers) traces the recorded tensors into a graph. A layer is read only through the
few attributes in `CallableLayer`, so this module imports no layer.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from podkit import serialization
from podkit.errors import ConfigError, user_stacklevel

_ids = itertools.count()
_input_names = itertools.count()


class CallableLayer(Protocol):
    """What a call on symbolic tensors reads of a layer (podkit.layers.Layer has it)."""

    name: str
    inputs: str  # "one" or "many"
    input_kind: str  # "int" for id inputs (Embedding): the output is float32

    def output_shape(self, input_shape: Any) -> Sequence[int]: ...


class SymbolicTensor:
    """The output of a pk.Input or of a layer called in the functional API: a shape, a dtype
    and the node that makes it. It holds no values."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, layer: CallableLayer | None,
                 inputs: tuple[SymbolicTensor, ...], name: str,
                 options: tuple[tuple[str, Any], ...] = (),
                 parts: tuple[tuple[int, ...], ...] | None = None) -> None:
        self.shape = (None, *shape)
        #: the shapes of a layer's several outputs (LSTM(return_state=True)); the layer's
        #: call returns one tensor for each (podkit.layers.base.Item)
        self.parts = parts
        self.dtype = jnp.dtype(dtype)
        self.layer, self.inputs, self.name = layer, inputs, name
        #: the call's keyword options (`use_causal_mask`), passed to the built module
        self.options = options
        self.id = next(_ids)

    @property
    def spec(self) -> Any:
        """What a layer called on it is built for: the shape without the batch, or the
        shapes of the parts."""
        return list(self.parts) if self.parts is not None else self.shape[1:]

    def __repr__(self) -> str:
        return f"<SymbolicTensor {self.name} shape={self.shape} dtype={self.dtype.name}>"


def Input(shape: Sequence[int], dtype: Any = "float32", name: str | None = None
          ) -> SymbolicTensor:
    """A model input of `shape` (batch excluded), as `keras.Input`."""
    shape = (shape,) if isinstance(shape, int) or shape is None else tuple(shape)
    if not all(d is None or (isinstance(d, int) and not isinstance(d, bool) and d > 0)
               for d in shape):
        raise ConfigError(f"Input(shape={shape!r}): positive ints, batch excluded; None for a "
                          "dim that varies (a sequence length: one program per length "
                          "bucket).")
    dtype = input_dtype(dtype, f"pk.Input(shape={shape!r}, dtype={dtype!r})")
    _note_narrowed(dtype)
    n = next(_input_names)
    return SymbolicTensor(shape, dtype, None, (), name or ("input" if n == 0 else f"input_{n}"))


#: Why a model input cannot be strings, and the fix (pk.Input, a Keras file's string input).
STRINGS = ("podkit's models take numbers: strings never enter XLA, whose programs have no "
           "string type (Keras on JAX refuses them too). Turn text into ids in the input "
           "pipeline with pk.layers.TextVectorization, `ds.map(lambda x, y: (vectorize(x), "
           "y))`, and start the model at the ids: pk.Input((output_sequence_length,), "
           "dtype='int32').")
_STRING_NAMES = ("string", "str", "bytes", "unicode", "object")


def input_dtype(dtype: Any, owner: str) -> Any:
    """An input's dtype as numpy's: a name, a numpy/JAX dtype or Keras's serialized dtype
    policy; strings (Keras's "string") are a ConfigError naming TextVectorization in the
    pipeline, anything else not a dtype a ConfigError naming it."""
    name = serialization.dtype_name(dtype)
    if isinstance(name, str) and name.lower() in _STRING_NAMES:
        raise ConfigError(f"{owner}: {STRINGS}")
    try:
        out = jnp.dtype(name)
    except (TypeError, ValueError):
        raise ConfigError(f"{owner}: {name!r} is not a dtype; inputs are numbers, e.g. "
                          "'float32' (the default), 'int32' or 'int64' for ids.") from None
    if out.kind in "OSUV":
        raise ConfigError(f"{owner}: {STRINGS}")
    return out


class DtypeNote(UserWarning):
    """pk.Input declared a 64-bit dtype that JAX computes in 32 bits (jax_enable_x64 off)."""


_noted: set[str] = set()


def _note_narrowed(dtype: Any) -> None:
    """One note per process and dtype when an input's dtype is computed narrower (every
    tf.train.Example integer is int64), instead of JAX's truncation warning at each array
    made. The input keeps the declared dtype (its config, a saved .keras, says int64)."""
    declared = jnp.dtype(dtype)
    computed = jax.dtypes.canonicalize_dtype(declared)
    if computed == declared or declared.name in _noted:
        return
    _noted.add(declared.name)
    warnings.warn(
        f"podkit: pk.Input(dtype={declared.name!r}) is computed as {computed.name}: JAX runs "
        f"with 64-bit types off (jax_enable_x64), so values beyond {computed.name}'s range "
        "wrap. If they need 64 bits, set JAX_ENABLE_X64=1 in the environment (or "
        "jax.config.update('jax_enable_x64', True) before building the model).",
        DtypeNote, stacklevel=user_stacklevel())


class EagerScope(Protocol):
    """Where a layer called on arrays runs: a subclassed model's `call()` while it is built
    (the layer is built on its first call) or run (podkit.layers.subclass)."""

    def call(self, layer: Any, inputs: Any, options: dict[str, Any],
             call_args: dict[str, Any]) -> Any: ...


_scopes = threading.local()


@contextlib.contextmanager
def eager_scope(scope: EagerScope) -> Iterator[None]:
    """Layers called on arrays inside this block run in `scope`."""
    stack = _scopes.__dict__.setdefault("stack", [])
    stack.append(scope)
    try:
        yield
    finally:
        stack.pop()


def active_scope() -> EagerScope | None:
    stack = getattr(_scopes, "stack", None)
    return stack[-1] if stack else None


def call_layer(layer: CallableLayer, inputs: Any, options: dict[str, Any] | None = None,
               call_args: dict[str, Any] | None = None) -> Any:
    """`layer` called on symbolic `inputs` (one tensor, or a list for merge layers): the
    output tensor, its shape computed now so a misfit fails at the line that made it.
    `options`: keyword arguments of this call that are not tensors (MultiHeadAttention's
    `use_causal_mask`), JSON values handed to the built module as keywords. Called on arrays
    inside a subclassed model's `call()`, the layer runs there (`call_args`: Keras's
    `training=` and `mask=` of that call)."""
    many = isinstance(inputs, list | tuple)
    tensors = tuple(inputs) if many else (inputs,)
    symbolic = [isinstance(t, SymbolicTensor) for t in tensors]
    if not all(symbolic):
        scope = active_scope()
        if scope is not None and not any(symbolic):
            return scope.call(layer, inputs, dict(options or {}), dict(call_args or {}))
        raise ConfigError(
            f"layer {layer.name!r} was called on {type(tensors[0]).__name__}; podkit layers are "
            "called on pk.Input tensors (the functional API), listed in pk.Sequential([...]), "
            "or called in the call() of a pk.Model subclass. To compute outputs, build a "
            "model and call model.predict(x).")
    call_args = dict(call_args or {})
    if call_args.get("mask") is not None:
        raise ConfigError(f"layer {layer.name!r}: mask= applies to a call inside a pk.Model "
                          "subclass's call(); on pk.Input tensors masks come from the layers "
                          "(Embedding(mask_zero=True), Masking).")
    training = call_args.get("training")
    if training is not None:  # Keras's base_model(x, training=False): fixed for this call
        if not isinstance(training, bool):
            raise ConfigError(f"training={training!r} must be True, False or None.")
        options = {**(options or {}), "training": training}
    if (layer.inputs == "many") != many:
        raise ConfigError(f"layer {layer.name!r} ({type(layer).__name__}) takes "
                          + ("a list of tensors" if layer.inputs == "many" else "one tensor")
                          + f", not {'a list' if many else 'one tensor'}.")
    shapes = [t.spec for t in tensors]
    shape = layer.output_shape(list(shapes) if many else shapes[0])
    dtype = jnp.float32 if layer.input_kind == "int" else jnp.result_type(
        *(t.dtype for t in tensors))
    options_ = tuple(sorted((options or {}).items()))
    if isinstance(shape, list):  # several outputs: one tensor holds them all
        return SymbolicTensor((), dtype, layer, tensors, layer.name, options_,
                              parts=tuple(tuple(s) for s in shape))
    return SymbolicTensor(tuple(shape), dtype, layer, tensors, layer.name, options_)
