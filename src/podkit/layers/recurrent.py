"""Recurrent layers, Keras 3's: SimpleRNN, LSTM, GRU and Bidirectional.

    h = pk.layers.LSTM(64, return_sequences=True)(pk.layers.Embedding(V, 32, mask_zero=True)(x))

Each runs its time steps as one `lax.scan` (one compiled loop, never unrolled), over inputs of
(batch, time, features), the batch sharded like every layer's. The weights are Keras's, in its
layout and order (`kernel` (features, gates * units), `recurrent_kernel` (units, gates *
units), `bias`; gates i, f, c, o for LSTM and z, r, h for GRU), so `set_weights` with a Keras
layer's `get_weights()` gives Keras's outputs. Keras's masking: at a step the mask marks as
padding the state carries over and the output repeats the previous one (zeros with
`zero_output_for_mask`, which Bidirectional sets when returning sequences).

`dropout` and `recurrent_dropout` are Keras's too: while training, one mask per sequence (the
same at every step) on the inputs and one on the previous output where it meets the recurrent
kernel; with `recurrent_dropout` each gate draws its own pair, as Keras's implementation 1
(which Keras switches to whenever `recurrent_dropout` is set). The carry of an LSTM and the
GRU's update `z * h` see the state undropped, as in Keras.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
from jax import lax

from podkit import initializers, regularizers, serialization
from podkit.errors import ConfigError
from podkit.layers.base import (
    ACTIVATIONS,
    Layer,
    Shape,
    deserialize,
    flag,
    serialize,
)

GATES = {"SimpleRNN": 1, "LSTM": 4, "GRU": 3}


def _activation(name: Any, what: str) -> Callable[[jax.Array], jax.Array]:
    fn = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if name in (None, "linear"):
        return lambda x: x
    if fn is None:
        raise ConfigError(f"{what}={name!r}: valid names: {', '.join(sorted(ACTIVATIONS))}.")
    return fn


class RecurrentModule(nnx.Module):
    """The built weights of one recurrent layer and its scan (see the module docstring)."""

    def __init__(self, spec: RNN, input_dim: int, rngs: nnx.Rngs) -> None:
        kind, units = type(spec).__name__, spec.units
        gates = GATES[kind]
        self.kind, self.units = kind, units
        self.activation_name = spec.cell_activation
        self.recurrent_activation_name = spec.recurrent_activation
        self.return_sequences, self.return_state = spec.return_sequences, spec.return_state
        self.go_backwards, self.zero_output_for_mask = spec.go_backwards, spec.zero_output_for_mask
        self.reset_after = getattr(spec, "reset_after", False)
        self.use_bias = spec.use_bias
        self.dropout, self.recurrent_dropout = spec.dropout, spec.recurrent_dropout
        self.deterministic = False  # what nnx's train()/eval() (and training=) set
        if self.dropout or self.recurrent_dropout:
            self.rngs = (rngs if spec.seed is None else nnx.Rngs(dropout=spec.seed))[
                "dropout"].fork()
        self.kernel = nnx.Param(spec.kernel_initializer(rngs.params(), (input_dim, gates * units),
                                                        jnp.float32), out_sharding=("embed", "mlp"))
        self.recurrent_kernel = nnx.Param(
            spec.recurrent_initializer(rngs.params(), (units, gates * units), jnp.float32),
            out_sharding=(None, "mlp"))
        if spec.use_bias:
            if kind == "GRU" and self.reset_after:  # an input bias and a recurrent bias
                bias = spec.bias_initializer(rngs.params(), (2, gates * units), jnp.float32)
                axes: tuple = (None, "mlp")
            elif kind == "LSTM" and spec.unit_forget_bias:  # Keras: the forget gate's at 1
                key = rngs.params()
                bias = jnp.concatenate([spec.bias_initializer(key, (units,), jnp.float32),
                                        jnp.ones((units,), jnp.float32),
                                        spec.bias_initializer(key, (2 * units,), jnp.float32)])
                axes = ("mlp",)
            else:
                bias = spec.bias_initializer(rngs.params(), (gates * units,), jnp.float32)
                axes = ("mlp",)
            self.bias = nnx.Param(bias, out_sharding=axes)

    def _recurrent(self, h: jax.Array, rk: jax.Array, masks: jax.Array | None,
                   gates: range) -> jax.Array:
        """h @ rk for the `gates` (column blocks of rk); each gate's dropped h with its own
        mask under recurrent dropout, one fused product otherwise."""
        u = self.units
        block = rk[:, gates.start * u:gates.stop * u]
        if masks is None:
            return h @ block
        return jnp.concatenate([(h * masks[k]) @ rk[:, k * u:(k + 1) * u] for k in gates],
                               axis=-1)

    def _cell(self, xz: jax.Array, states: tuple[jax.Array, ...],
              masks: jax.Array | None = None) -> tuple[jax.Array, tuple]:
        """One step from the input's projection `xz` (biases in it, but GRU's recurrent one);
        `masks` (gates, batch, units) are the recurrent dropout's, None when it is off."""
        act = _activation(self.activation_name, "activation")
        rec = _activation(self.recurrent_activation_name, "recurrent_activation")
        u, h = self.units, states[0]
        rk = self.recurrent_kernel[...]
        if self.kind == "SimpleRNN":
            out = act(xz + self._recurrent(h, rk, masks, range(1)))
            return out, (out,)
        if self.kind == "LSTM":
            z = xz + self._recurrent(h, rk, masks, range(4))
            i, f, g, o = (z[..., k * u:(k + 1) * u] for k in range(4))
            c = rec(f) * states[1] + rec(i) * act(g)
            out = rec(o) * act(c)
            return out, (out, c)
        # GRU
        inner = self._recurrent(h, rk, masks, range(3 if self.reset_after else 2))
        if self.reset_after and self.use_bias:
            inner = inner + self.bias[...][1]
        z = rec(xz[..., :u] + inner[..., :u])
        r = rec(xz[..., u:2 * u] + inner[..., u:2 * u])
        if self.reset_after:
            hh = act(xz[..., 2 * u:] + r * inner[..., 2 * u:])
        else:
            hh_in = h if masks is None else h * masks[2]
            hh = act(xz[..., 2 * u:] + (r * hh_in) @ rk[:, 2 * u:])
        out = z * h + (1 - z) * hh
        return out, (out,)

    def _drop_masks(self, rate: float, count: int, shape: tuple[int, int]) -> jax.Array | None:
        """`count` dropout masks of `shape`, scaled by 1 / (1 - rate) as Keras's; None in
        inference or at rate 0."""
        if self.deterministic or not rate:
            return None
        keep = jax.random.bernoulli(self.rngs(), 1.0 - rate, (count, *shape))
        return keep.astype(jnp.float32) / (1.0 - rate)

    def _project(self, x: jax.Array, masks: jax.Array | None) -> jax.Array:
        """x @ kernel for every step; under input dropout each gate's columns see x times
        that gate's mask (one mask for every gate unless recurrent dropout is on)."""
        kernel = self.kernel[...]
        if masks is None:
            return x @ kernel
        if masks.shape[0] == 1:
            return (x * masks[0][:, None]) @ kernel
        u = self.units
        return jnp.concatenate([(x * masks[k][:, None]) @ kernel[:, k * u:(k + 1) * u]
                                for k in range(masks.shape[0])], axis=-1)

    def __call__(self, x: jax.Array, *initial_state: jax.Array,
                 mask: jax.Array | None = None) -> Any:
        """The sequence x (batch, time, features) from `initial_state` (Keras's: [h] or an
        LSTM's [h, c]; zeros when not given)."""
        batch, gates = x.shape[0], GATES[self.kind]
        per_gate = gates if self.recurrent_dropout else 1
        in_masks = self._drop_masks(self.dropout, per_gate, (batch, x.shape[-1]))
        rec_masks = self._drop_masks(self.recurrent_dropout, gates, (batch, self.units))
        xz = self._project(x.astype(jnp.float32), in_masks)
        if self.use_bias:
            bias = self.bias[...]
            xz = xz + (bias[0] if bias.ndim == 2 else bias)
        count = 2 if self.kind == "LSTM" else 1
        init = tuple(s.astype(jnp.float32) for s in initial_state) or tuple(
            jnp.zeros((batch, self.units), jnp.float32) for _ in range(count))
        xs = jnp.swapaxes(xz, 0, 1)  # time major for the scan
        masks = None if mask is None else jnp.swapaxes(mask.astype(bool), 0, 1)[..., None]

        def step(states: tuple, inputs: Any) -> tuple[tuple, jax.Array]:
            xt, mt = inputs
            out, new = self._cell(xt, states, rec_masks)
            if mt is None:
                return new, out
            keep = jnp.logical_not(mt)  # a padding step: nothing moves
            previous = jnp.zeros_like(out) if self.zero_output_for_mask else states[0]
            out = jnp.where(keep, previous, out)
            return tuple(jnp.where(keep, s, n) for s, n in zip(states, new, strict=True)), out

        states, outs = lax.scan(step, init, (xs, masks), reverse=self.go_backwards)
        if self.go_backwards:  # Keras returns the backward pass's outputs in its own order
            outs = jnp.flip(outs, axis=0)
        outs = jnp.swapaxes(outs, 0, 1)
        out = outs if self.return_sequences else outs[:, -1]
        return (out, *states) if self.return_state else out


class RNN(Layer):
    """Keras's recurrent layers' shared arguments (SimpleRNN, LSTM, GRU below)."""

    supports_masking = True
    mask_from_first = True  # the sequence's mask, next to initial states
    weight_order = ("kernel", "recurrent_kernel", "bias")
    initializer_keys = ("kernel_initializer", "recurrent_initializer", "bias_initializer")
    regularizer_keys = ("kernel_regularizer", "recurrent_regularizer", "bias_regularizer")

    def keras_weight_path(self, path: str) -> str:
        """Keras keeps the variables in the layer's cell: "lstm_cell/kernel"."""
        return f"{serialization.snake_case(type(self).__name__)}_cell/{path}"

    def __init__(self, units: int, activation: str | None = "tanh",
                 recurrent_activation: str = "sigmoid", use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform",
                 recurrent_initializer: Any = "orthogonal", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, recurrent_regularizer: Any = None,
                 bias_regularizer: Any = None, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, return_sequences: bool = False,
                 return_state: bool = False, go_backwards: bool = False,
                 stateful: bool = False, unroll: bool = False,
                 zero_output_for_mask: bool = False, seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        name = type(self).__name__
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ConfigError(f"{name}(units={units!r}) must be a positive int.")
        for what, v in (("use_bias", use_bias), ("return_sequences", return_sequences),
                        ("return_state", return_state), ("go_backwards", go_backwards),
                        ("zero_output_for_mask", zero_output_for_mask)):
            if not isinstance(v, bool):
                raise ConfigError(f"{name}({what}={v!r}) must be True or False.")
        for what, v in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
                raise ConfigError(f"{name}({what}={v!r}): a rate in [0, 1).")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"{name}(seed={seed!r}) must be an int or None.")
        if stateful:
            raise ConfigError(f"{name}(stateful=True): a state carried across batches is not "
                              "supported (batches are sharded over devices and resumed from "
                              "checkpoints); feed whole sequences.")
        if unroll:
            raise ConfigError(f"{name}(unroll=True): podkit runs the time steps as one "
                              "compiled loop (lax.scan), which XLA optimizes; leave unroll out.")
        _activation(activation, "activation")
        _activation(recurrent_activation, "recurrent_activation")
        self.units = units
        self.cell_activation = activation  # inside the cell: not applied after the layer
        self.recurrent_activation = recurrent_activation
        self.use_bias = use_bias
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.recurrent_initializer = initializers.get(recurrent_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = regularizers.get(recurrent_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.regularized = tuple((attr, r) for attr, r in (
            ("kernel", self.kernel_regularizer), ("recurrent_kernel", self.recurrent_regularizer),
            ("bias", self.bias_regularizer)) if r is not None and (attr != "bias" or use_bias))
        self.return_sequences, self.return_state = return_sequences, return_state
        self.go_backwards, self.zero_output_for_mask = go_backwards, zero_output_for_mask
        self.dropout, self.recurrent_dropout = float(dropout), float(recurrent_dropout)
        self.seed = seed
        self._with_state: bool | None = None  # called with initial_state (then inputs "many")

    @property
    def outputs_many(self) -> bool:
        return self.return_state

    def __call__(self, inputs: Any, initial_state: Any = None, training: bool | None = None,
                 mask: Any = None, **kwargs: Any) -> Any:
        """Keras's call: `layer(x)`, or `layer(x, initial_state=[h])` ([h, c] for an LSTM;
        an encoder's states for a decoder). A layer takes its states in every call or in
        none (its weights are built for one form)."""
        if kwargs:
            raise ConfigError(f"{type(self).__name__} {self.name!r} was called with "
                              f"{sorted(kwargs)}; a recurrent layer's call takes inputs, "
                              "initial_state=, training= and mask= only.")
        given = initial_state is not None
        if self._with_state is not None and self._with_state != given:
            raise ConfigError(f"{type(self).__name__} {self.name!r} was called "
                              f"{'with' if self._with_state else 'without'} initial_state "
                              "before; call it the same way each time, or use another layer.")
        self._with_state = given
        if not given:
            return super().__call__(inputs, training=training, mask=mask)
        states = list(initial_state) if isinstance(initial_state, list | tuple) else \
            [initial_state]
        if len(states) != self.state_count():
            raise ConfigError(f"{type(self).__name__} {self.name!r} takes initial_state as a "
                              f"list of {self.state_count()} tensors of shape (batch, "
                              f"{self.units}) ({'[h, c]' if self.state_count() == 2 else '[h]'}"
                              f"); got {len(states)}.")
        self.inputs = "many"
        return self.symbolic_call([inputs, *states],
                                  call_args={"training": training, "mask": mask})

    def _sequence_shape(self, input_shape: Any) -> Shape:
        """The sequence's shape; the initial states' (with initial_state) checked."""
        if not isinstance(input_shape, list):
            return input_shape
        for s in input_shape[1:]:
            if tuple(s) != (self.units,):
                raise ConfigError(f"{type(self).__name__} {self.name!r}: an initial state of "
                                  f"shape {(None, *s)}; each must be (batch, {self.units}).")
        return tuple(input_shape[0])

    def output_mask(self, inputs: Any, mask: jax.Array | None) -> jax.Array | None:
        """The steps' mask goes on with the sequence (return_sequences), as Keras's."""
        return mask if self.return_sequences else None

    def state_count(self) -> int:
        return 2 if isinstance(self, LSTM) else 1

    def output_shape(self, input_shape: Any) -> Any:
        input_shape = self._sequence_shape(input_shape)
        self.need_rank(input_shape, (3,))
        time = input_shape[0]
        out = (time, self.units) if self.return_sequences else (self.units,)
        if self.return_state:
            return [out, *[(self.units,)] * self.state_count()]
        return out

    def build(self, input_shape: Any, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return RecurrentModule(self, self._sequence_shape(input_shape)[-1], rngs)

    def get_config(self) -> dict:
        return {"units": self.units, "activation": self.cell_activation,
                "recurrent_activation": self.recurrent_activation, "use_bias": self.use_bias,
                "kernel_initializer": initializers.serialize(self.kernel_initializer),
                "recurrent_initializer": initializers.serialize(self.recurrent_initializer),
                "bias_initializer": initializers.serialize(self.bias_initializer),
                "kernel_regularizer": regularizers.serialize(self.kernel_regularizer),
                "recurrent_regularizer": regularizers.serialize(self.recurrent_regularizer),
                "bias_regularizer": regularizers.serialize(self.bias_regularizer),
                "return_sequences": self.return_sequences, "return_state": self.return_state,
                "go_backwards": self.go_backwards, "dropout": self.dropout,
                "recurrent_dropout": self.recurrent_dropout, "seed": self.seed,
                "zero_output_for_mask": self.zero_output_for_mask, **super().get_config()}


class SimpleRNN(RNN):
    """`SimpleRNN(units)`: h_t = activation(x_t W + h_{t-1} U + b)."""


class LSTM(RNN):
    """`LSTM(units)`, Keras's: gates i, f, c, o; `unit_forget_bias=True` starts the forget
    gate's bias at 1."""

    def __init__(self, units: int, unit_forget_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(units, **kwargs)
        self.unit_forget_bias = flag("LSTM", "unit_forget_bias", unit_forget_bias)

    def get_config(self) -> dict:
        return {"unit_forget_bias": self.unit_forget_bias, **super().get_config()}


class GRU(RNN):
    """`GRU(units, reset_after=True)`, Keras's: gates z, r, h; with `reset_after` (Keras's
    default) the reset gate is applied after the recurrent product and the bias is (2, 3 *
    units)."""

    def __init__(self, units: int, reset_after: bool = True, **kwargs: Any) -> None:
        super().__init__(units, **kwargs)
        self.reset_after = flag("GRU", "reset_after", reset_after)

    def get_config(self) -> dict:
        return {"reset_after": self.reset_after, **super().get_config()}


class BidirectionalModule(nnx.Module):
    def __init__(self, forward: nnx.Module, backward: nnx.Module, merge_mode: str | None,
                 return_sequences: bool, return_state: bool) -> None:
        self.forward_layer, self.backward_layer = forward, backward
        self.merge_mode, self.return_sequences = merge_mode, return_sequences
        self.return_state = return_state

    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> Any:
        f = self.forward_layer(x, mask=mask)
        b = self.backward_layer(x, mask=mask)
        f_out, f_states = (f[0], f[1:]) if self.return_state else (f, ())
        b_out, b_states = (b[0], b[1:]) if self.return_state else (b, ())
        if self.return_sequences:  # the backward pass's outputs back in input order
            b_out = jnp.flip(b_out, axis=1)
        mode = self.merge_mode
        if mode == "concat":
            out: Any = jnp.concatenate([f_out, b_out], axis=-1)
        elif mode == "sum":
            out = f_out + b_out
        elif mode == "mul":
            out = f_out * b_out
        elif mode == "ave":
            out = (f_out + b_out) / 2
        else:
            out = (f_out, b_out)
        if self.return_state:
            return (*(out if mode is None else (out,)), *f_states, *b_states)
        return out


class Bidirectional(Layer):
    """`Bidirectional(layer, merge_mode="concat", backward_layer=None)`, Keras's: the layer
    over the sequence and a copy of it (`go_backwards` flipped) over the reversed sequence,
    merged by "concat", "sum", "mul", "ave", or None (both, as a list). Weights: the
    forward layer's, then the backward layer's."""

    supports_masking = True

    def __init__(self, layer: RNN, merge_mode: str | None = "concat",
                 backward_layer: RNN | None = None, **kwargs: Any) -> None:
        if not isinstance(layer, RNN):
            raise ConfigError(f"Bidirectional({layer!r}) wraps a recurrent layer (LSTM, GRU, "
                              "SimpleRNN).")
        if merge_mode not in ("concat", "sum", "mul", "ave", None):
            raise ConfigError(f"Bidirectional(merge_mode={merge_mode!r}); valid values: "
                              "'concat', 'sum', 'mul', 'ave', None.")
        kwargs.setdefault("name", f"bidirectional_{layer.name}")
        super().__init__(**kwargs)
        self.forward_layer = layer
        if backward_layer is None:
            backward_layer = copy.copy(layer)
            backward_layer.name = f"backward_{layer.name}"
            backward_layer.go_backwards = not layer.go_backwards
        elif not isinstance(backward_layer, RNN) or \
                backward_layer.return_sequences != layer.return_sequences or \
                backward_layer.return_state != layer.return_state:
            raise ConfigError("Bidirectional(backward_layer=...) must be a recurrent layer "
                              "with the same return_sequences and return_state as the layer.")
        self.backward_layer = backward_layer
        for sub in (self.forward_layer, self.backward_layer):  # Keras forces it
            sub.zero_output_for_mask = layer.return_sequences
        self.merge_mode = merge_mode

    @property
    def weight_order(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(f"{side}.{w}" for side in ("forward_layer", "backward_layer")
                     for w in RNN.weight_order)

    @property
    def outputs_many(self) -> bool:
        return self.forward_layer.return_state or self.merge_mode is None

    def keras_weight_path(self, path: str) -> str:
        """Keras's: "forward_lstm/lstm_cell/kernel", "backward_lstm/lstm_cell/kernel"."""
        side, rest = path.split(".", 1)
        sub = getattr(self, side)
        name = sub.name if sub.name.startswith(side.split("_")[0] + "_") else \
            f"{side.split('_')[0]}_{sub.name}"
        return f"{name}/{sub.keras_weight_path(rest)}"

    def output_mask(self, inputs: Any, mask: jax.Array | None) -> jax.Array | None:
        return mask if self.forward_layer.return_sequences else None

    def output_shape(self, input_shape: Shape) -> Any:
        f = self.forward_layer.output_shape(input_shape)
        b = self.backward_layer.output_shape(input_shape)
        f_out, f_states = (f[0], f[1:]) if self.forward_layer.return_state else (f, [])
        b_out, b_states = (b[0], b[1:]) if self.forward_layer.return_state else (b, [])
        if self.merge_mode == "concat":
            outs = [(*f_out[:-1], f_out[-1] + b_out[-1])]
        elif self.merge_mode is None:
            outs = [f_out, b_out]
        else:
            outs = [f_out]
        if not self.outputs_many:
            return outs[0]
        return [*outs, *f_states, *b_states]

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return BidirectionalModule(self.forward_layer.build(input_shape, rngs),
                                   self.backward_layer.build(input_shape, rngs),
                                   self.merge_mode, self.forward_layer.return_sequences,
                                   self.forward_layer.return_state)

    def get_config(self) -> dict:
        return {"layer": serialize(self.forward_layer), "merge_mode": self.merge_mode,
                "backward_layer": serialize(self.backward_layer), **super().get_config()}

    @classmethod
    def from_config(cls, config: dict) -> Layer:
        config = dict(config)
        config["layer"] = deserialize(config["layer"])
        if config.get("backward_layer") is not None:
            config["backward_layer"] = deserialize(config["backward_layer"])
        return cls(**config)
