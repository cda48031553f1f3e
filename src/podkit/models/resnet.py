"""ResNet-18/34/50 (He et al. 2016) in Flax NNX, with logical axes on every parameter.

    image -> stem -> 4 stages of residual blocks (width, 2w, 4w, 8w channels; stages 2-4
    halve the resolution) -> global average pool -> Dense -> logits (B, classes), float32

Depth 18 and 34 use basic blocks (two 3x3 convs), 50 bottlenecks (1x1, 3x3, 1x1 with 4x
expansion; the stride on the 3x3, as torchvision's "v1.5"). A shortcut is a 1x1 conv + BN
when the shape changes, else the identity. Images of at most 64 px get the CIFAR stem (one
3x3 conv, stride 1, no max-pool: an 8x8 or 32x32 image cannot afford a 4x downsampling),
larger ones the ImageNet stem (7x7 conv, stride 2, 3x3 max-pool, stride 2). Flat inputs
(B, H*W*C), such as the digits' 64 pixels, are reshaped to the data's image shape.

Logical axes: conv kernels (kh, kw, in, out) are (None, None, "embed", "mlp"): the channels
coming in are the network's width (`embed`, split by FSDP), those going out are split by
tensor parallelism (`mlp`); BatchNorm follows its conv's output channels ("mlp"). Two such
convs in a row are fine under XLA: they are annotations, and under tensor parallelism the
partitioner gathers a conv's output channels before the next conv needs them (Megatron's
alternation buys nothing here: BatchNorm and the residual sit between every pair of convs).
The stem's kernel takes the image's 1 or 3 channels, which no mesh axis divides, so its `in`
dim is None (it is the one small weight without `embed`: 3*3*3*w numbers).

Mixed precision ("mixed_bfloat16"): float32 parameters, bfloat16 convolutions and
classifier; BatchNorm normalizes in float32 (its statistics need the digits) and hands
bfloat16 on; the logits come back as float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from podkit.config import ResNetConfig
from podkit.errors import ConfigError
from podkit.models.common import dtypes, remat_policy, rematerialize

# depth -> (blocks per stage, bottleneck?)
LAYOUTS: dict[int, tuple[tuple[int, ...], bool]] = {
    18: ((2, 2, 2, 2), False),
    34: ((3, 4, 6, 3), False),
    50: ((3, 4, 6, 3), True),
}
SMALL_IMAGE = 64  # px: at most this (height and width) gets the CIFAR stem
EXPANSION = 4  # a bottleneck's output channels / its width

# He init for ReLU networks, fan_out as torchvision's ResNet.
_CONV_INIT = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")


class ConvBN(nnx.Module):
    """A bias-free conv followed by BatchNorm (the pair every ResNet layer is made of)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, rngs: nnx.Rngs,
                 dtype: Any, param_dtype: Any, in_axis: str | None = "embed") -> None:
        pad = (kernel - 1) // 2  # torch's symmetric padding ("SAME" pads stride 2 unevenly)
        self.conv = nnx.Conv(cin, cout, (kernel, kernel), strides=stride,
                             padding=((pad, pad), (pad, pad)), use_bias=False, dtype=dtype,
                             param_dtype=param_dtype, kernel_init=_CONV_INIT, rngs=rngs,
                             kernel_metadata={"out_sharding": (None, None, in_axis, "mlp")})
        # momentum 0.9 (torch's 0.1): running statistics settle within a few dozen steps,
        # so a short run evaluates well; float32 normalization under mixed precision.
        self.bn = nnx.BatchNorm(cout, momentum=0.9, epsilon=1e-5, dtype=jnp.float32,
                                param_dtype=param_dtype, rngs=rngs,
                                scale_metadata={"out_sharding": ("mlp",)},
                                bias_metadata={"out_sharding": ("mlp",)})
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.bn(self.conv(x)).astype(self.dtype)


class BasicBlock(nnx.Module):
    """Two 3x3 convs and a shortcut (ResNet-18/34)."""

    def __init__(self, cin: int, width: int, stride: int, rngs: nnx.Rngs, dtype: Any,
                 param_dtype: Any) -> None:
        self.conv1 = ConvBN(cin, width, 3, stride, rngs, dtype, param_dtype)
        self.conv2 = ConvBN(width, width, 3, 1, rngs, dtype, param_dtype)
        self.shortcut = _shortcut(cin, width, stride, rngs, dtype, param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv2(jax.nn.relu(self.conv1(x)))
        return jax.nn.relu(h + (x if self.shortcut is None else self.shortcut(x)))


class Bottleneck(nnx.Module):
    """1x1 down to `width`, 3x3 (strided), 1x1 up to 4 * width, and a shortcut (ResNet-50)."""

    def __init__(self, cin: int, width: int, stride: int, rngs: nnx.Rngs, dtype: Any,
                 param_dtype: Any) -> None:
        cout = width * EXPANSION
        self.conv1 = ConvBN(cin, width, 1, 1, rngs, dtype, param_dtype)
        self.conv2 = ConvBN(width, width, 3, stride, rngs, dtype, param_dtype)
        self.conv3 = ConvBN(width, cout, 1, 1, rngs, dtype, param_dtype)
        self.shortcut = _shortcut(cin, cout, stride, rngs, dtype, param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.conv1(x))
        h = self.conv3(jax.nn.relu(self.conv2(h)))
        return jax.nn.relu(h + (x if self.shortcut is None else self.shortcut(x)))


def _shortcut(cin: int, cout: int, stride: int, rngs: nnx.Rngs, dtype: Any,
              param_dtype: Any) -> ConvBN | None:
    """A 1x1 projection where the block changes shape (He et al.'s option B), else None."""
    if stride == 1 and cin == cout:
        return None
    return ConvBN(cin, cout, 1, stride, rngs, dtype, param_dtype)


class ResNet(nnx.Module):
    """`__call__(images) -> logits (B, classes)` float32. `images`: (B, H, W, C), or flat
    (B, H*W*C), or (B, H, W) for one channel; shaped as `image_shape`."""

    def __init__(self, config: ResNetConfig, classes: int, image_shape: Sequence[int],
                 rngs: nnx.Rngs, pixel_mean: Sequence[float] | None = None,
                 pixel_std: Sequence[float] | None = None) -> None:
        check_config(config)
        image_shape = _image_shape(image_shape)
        dtype, param_dtype = dtypes(config.precision)
        blocks_per_stage, bottleneck = LAYOUTS[config.depth]
        height, width, channels = image_shape
        self.image_shape, self.dtype = image_shape, dtype
        if (pixel_mean is None) != (pixel_std is None):
            raise ConfigError(f"pixel_mean = {pixel_mean!r} and pixel_std = {pixel_std!r}: "
                              "give both (the ResNet normalises uint8 pixels with them) or "
                              "neither.")
        # uint8 pixels normalised here, on the device (data.image_dtype = "uint8"): tuples, so
        # they are constants of the compiled step, computed as the host's normalise computes.
        self.pixel_mean = None if pixel_mean is None else tuple(float(v) for v in pixel_mean)
        self.pixel_std = None if pixel_std is None else tuple(float(v) for v in pixel_std)
        self.small = max(height, width) <= SMALL_IMAGE
        w = config.width
        # The image's channels: no mesh axis divides 1 or 3, so that dim is not split.
        self.stem = ConvBN(channels, w, 3 if self.small else 7, 1 if self.small else 2, rngs,
                           dtype, param_dtype, in_axis=None)
        block_cls = Bottleneck if bottleneck else BasicBlock
        expansion = EXPANSION if bottleneck else 1
        blocks, cin = [], w
        for stage, count in enumerate(blocks_per_stage):
            stage_width = w * 2 ** stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(block_cls(cin, stage_width, stride, rngs, dtype, param_dtype))
                cin = stage_width * expansion
        self.blocks = nnx.List(blocks)
        # ("embed", None): the pooled features are the width (FSDP splits them); the class
        # dim stays whole. Splitting it ("mlp" or "vocab": tensor parallelism) saves next to
        # nothing and needs `classes` divisible by the model axis, which 10 classes on a
        # model axis of 4 are not (the layout would be refused).
        self.head = nnx.Linear(cin, classes, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                               kernel_metadata={"out_sharding": ("embed", None)},
                               bias_metadata={"out_sharding": (None,)})
        self.remat = config.remat

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self._as_images(images)
        if self.pixel_mean is not None:
            inverse = 1.0 / np.asarray(self.pixel_std, np.float32)
            x = (x.astype(jnp.float32) - np.asarray(self.pixel_mean, np.float32)) * inverse
        x = x.astype(self.dtype)
        x = jax.nn.relu(self.stem(x))
        if not self.small:
            x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        # Each residual block is one remat unit: its activations are recomputed from its input
        # in the backward pass (what is kept inside follows the policy).
        run = rematerialize(lambda block, h: block(h), self.remat)
        for block in self.blocks:
            x = run(block, x)
        pooled = x.astype(jnp.float32).mean(axis=(1, 2)).astype(self.dtype)
        return self.head(pooled).astype(jnp.float32)

    def _as_images(self, x: jax.Array) -> jax.Array:
        shape = self.image_shape
        if x.ndim == 2 and x.shape[1] == math.prod(shape):
            return x.reshape(x.shape[0], *shape)
        if x.ndim == 3 and shape[2] == 1 and tuple(x.shape[1:]) == shape[:2]:
            return x[..., None]
        if tuple(x.shape[1:]) != shape:
            raise ConfigError(f"the ResNet was built for images of shape {shape} (or flat "
                              f"{math.prod(shape)} values); it got a batch of shape "
                              f"{tuple(x.shape)}. Build it with the data's info "
                              "['image_shape'].")
        return x


def _image_shape(shape: Any) -> tuple[int, int, int]:
    shape = tuple(shape)
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3 or not all(isinstance(d, int) and d >= 1 for d in shape):
        raise ConfigError(f"image_shape = {shape!r}; a ResNet needs (height, width, channels) "
                          "of positive ints, e.g. (32, 32, 3).")
    return shape


def check_config(config: ResNetConfig) -> None:
    """ConfigErrors naming the bad value and the fix (the TOML loader checks choices too;
    this covers configs made in Python)."""
    if config.depth not in LAYOUTS:
        raise ConfigError(f"model.depth = {config.depth!r}; a ResNet has depth "
                          f"{', '.join(map(str, LAYOUTS))}.")
    if isinstance(config.width, bool) or not isinstance(config.width, int) or config.width < 1:
        raise ConfigError(f"model.width = {config.width!r}; use a positive int (64 is the "
                          "paper's; 8-16 trains fast on a CPU).")
    dtypes(config.precision)
    if config.remat != "none":
        remat_policy(config.remat)


def build_resnet(config: ResNetConfig, info: dict, seed: int = 0) -> Any:
    """An uncompiled pk.Model of a ResNet sized by `config`, its classes and image shape from
    the data (`info["classes"]`, `info["image_shape"]`)."""
    from podkit.model import Model

    for key in ("classes", "image_shape"):
        if key not in info:
            raise ConfigError(f"model.name = 'resnet' needs image data with {key!r} in its "
                              "info ([data] name = 'images' or 'digits'); this data has "
                              f"{sorted(info)}.")
    check_config(config)
    classes, image_shape = int(info["classes"]), _image_shape(info["image_shape"])
    if classes < 2:
        raise ConfigError(f"the data has classes = {classes}; a classifier needs >= 2.")
    mean, std = info.get("pixel_mean"), info.get("pixel_std")
    return Model(lambda rngs: ResNet(config, classes, image_shape, rngs, mean, std), seed=seed,
                 name="resnet")
