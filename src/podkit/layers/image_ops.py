"""The image operations of Keras 3's JAX backend (keras/src/backend/jax/image.py) that its
preprocessing and augmentation layers call, as pure jax.numpy functions on channels-last
images: `resize` (with Keras's crop and pad to the aspect ratio), `affine_transform` (the
interpolation and fill modes of `jax.scipy.ndimage.map_coordinates`, which Keras calls),
and the transform matrices the layers build (`affine_matrix`, `zoom_matrix`,
`translation_matrix`).

Everything here is traced into the compiled step: static shapes, no host callbacks, one
gather per corner of the whole batch (no Python per image). `images` are (batch, height,
width, channels) or one (height, width, channels) image, as Keras takes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

RESIZE_INTERPOLATIONS = ("bilinear", "nearest", "lanczos3", "lanczos5", "bicubic")
AFFINE_INTERPOLATIONS = ("nearest", "bilinear")
FILL_MODES = ("reflect", "wrap", "constant", "nearest")


def batched(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`fn` on a batch, taking one (height, width, channels) image too (as a batch of one)."""
    def run(images: jax.Array, *args: object, **kwargs: object) -> jax.Array:
        if images.ndim == 3:
            return fn(images[None], *args, **kwargs)[0]
        return fn(images, *args, **kwargs)
    return run


def aspect_crop(height: int, width: int, target_height: int, target_width: int
                ) -> tuple[int, int, int, int]:
    """(top, left, crop height, crop width) of the largest centered window of the target's
    aspect ratio (Keras's `crop_to_aspect_ratio` and `smart_resize`, its integer rounding)."""
    crop_height = max(min(height, int(float(width * target_height) / target_width)), 1)
    crop_width = max(min(width, int(float(height * target_width) / target_height)), 1)
    return (int(float(height - crop_height) / 2), int(float(width - crop_width) / 2),
            crop_height, crop_width)


@batched
def resize(images: jax.Array, height: int, width: int, interpolation: str = "bilinear",
           antialias: bool = False, crop_to_aspect_ratio: bool = False,
           pad_to_aspect_ratio: bool = False, fill_value: float = 0.0) -> jax.Array:
    """Keras's `ops.image.resize` (JAX backend): the aspect-ratio crop or pad first (static
    slices and concatenations), then `jax.image.resize`."""
    _, h, w, c = images.shape
    if crop_to_aspect_ratio:
        top, left, ch, cw = aspect_crop(h, w, height, width)
        images = images[:, top:top + ch, left:left + cw, :]
    elif pad_to_aspect_ratio:
        # Keras pads one side pair only: the height if it is short, else the width.
        pad_h = max(h, int(float(w * height) / width))
        pad_w = max(w, int(float(h * width) / height))
        top, left = int(float(pad_h - h) / 2), int(float(pad_w - w) / 2)
        if top > 0:
            band = jnp.full((images.shape[0], top, w, c), fill_value, images.dtype)
            images = jnp.concatenate([band, images, band], axis=1)
        elif left > 0:
            band = jnp.full((images.shape[0], h, left, c), fill_value, images.dtype)
            images = jnp.concatenate([band, images, band], axis=2)
    return jax.image.resize(images, (images.shape[0], height, width, c), method=interpolation,
                            antialias=antialias)


# -- affine transforms ------------------------------------------------------------------------
def affine_matrix(angle: jax.Array, height: int, width: int) -> jax.Array:
    """Keras's `_compute_affine_matrix` for a rotation by `angle` degrees (batch,) about the
    image's center, no translation, scale or shear: (batch, 8) rows [a0, a1, a2, b0, b1, b2,
    0, 0] mapping an output pixel (x, y) to the input point (a0 x + a1 y + a2, b0 x + b1 y +
    b2)."""
    angle = angle * jnp.asarray(math.pi / 180.0, angle.dtype)
    cx = 0.5 * (jnp.asarray(width, angle.dtype) - 1)
    cy = 0.5 * (jnp.asarray(height, angle.dtype) - 1)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    zero = jnp.zeros_like(angle)
    shear = jnp.tan(zero)  # Keras's shear terms at 0, kept so the arithmetic is Keras's
    one = jnp.ones_like(angle)
    a0 = one * (cos + shear * sin)
    a1 = one * (-sin + shear * cos)
    a2 = zero + cx - cx * a0 - cy * a1
    b0 = one * (shear * cos + sin)
    b1 = one * (shear * -sin + cos)
    b2 = zero + cy - cx * b0 - cy * b1
    return jnp.stack([a0, a1, a2, b0, b1, b2, zero, zero], axis=1)


def zoom_matrix(zooms: jax.Array, height: int, width: int) -> jax.Array:
    """Keras's RandomZoom matrix from (batch, 2) [width zoom, height zoom]: a zoom about the
    image's center (a zoom above 1 shows more of the image: it zooms out)."""
    n = zooms.shape[0]
    x_offset = ((jnp.float32(width) - 1.0) / 2.0) * (1.0 - zooms[:, 0:1])
    y_offset = ((jnp.float32(height) - 1.0) / 2.0) * (1.0 - zooms[:, 1:])
    zero = jnp.zeros((n, 1), zooms.dtype)
    return jnp.concatenate([zooms[:, 0:1], zero, x_offset, zero, zooms[:, 1:], y_offset,
                            jnp.zeros((n, 2), zooms.dtype)], axis=1)


def translation_matrix(translations: jax.Array) -> jax.Array:
    """Keras's RandomTranslation matrix from (batch, 2) [dx, dy] pixel shifts."""
    n = translations.shape[0]
    one, zero = jnp.ones((n, 1), translations.dtype), jnp.zeros((n, 1), translations.dtype)
    return jnp.concatenate([one, zero, -translations[:, 0:1], zero, one, -translations[:, 1:],
                            jnp.zeros((n, 2), translations.dtype)], axis=1)


def _mirror(index: jax.Array, size: int) -> jax.Array:
    s = size - 1  # jax.scipy.ndimage's triangular wave, half-wavelength size - 1
    return jnp.abs((index + s) % (2 * s) - s)


def _reflect(index: jax.Array, size: int) -> jax.Array:
    return jnp.floor_divide(_mirror(2 * index + 1, 2 * size + 1) - 1, 2)


# How an index outside the image reads one inside, as map_coordinates' modes do.
_FIXERS: dict[str, Callable[[jax.Array, int], jax.Array]] = {
    "constant": lambda index, size: index,
    "nearest": lambda index, size: jnp.clip(index, 0, size - 1),
    "wrap": lambda index, size: index % size,
    "reflect": _reflect,
}


def _nodes(coordinate: jax.Array, order: int) -> list[tuple[jax.Array, jax.Array | float]]:
    """(index, weight) pairs of one axis: the nearest pixel (rounded half away from zero),
    or the two neighbours with linear weights."""
    if order == 0:
        return [(jax.lax.round(coordinate).astype(jnp.int32), 1.0)]
    lower = jnp.floor(coordinate)
    upper_weight = coordinate - lower
    index = lower.astype(jnp.int32)
    return [(index, 1 - upper_weight), (index + 1, upper_weight)]


def _sample(image: jax.Array, ys: jax.Array, xs: jax.Array, order: int, fill_mode: str,
            fill_value: float) -> jax.Array:
    """One image (h, w, c) read at the points (ys, xs), each (h', w'): map_coordinates'
    interpolation with whole pixels (all channels) per gather."""
    h, w, _ = image.shape
    fix = _FIXERS[fill_mode]
    fill = jnp.asarray(fill_value, image.dtype)
    out = None
    for iy, wy in _nodes(ys, order):
        for ix, wx in _nodes(xs, order):
            value = image[fix(iy, h), fix(ix, w)]
            if fill_mode == "constant":
                valid = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
                value = jnp.where(valid[..., None], value, fill)
            weight = wy * wx
            term = value if isinstance(weight, float) else weight[..., None] * value
            out = term if out is None else out + term
    assert out is not None
    return out.astype(image.dtype)


@batched
def affine_transform(images: jax.Array, transform: jax.Array, interpolation: str = "bilinear",
                     fill_mode: str = "constant", fill_value: float = 0.0) -> jax.Array:
    """Keras's `ops.image.affine_transform` (JAX backend) with (batch, 8) transforms (or one
    (8,) for every image) whose projective terms are 0, as every layer here makes them:
    output pixel (x, y) reads the input at (a0 x + a1 y + a2, b0 x + b1 y + b2)."""
    b, h, w, _ = images.shape
    transform = jnp.broadcast_to(transform.reshape(-1, 8), (b, 8)).astype(jnp.float32)
    y = jnp.arange(h, dtype=jnp.float32)[None, :, None]
    x = jnp.arange(w, dtype=jnp.float32)[None, None, :]
    a0, a1, a2, b0, b1, b2 = (transform[:, i, None, None] for i in range(6))
    # Keras's order: the index vector (y, x) times its swapped matrix, then the offset.
    ys = y * b1 + x * b0 + b2
    xs = y * a1 + x * a0 + a2
    order = AFFINE_INTERPOLATIONS.index(interpolation)
    return jax.vmap(lambda image, yy, xx: _sample(image, yy, xx, order, fill_mode,
                                                  fill_value))(images, ys, xs)
