"""Convolutions, Keras 3's, on channels-last inputs: Conv1D, Conv2D, Conv2DTranspose,
DepthwiseConv2D, SeparableConv2D. Kernels in Keras's layouts (Conv1D (k, in, filters),
Conv2D (kh, kw, in, filters), Conv2DTranspose (kh, kw, filters, in), DepthwiseConv2D
(kh, kw, in, depth_multiplier), SeparableConv2D's depthwise and pointwise kernels), so Keras's
weights load as they are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
from jax import lax

from podkit.errors import ConfigError
from podkit.layers.base import (
    Shape,
    WeightedLayer,
    activation_name,
    one_int,
    padding_mode,
    pair,
)


def spatial(hw: tuple[int, int], window: tuple[int, int], strides: tuple[int, int],
            padding: str) -> tuple[int, int]:
    if any(d is None for d in hw):  # a length that varies stays unknown
        return tuple(None if d is None else spatial((d,), (k,), (s,), padding)[0]
                     for d, k, s in zip(hw, window, strides, strict=True))  # type: ignore
    if padding == "SAME":
        return tuple(-(-d // s) for d, s in zip(hw, strides, strict=True))  # type: ignore
    out = tuple((d - k) // s + 1 for d, k, s in zip(hw, window, strides, strict=True))
    if min(out) < 1:
        raise ConfigError(
            f"a window of {window} does not fit inputs of spatial size {hw} with padding "
            "'valid'; use padding='same' or larger inputs.")
    return out  # type: ignore[return-value]


class Conv2D(WeightedLayer):
    """`Conv2D(filters, kernel_size, strides=1, padding="valid")` on NHWC inputs."""

    def __init__(self, filters: int, kernel_size: int | Sequence[int],
                 strides: int | Sequence[int] = 1, padding: str = "valid",
                 activation: str | None = None, use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, **kwargs)
        if isinstance(filters, bool) or not isinstance(filters, int) or filters < 1:
            raise ConfigError(f"Conv2D(filters={filters!r}): filters must be a positive int.")
        self.filters = filters
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.strides = pair(strides, "strides")
        self.padding = padding_mode(padding)
        self.activation = activation_name(activation)

    def get_config(self) -> dict:
        return {"filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding.lower(),
                "activation": self.activation, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        h, w, _ = input_shape
        return (*spatial((h, w), self.kernel_size, self.strides, self.padding), self.filters)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return nnx.Conv(
            input_shape[-1], self.filters, kernel_size=self.kernel_size, strides=self.strides,
            padding=self.padding, use_bias=self.use_bias, kernel_init=self.kernel_initializer,
            bias_init=self.bias_initializer, rngs=rngs,
            kernel_metadata={"out_sharding": (None, None, "embed", "mlp")},
            bias_metadata={"out_sharding": ("mlp",)})


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}={value!r} must be a positive int.")
    return value


class ConvModule(nnx.Module):
    """A convolution with Keras's kernel layout and lax's convolution (the layers below)."""

    def __init__(self, kernel: jax.Array, bias: jax.Array | None, run: Any,
                 kernel_axes: tuple, names: tuple[str, ...] = ("kernel",)) -> None:
        self.run = run  # (x, *kernels) -> y, static
        self.names = names
        setattr(self, names[0], nnx.Param(kernel, out_sharding=kernel_axes))
        if bias is not None:
            self.bias = nnx.Param(bias, out_sharding=("mlp",))
        self.has_bias = bias is not None

    def add_kernel(self, name: str, value: jax.Array, axes: tuple) -> None:
        setattr(self, name, nnx.Param(value, out_sharding=axes))
        self.names = (*self.names, name)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.run(x.astype(jnp.float32), *(getattr(self, n)[...] for n in self.names))
        return y + self.bias[...] if self.has_bias else y


class Conv1D(WeightedLayer):
    """`Conv1D(filters, kernel_size, strides=1, padding="valid", dilation_rate=1)` on
    (batch, steps, channels); padding "valid", "same" or "causal" (left-padded, as Keras)."""

    def __init__(self, filters: int, kernel_size: int | Sequence[int], strides: Any = 1,
                 padding: str = "valid", dilation_rate: Any = 1,
                 activation: str | None = None, use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, **kwargs)
        self.filters = _positive(filters, "Conv1D(filters")
        self.kernel_size = one_int(kernel_size, "Conv1D(kernel_size")
        self.strides = one_int(strides, "Conv1D(strides")
        self.dilation_rate = one_int(dilation_rate, "Conv1D(dilation_rate")
        if not isinstance(padding, str) or padding.lower() not in ("valid", "same", "causal"):
            raise ConfigError(f"Conv1D(padding={padding!r}); valid values: 'valid', 'same', "
                              "'causal'.")
        self.padding = padding.lower()
        self.activation = activation_name(activation)

    def get_config(self) -> dict:
        return {"filters": self.filters, "kernel_size": [self.kernel_size],
                "strides": [self.strides], "padding": self.padding,
                "dilation_rate": [self.dilation_rate], "activation": self.activation,
                **super().get_config()}

    def _pads(self) -> Any:
        span = (self.kernel_size - 1) * self.dilation_rate
        return [(span, 0)] if self.padding == "causal" else self.padding.upper()

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (3,))
        steps = input_shape[0]
        span = (self.kernel_size - 1) * self.dilation_rate + 1
        if steps is None:
            return (None, self.filters)
        if self.padding == "valid":
            out = (steps - span) // self.strides + 1
            if out < 1:
                raise ConfigError(f"Conv1D {self.name!r}: a kernel spanning {span} steps does "
                                  f"not fit {steps} steps with padding 'valid'.")
        else:
            out = -(-steps // self.strides)
        return (out, self.filters)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        shape = (self.kernel_size, input_shape[-1], self.filters)
        kernel = self.kernel_initializer(rngs.params(), shape, jnp.float32)
        bias = self.bias_initializer(rngs.params(), (self.filters,), jnp.float32) \
            if self.use_bias else None
        strides, pads, dilation = (self.strides,), self._pads(), (self.dilation_rate,)
        return ConvModule(kernel, bias, lambda x, k: lax.conv_general_dilated(
            x, k, strides, pads, rhs_dilation=dilation, dimension_numbers=("NWC", "WIO", "NWC")),
            (None, "embed", "mlp"))


def _hwio_conv(strides: tuple, padding: str, dilation: tuple = (1, 1), groups: int = 1) -> Any:
    return lambda x, k: lax.conv_general_dilated(
        x, k, strides, padding, rhs_dilation=dilation, feature_group_count=groups,
        dimension_numbers=("NHWC", "HWIO", "NHWC"))


class Conv2DTranspose(WeightedLayer):
    """`Conv2DTranspose(filters, kernel_size, strides=1, padding="valid",
    output_padding=None, dilation_rate=1)`, Keras's: kernel (kh, kw, filters, in), the
    output size Keras's (`(in - 1) * stride + max(kernel, stride)` for "valid", `in *
    stride` for "same" without output_padding)."""

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1,
                 padding: str = "valid", output_padding: Any = None, dilation_rate: Any = 1,
                 activation: str | None = None, use_bias: bool = True, **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, **kwargs)
        self.filters = _positive(filters, "Conv2DTranspose(filters")
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.strides = pair(strides, "strides")
        self.dilation_rate = pair(dilation_rate, "dilation_rate")
        self.output_padding = None if output_padding is None else (
            (output_padding,) * 2 if isinstance(output_padding, int) else
            tuple(output_padding))
        if self.output_padding is not None and (len(self.output_padding) != 2 or any(
                not isinstance(p, int) or p < 0 for p in self.output_padding)):
            raise ConfigError(f"Conv2DTranspose(output_padding={output_padding!r}): an int "
                              ">= 0 or a pair of them.")
        self.padding = padding_mode(padding)
        self.activation = activation_name(activation)

    def get_config(self) -> dict:
        return {"filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding.lower(),
                "output_padding": None if self.output_padding is None else
                list(self.output_padding), "dilation_rate": list(self.dilation_rate),
                "activation": self.activation, **super().get_config()}

    def _pads(self) -> list[tuple[int, int]]:
        """Keras's padding arguments for lax.conv_transpose (its JAX backend's rule)."""
        out = []
        for i in range(2):
            k = (self.kernel_size[i] - 1) * self.dilation_rate[i] + 1
            s = self.strides[i]
            extra = None if self.output_padding is None else self.output_padding[i]
            if self.padding == "VALID":
                extra = max(k, s) - k if extra is None else extra
                out.append((k - 1, k - 1 + extra))
            else:
                total = s + k - 2 if extra is None else k + k % 2 - 2 + extra
                left = min(total // 2 + total % 2, k - 1)
                out.append((left, total - left))
        return out

    def _run(self) -> Any:
        strides, pads, dilation = self.strides, self._pads(), self.dilation_rate
        return lambda x, k: lax.conv_transpose(
            x, k, strides, pads, rhs_dilation=dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"), transpose_kernel=True)

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        h, w, c = input_shape
        kernel = jax.ShapeDtypeStruct((*self.kernel_size, self.filters, c), jnp.float32)
        out = jax.eval_shape(self._run(), jax.ShapeDtypeStruct((1, h, w, c), jnp.float32),
                             kernel)
        if min(out.shape[1:3]) < 1:
            raise ConfigError(f"Conv2DTranspose {self.name!r} gives an empty output for "
                              f"inputs of shape {(None, *input_shape)}.")
        return tuple(out.shape[1:])

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        shape = (*self.kernel_size, self.filters, input_shape[-1])
        kernel = self.kernel_initializer(rngs.params(), shape, jnp.float32)
        bias = self.bias_initializer(rngs.params(), (self.filters,), jnp.float32) \
            if self.use_bias else None
        return ConvModule(kernel, bias, self._run(), (None, None, "mlp", "embed"))


class DepthwiseConv2D(WeightedLayer):
    """`DepthwiseConv2D(kernel_size, strides=1, padding="valid", depth_multiplier=1)`:
    each input channel convolved with its own `depth_multiplier` kernels (kernel (kh, kw, in,
    depth_multiplier), as Keras; `depthwise_initializer` is Keras's name for its
    initializer)."""

    initializer_keys = (*WeightedLayer.initializer_keys, "depthwise_initializer",
                        "pointwise_initializer")
    regularizer_keys = (*WeightedLayer.regularizer_keys, "depthwise_regularizer",
                        "pointwise_regularizer")

    def __init__(self, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 depth_multiplier: int = 1, dilation_rate: Any = 1,
                 activation: str | None = None, use_bias: bool = True,
                 depthwise_initializer: Any = "glorot_uniform",
                 depthwise_regularizer: Any = None, **kwargs: Any) -> None:
        super().__init__(use_bias=use_bias, kernel_initializer=depthwise_initializer,
                         kernel_regularizer=depthwise_regularizer, **kwargs)
        self.kernel_size = pair(kernel_size, "kernel_size")
        self.strides = pair(strides, "strides")
        self.dilation_rate = pair(dilation_rate, "dilation_rate")
        self.depth_multiplier = _positive(depth_multiplier, "depth_multiplier")
        self.padding = padding_mode(padding)
        self.activation = activation_name(activation)

    def get_config(self) -> dict:
        config = super().get_config()
        config["depthwise_initializer"] = config.pop("kernel_initializer")
        config["depthwise_regularizer"] = config.pop("kernel_regularizer")
        return {"kernel_size": list(self.kernel_size), "strides": list(self.strides),
                "padding": self.padding.lower(), "depth_multiplier": self.depth_multiplier,
                "dilation_rate": list(self.dilation_rate), "activation": self.activation,
                **config}

    def output_shape(self, input_shape: Shape) -> Shape:
        self.need_rank(input_shape, (4,))
        h, w, c = input_shape
        span = tuple((k - 1) * d + 1 for k, d in zip(self.kernel_size, self.dilation_rate,
                                                      strict=True))
        return (*spatial((h, w), span, self.strides, self.padding), c * self.depth_multiplier)

    def _depthwise(self, channels: int) -> Any:
        run = _hwio_conv(self.strides, self.padding, self.dilation_rate, channels)
        return lambda x, k: run(x, k.reshape(*k.shape[:2], 1, -1))

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        c = input_shape[-1]
        kernel = self.kernel_initializer(rngs.params(), (*self.kernel_size, c,
                                                         self.depth_multiplier), jnp.float32)
        bias = self.bias_initializer(rngs.params(), (c * self.depth_multiplier,),
                                     jnp.float32) if self.use_bias else None
        return ConvModule(kernel, bias, self._depthwise(c), (None, None, "mlp", None))


class SeparableConv2D(DepthwiseConv2D):
    """`SeparableConv2D(filters, kernel_size, strides=1, padding="valid",
    depth_multiplier=1)`: a depthwise convolution, then a 1x1 one to `filters` (weights
    depthwise_kernel, pointwise_kernel, bias, as Keras)."""

    weight_order = ("depthwise_kernel", "pointwise_kernel", "bias")

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1,
                 padding: str = "valid", depth_multiplier: int = 1, dilation_rate: Any = 1,
                 activation: str | None = None, use_bias: bool = True,
                 depthwise_initializer: Any = "glorot_uniform",
                 pointwise_initializer: Any = "glorot_uniform",
                 depthwise_regularizer: Any = None, pointwise_regularizer: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(kernel_size, strides, padding, depth_multiplier, dilation_rate,
                         activation, use_bias, depthwise_initializer, depthwise_regularizer,
                         **kwargs)
        from podkit import initializers, regularizers

        self.filters = _positive(filters, "SeparableConv2D(filters")
        self.pointwise_initializer = initializers.get(pointwise_initializer)
        self.pointwise_regularizer = regularizers.get(pointwise_regularizer)
        self.regularized = tuple(
            ("depthwise_kernel" if attr == "kernel" else attr, r)
            for attr, r in self.regularized) + (
            (("pointwise_kernel", self.pointwise_regularizer),)
            if self.pointwise_regularizer is not None else ())

    def get_config(self) -> dict:
        from podkit import initializers, regularizers

        return {"filters": self.filters,
                "pointwise_initializer": initializers.serialize(self.pointwise_initializer),
                "pointwise_regularizer": regularizers.serialize(self.pointwise_regularizer),
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        return (*super().output_shape(input_shape)[:2], self.filters)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        c = input_shape[-1]
        depthwise = self.kernel_initializer(rngs.params(), (*self.kernel_size, c,
                                                            self.depth_multiplier), jnp.float32)
        pointwise = self.pointwise_initializer(
            rngs.params(), (1, 1, c * self.depth_multiplier, self.filters), jnp.float32)
        bias = self.bias_initializer(rngs.params(), (self.filters,), jnp.float32) \
            if self.use_bias else None
        first = self._depthwise(c)
        second = _hwio_conv((1, 1), "VALID")
        module = ConvModule(depthwise, bias, lambda x, d, p: second(first(x, d), p),
                            (None, None, "mlp", None), names=("depthwise_kernel",))
        module.add_kernel("pointwise_kernel", pointwise, (None, None, None, "mlp"))
        return module
