"""Keras 3's deterministic image preprocessing layers: Resizing and CenterCrop, and the base
of every image layer (podkit.layers.augmentation holds the random ones).

Images are channels-last (batch, height, width, channels) of a fixed height and width, in
any dtype; the layers compute in float32 and give float32, as Keras's. They run inside the
compiled step (podkit.layers.image_ops), so a model that resizes its input costs the host
nothing. Keras's `data_format="channels_first"` is refused by name: transpose the data
instead (podkit's convolutions are channels-last too).
"""

from __future__ import annotations

from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers import image_ops
from podkit.layers.base import Fn, Layer, Shape


def size_arg(owner: str, what: str, value: Any) -> int:
    """A height or width: a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{owner}({what}={value!r}): the {what} in pixels, a positive int.")
    return value


def choice(owner: str, what: str, value: Any, allowed: tuple[str, ...], note: str = "") -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{owner}({what}={value!r}); valid values: "
                          f"{', '.join(repr(a) for a in allowed)}.{note}")
    return value


def number(owner: str, what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{owner}({what}={value!r}) must be a number.")
    return float(value)


class ImageLayer(Layer):
    """An image layer: channels-last images of a fixed size, float32 out."""

    weight_order = ()

    def __init__(self, data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if data_format not in (None, "channels_last"):
            raise ConfigError(
                f"{type(self).__name__}(data_format={data_format!r}): podkit's image layers "
                "take channels-last images (batch, height, width, channels), as its "
                "convolutions do; transpose channels-first data in the pipeline, or with "
                "pk.layers.Permute((2, 3, 1)) before this layer.")

    def get_config(self) -> dict:
        return {"data_format": "channels_last", **super().get_config()}

    def image_size(self, input_shape: Shape) -> tuple[int, int, int]:
        """(height, width, channels) of the input, checked: rank 4 with the batch, the height
        and width known."""
        if len(input_shape) != 3:
            raise ConfigError(
                f"layer {self.name!r} ({type(self).__name__}) takes images (batch, height, "
                f"width, channels); got inputs of shape {(None, *input_shape)}. Give a "
                "grayscale image its channel axis (pk.layers.Reshape((height, width, 1))).")
        h, w, c = input_shape
        if h is None or w is None:
            raise ConfigError(
                f"layer {self.name!r} ({type(self).__name__}) needs a fixed height and width; "
                f"inputs of shape {(None, *input_shape)} vary: resize the images to one size "
                "in the input pipeline (pk.data) first, or declare it in pk.Input.")
        return h, w, c

    def output_shape(self, input_shape: Shape) -> Shape:
        self.image_size(input_shape)
        return input_shape


class Resizing(ImageLayer):
    """`Resizing(height, width, interpolation="bilinear", crop_to_aspect_ratio=False,
    pad_to_aspect_ratio=False, fill_mode="constant", fill_value=0.0, antialias=False)`:
    images resized to (height, width), as Keras's JAX backend resizes (`jax.image.resize`),
    after the largest centered crop of the target's aspect ratio or a padding to it."""

    def __init__(self, height: int, width: int, interpolation: str = "bilinear",
                 crop_to_aspect_ratio: bool = False, pad_to_aspect_ratio: bool = False,
                 fill_mode: str = "constant", fill_value: float = 0.0, antialias: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = "Resizing"
        self.height, self.width = size_arg(owner, "height", height), size_arg(owner, "width",
                                                                              width)
        self.interpolation = choice(
            owner, "interpolation", interpolation, image_ops.RESIZE_INTERPOLATIONS,
            " ('area', 'gaussian' and 'mitchellcubic' are Keras's TensorFlow backend's only.)")
        for what, value in (("crop_to_aspect_ratio", crop_to_aspect_ratio),
                            ("pad_to_aspect_ratio", pad_to_aspect_ratio),
                            ("antialias", antialias)):
            if not isinstance(value, bool):
                raise ConfigError(f"Resizing({what}={value!r}) must be True or False.")
        if crop_to_aspect_ratio and pad_to_aspect_ratio:
            raise ConfigError("Resizing(crop_to_aspect_ratio=True, pad_to_aspect_ratio=True): "
                              "one or the other (crop keeps the middle, pad keeps everything).")
        self.crop_to_aspect_ratio, self.pad_to_aspect_ratio = (crop_to_aspect_ratio,
                                                               pad_to_aspect_ratio)
        self.fill_mode = choice(owner, "fill_mode", fill_mode, ("constant",),
                                " (the padding of pad_to_aspect_ratio is fill_value.)")
        self.fill_value = number(owner, "fill_value", fill_value)
        self.antialias = antialias

    def get_config(self) -> dict:
        return {"height": self.height, "width": self.width,
                "interpolation": self.interpolation,
                "crop_to_aspect_ratio": self.crop_to_aspect_ratio,
                "pad_to_aspect_ratio": self.pad_to_aspect_ratio, "fill_mode": self.fill_mode,
                "fill_value": self.fill_value, "antialias": self.antialias,
                **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        *_, c = self.image_size(input_shape)
        return (self.height, self.width, c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return Fn(self.resize)

    def resize(self, images: jax.Array) -> jax.Array:
        return image_ops.resize(images.astype(jnp.float32), self.height, self.width,
                                self.interpolation, self.antialias, self.crop_to_aspect_ratio,
                                self.pad_to_aspect_ratio, self.fill_value)


def center_crop(images: jax.Array, height: int, width: int) -> jax.Array:
    """Keras's CenterCrop: the middle (height, width) window, or, where the image is smaller
    in either dim, the largest centered window of that aspect ratio resized to it
    (Keras's `smart_resize`, bilinear)."""
    images = images.astype(jnp.float32)
    h, w = images.shape[-3], images.shape[-2]
    if h >= height and w >= width:
        top, left = (h - height) // 2, (w - width) // 2
        return images[..., top:top + height, left:left + width, :]
    return image_ops.resize(images, height, width, crop_to_aspect_ratio=True)


class CenterCrop(ImageLayer):
    """`CenterCrop(height, width)`: the middle (height, width) window of each image; an image
    smaller than that in either dim is cropped to the target's aspect ratio and resized to
    it, as Keras does."""

    def __init__(self, height: int, width: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.height = size_arg("CenterCrop", "height", height)
        self.width = size_arg("CenterCrop", "width", width)

    def get_config(self) -> dict:
        return {"height": self.height, "width": self.width, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        *_, c = self.image_size(input_shape)
        return (self.height, self.width, c)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        height, width = self.height, self.width
        return Fn(lambda x: center_crop(x, height, width))
