"""Keras 3's random image augmentation layers: RandomFlip, RandomCrop, RandomRotation,
RandomZoom, RandomTranslation, RandomContrast, RandomBrightness.

Each layer is two pure functions and Keras's arguments:

    params = layer.draw(key, images.shape)      # the random draw (Keras's
                                                # get_random_transformation, same quantities)
    images = layer.transform(images, params)    # the augmentation given the draw (Keras's
                                                # transform_images in training)

The built module (`Augment`) draws from the model's "dropout" random stream (or the layer's
own `seed`), an NNX RngStream in the TrainState's `rng`: its counter advances once per call,
so each step of a compiled `lax.scan` draws anew, two fits from the same seed draw the same,
and a checkpoint (which holds `rng`) resumes the same draws. Active while training (fit,
train_on_batch, a call with `training=True`); in evaluate and predict the input passes through
(cast to float32), except RandomCrop, which then gives the centered crop (below).

Where Keras 3.15's code and its docstrings disagree, podkit follows the code (what a model
trained in Keras saw), except RandomCrop's inference, where the code returns the uncropped
image (the next layer then gets another shape than the layer declares; Keras's own predict
fails on a Flatten + Dense after it): podkit crops as Keras's docstring says, the largest
centered window of the target's aspect ratio resized to it (= Resizing(crop_to_aspect_ratio=
True)). The other departures from the docstrings that podkit keeps, as Keras computes them:
RandomFlip("horizontal_and_vertical") flips an image both ways or not at all (one draw),
RandomContrast(factor=f) draws its contrast in [1, 1 + f] (a number factor's lower bound is
0), RandomCrop crops a batch at one place and only when the image is larger in both dims.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.layers import image_ops
from podkit.layers.base import Shape
from podkit.layers.image import ImageLayer, choice, number, size_arg

Params = dict[str, jax.Array]


class Augment(nnx.Module):
    """A random layer's module: `draw` then `transform` while training, `inference` else
    (nnx's train()/eval() and a call's `training=` set `deterministic`)."""

    def __init__(self, draw: Callable[[jax.Array, Shape], Any],
                 transform: Callable[[jax.Array, Any], jax.Array],
                 inference: Callable[[jax.Array], jax.Array], rngs: nnx.Rngs) -> None:
        self.draw, self.transform, self.inference = draw, transform, inference
        self.deterministic = False
        self.rngs = rngs["dropout"].fork()

    def __call__(self, x: jax.Array, deterministic: bool | None = None) -> jax.Array:
        x = x.astype(jnp.float32)
        if self.deterministic if deterministic is None else deterministic:
            return self.inference(x)
        return self.transform(x, self.draw(self.rngs(), x.shape))


def _batch(shape: Sequence[int]) -> int:
    """Keras draws one value per image, and for a single (h, w, c) image one."""
    return 1 if len(shape) == 3 else shape[0]


def _per_image(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of a per-image factor, Keras's: (batch, 1, 1, 1), or (1, 1, 1) for one
    image."""
    return (1, 1, 1) if len(shape) == 3 else (shape[0], 1, 1, 1)


def _factor_pair(owner: str, what: str, value: Any, low: float, high: float,
                 open_low: bool = False) -> tuple[float, float]:
    """Keras's factor: a number f (the range [-|f|, |f|], its low end no lower than `low`) or
    a pair (sorted); each number within [low, high] ((low, high] with `open_low`)."""
    within = (lambda v: low < v <= high) if open_low else (lambda v: low <= v <= high)
    span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    pair = isinstance(value, list | tuple) and len(value) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not (ok or pair) or not all(within(float(v)) for v in (value if pair else [value])):
        raise ConfigError(f"{owner}({what}={value!r}): a number or a pair (lower, upper) of "
                          f"numbers in {span}.")
    if pair:
        lower, upper = sorted(float(v) for v in value)
        return lower, upper
    f = abs(float(value))
    return (-f if open_low else max(-f, low)), f


def _seed(owner: str, seed: Any) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"{owner}(seed={seed!r}): an int, or None for the model's seed.")
    return seed


class RandomLayer(ImageLayer):
    """A random augmentation: `draw`, `transform` and `inference` (identity by default)."""

    def __init__(self, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seed = _seed(type(self).__name__, seed)

    def get_config(self) -> dict:
        return {"seed": self.seed, **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Any:
        raise NotImplementedError

    def transform(self, images: jax.Array, params: Any) -> jax.Array:
        raise NotImplementedError

    def inference(self, images: jax.Array) -> jax.Array:
        return images.astype(jnp.float32)

    def build(self, input_shape: Shape, rngs: nnx.Rngs) -> nnx.Module:
        self.output_shape(input_shape)
        return Augment(self.draw, self.transform, self.inference,
                       rngs if self.seed is None else nnx.Rngs(dropout=self.seed))


class RandomFlip(RandomLayer):
    """`RandomFlip(mode="horizontal_and_vertical", seed=None)`: each image flipped with
    probability 1/2 (left-right, top-bottom, or both at once: Keras's one draw)."""

    MODES = ("horizontal", "vertical", "horizontal_and_vertical")

    def __init__(self, mode: str = "horizontal_and_vertical", seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        self.mode = choice("RandomFlip", "mode", mode, self.MODES)

    def get_config(self) -> dict:
        return {"mode": self.mode, **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Params:
        return {"flips": jax.random.uniform(key, _per_image(shape)) <= 0.5}

    def transform(self, images: jax.Array, params: Params) -> jax.Array:
        images = images.astype(jnp.float32)
        flips = params["flips"].reshape(-1, 1, 1, 1)
        out = images if images.ndim == 4 else images[None]
        if self.mode in ("horizontal", "horizontal_and_vertical"):
            out = jnp.where(flips, jnp.flip(out, axis=-2), out)
        if self.mode in ("vertical", "horizontal_and_vertical"):
            out = jnp.where(flips, jnp.flip(out, axis=-3), out)
        return out if images.ndim == 4 else out[0]


class RandomCrop(RandomLayer):
    """`RandomCrop(height, width, seed=None)`: while training, a random (height, width)
    window, at one place for the whole batch (Keras's); an image not larger in both dims is
    cut at Keras's centered offsets and resized. In inference the largest centered window
    of the target's aspect ratio, resized to (height, width) (see the module docstring)."""

    def __init__(self, height: int, width: int, seed: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        self.height = size_arg("RandomCrop", "height", height)
        self.width = size_arg("RandomCrop", "width", width)

    def get_config(self) -> dict:
        return {"height": self.height, "width": self.width, **super().get_config()}

    def output_shape(self, input_shape: Shape) -> Shape:
        *_, c = self.image_size(input_shape)
        return (self.height, self.width, c)

    def _random(self, h: int, w: int) -> bool:
        return h > self.height and w > self.width

    def draw(self, key: jax.Array, shape: Shape) -> tuple[Any, Any]:
        h, w = shape[-3], shape[-2]
        if self._random(h, w):
            kh, kw = jax.random.split(key)
            top = jax.random.uniform(kh, (), maxval=float(h - self.height + 1))
            left = jax.random.uniform(kw, (), maxval=float(w - self.width + 1))
            return top.astype(jnp.int32), left.astype(jnp.int32)
        top, left, _, _ = image_ops.aspect_crop(h, w, self.height, self.width)
        return top, left

    def transform(self, images: jax.Array, params: tuple[Any, Any]) -> jax.Array:
        images = images.astype(jnp.float32)
        top, left = params
        h, w = images.shape[-3], images.shape[-2]
        if self._random(h, w):
            starts = (top, left, 0) if images.ndim == 3 else (0, top, left, 0)
            sizes = (self.height, self.width, images.shape[-1])
            return jax.lax.dynamic_slice(images, starts, images.shape[:-3] + sizes)
        # Keras's fallback: cut (height, width) at the offsets, resize what is short of it.
        out = images[..., int(top):int(top) + self.height, int(left):int(left) + self.width, :]
        if out.shape[-3:-1] != (self.height, self.width):
            out = image_ops.resize(out, self.height, self.width)
        return out

    def inference(self, images: jax.Array) -> jax.Array:
        images = images.astype(jnp.float32)
        if images.shape[-3:-1] == (self.height, self.width):
            return images
        return image_ops.resize(images, self.height, self.width, crop_to_aspect_ratio=True)


class _Affine(RandomLayer):
    """Rotation, zoom and translation: an affine map of each image, read with Keras's
    interpolation and fill mode."""

    def __init__(self, fill_mode: str = "reflect", interpolation: str = "bilinear",
                 seed: int | None = None, fill_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        owner = type(self).__name__
        self.fill_mode = choice(owner, "fill_mode", fill_mode, image_ops.FILL_MODES)
        self.interpolation = choice(owner, "interpolation", interpolation,
                                    image_ops.AFFINE_INTERPOLATIONS)
        self.fill_value = number(owner, "fill_value", fill_value)

    def get_config(self) -> dict:
        return {"fill_mode": self.fill_mode, "interpolation": self.interpolation,
                "fill_value": self.fill_value, **super().get_config()}

    def matrix(self, params: Params, height: int, width: int) -> jax.Array:
        raise NotImplementedError

    def transform(self, images: jax.Array, params: Params) -> jax.Array:
        images = images.astype(jnp.float32)
        h, w = images.shape[-3], images.shape[-2]
        return image_ops.affine_transform(images, self.matrix(params, h, w),
                                          self.interpolation, self.fill_mode, self.fill_value)


class RandomRotation(_Affine):
    """`RandomRotation(factor, fill_mode="reflect", interpolation="bilinear", seed=None,
    fill_value=0.0)`: each image rotated by an angle drawn in [lower, upper] x 360 degrees
    (factor f: [-f, f]) about its center."""

    def __init__(self, factor: Any, fill_mode: str = "reflect",
                 interpolation: str = "bilinear", seed: int | None = None,
                 fill_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(fill_mode, interpolation, seed, fill_value, **kwargs)
        self.factor = _factor_pair("RandomRotation", "factor", factor, -1.0, 1.0)

    def get_config(self) -> dict:
        return {"factor": list(self.factor), **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Params:
        lower, upper = self.factor
        return {"angle": jax.random.uniform(key, (_batch(shape),), minval=lower * 360.0,
                                            maxval=upper * 360.0)}

    def matrix(self, params: Params, height: int, width: int) -> jax.Array:
        return image_ops.affine_matrix(params["angle"], height, width)


class RandomZoom(_Affine):
    """`RandomZoom(height_factor, width_factor=None, fill_mode="reflect",
    interpolation="bilinear", seed=None, fill_value=0.0)`: each image zoomed about its
    center by 1 + a factor drawn in the range (a positive factor zooms out); without
    `width_factor` the width takes the height's zoom (the aspect ratio kept)."""

    def __init__(self, height_factor: Any, width_factor: Any = None,
                 fill_mode: str = "reflect", interpolation: str = "bilinear",
                 seed: int | None = None, fill_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(fill_mode, interpolation, seed, fill_value, **kwargs)
        self.height_factor, self.width_factor = height_factor, width_factor
        self.height_range = _factor_pair("RandomZoom", "height_factor", height_factor, -1.0,
                                         1.0, open_low=True)
        self.width_range = None if width_factor is None else _factor_pair(
            "RandomZoom", "width_factor", width_factor, -1.0, 1.0, open_low=True)

    def get_config(self) -> dict:
        return {"height_factor": _listed(self.height_factor),
                "width_factor": _listed(self.width_factor), **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Params:
        kh, kw = jax.random.split(key)
        n = _batch(shape)
        lower, upper = self.height_range
        height = jax.random.uniform(kh, (n, 1), minval=1.0 + lower, maxval=1.0 + upper)
        if self.width_range is None:
            return {"height_zoom": height, "width_zoom": height}
        lower, upper = self.width_range
        return {"height_zoom": height,
                "width_zoom": jax.random.uniform(kw, (n, 1), minval=1.0 + lower,
                                                 maxval=1.0 + upper)}

    def matrix(self, params: Params, height: int, width: int) -> jax.Array:
        zooms = jnp.concatenate([params["width_zoom"], params["height_zoom"]], axis=1)
        return image_ops.zoom_matrix(zooms.astype(jnp.float32), height, width)


class RandomTranslation(_Affine):
    """`RandomTranslation(height_factor, width_factor, fill_mode="reflect",
    interpolation="bilinear", seed=None, fill_value=0.0)`: each image shifted by a fraction
    of its height and width drawn in the ranges (factor f: [-f, f])."""

    def __init__(self, height_factor: Any, width_factor: Any, fill_mode: str = "reflect",
                 interpolation: str = "bilinear", seed: int | None = None,
                 fill_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(fill_mode, interpolation, seed, fill_value, **kwargs)
        self.height_factor, self.width_factor = height_factor, width_factor
        self.height_range = _factor_pair("RandomTranslation", "height_factor", height_factor,
                                         -1.0, 1.0)
        self.width_range = _factor_pair("RandomTranslation", "width_factor", width_factor,
                                        -1.0, 1.0)

    def get_config(self) -> dict:
        return {"height_factor": _listed(self.height_factor),
                "width_factor": _listed(self.width_factor), **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Params:
        kh, kw = jax.random.split(key)
        n, h, w = _batch(shape), shape[-3], shape[-2]
        dy = jax.random.uniform(kh, (n, 1), minval=self.height_range[0],
                                maxval=self.height_range[1]) * h
        dx = jax.random.uniform(kw, (n, 1), minval=self.width_range[0],
                                maxval=self.width_range[1]) * w
        return {"translations": jnp.concatenate([dx, dy], axis=1).astype(jnp.float32)}

    def matrix(self, params: Params, height: int, width: int) -> jax.Array:
        return image_ops.translation_matrix(params["translations"])


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _value_range(owner: str, value: Any) -> tuple[float, float]:
    if not (isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
        raise ConfigError(f"{owner}(value_range={value!r}): the images' [low, high] as two "
                          "numbers, e.g. (0, 255) or (0, 1).")
    return float(value[0]), float(value[1])


class RandomContrast(RandomLayer):
    """`RandomContrast(factor, value_range=(0, 255), seed=None)`: each image's deviation from
    its per-channel mean scaled by a factor drawn in [1 - lower, 1 + upper], clipped to
    `value_range` (Keras's factor: f -> (0, f), a pair in [0, 1] as it is)."""

    def __init__(self, factor: Any, value_range: Sequence[float] = (0, 255),
                 seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        self.factor = _factor_pair("RandomContrast", "factor", factor, 0.0, 1.0)
        low, high = _value_range("RandomContrast", value_range)
        if not low < high:
            raise ConfigError(f"RandomContrast(value_range={value_range!r}): low < high.")
        self.value_range = tuple(value_range)

    def get_config(self) -> dict:
        return {"factor": list(self.factor), "value_range": list(self.value_range),
                **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Params:
        lower, upper = self.factor
        return {"contrast_factor": jax.random.uniform(
            key, _per_image(shape), minval=1.0 - lower, maxval=1.0 + upper)}

    def transform(self, images: jax.Array, params: Params) -> jax.Array:
        images = images.astype(jnp.float32)
        factor = params["contrast_factor"]
        factor = factor if images.ndim == 4 else factor.reshape(1, 1, 1)
        mean = jnp.mean(jnp.mean(images, axis=-3, keepdims=True), axis=-2, keepdims=True)
        out = (images - mean) * factor + mean
        return jnp.clip(out, self.value_range[0], self.value_range[1])


class RandomBrightness(RandomLayer):
    """`RandomBrightness(factor, value_range=(0, 255), seed=None)`: each image shifted by a
    delta drawn in [lower, upper] x the width of `value_range` (factor f: [-f, f]), clipped
    to `value_range`."""

    def __init__(self, factor: Any, value_range: Sequence[float] = (0, 255),
                 seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(seed=seed, **kwargs)
        self.factor = _factor_pair("RandomBrightness", "factor", factor, -1.0, 1.0)
        low, high = sorted(_value_range("RandomBrightness", value_range))
        if low == high:
            raise ConfigError(f"RandomBrightness(value_range={value_range!r}): low < high.")
        self.value_range = sorted(value_range)  # Keras sorts the pair it was given

    def get_config(self) -> dict:
        return {"factor": list(self.factor), "value_range": list(self.value_range),
                **super().get_config()}

    def draw(self, key: jax.Array, shape: Shape) -> Params:
        lower, upper = self.factor
        delta = jax.random.uniform(key, _per_image(shape), minval=lower, maxval=upper)
        return {"rgb_delta": delta * (self.value_range[1] - self.value_range[0])}

    def transform(self, images: jax.Array, params: Params) -> jax.Array:
        images = images.astype(jnp.float32)
        delta = params["rgb_delta"].astype(jnp.float32)
        delta = delta if images.ndim == 4 else delta.reshape(1, 1, 1)
        return jnp.clip(images + delta, self.value_range[0], self.value_range[1])
