"""tf.image.resize in numpy on the host, for pk.data map functions: TensorFlow's CPU kernels
ported, in their float32 arithmetic and order.

tf.image.resize (resize_images_v2) picks, as here:
- "bilinear": ResizeBilinear with half-pixel centers; antialias=True: ScaleAndTranslate with
  the triangle kernel.
- "nearest": ResizeNearestNeighbor with half-pixel centers (the input's dtype; antialias has
  no effect).
- "bicubic": ResizeBicubic with half-pixel centers (Keys' cubic, a = -0.5, from TF's 1024-entry
  weight table, out-of-image taps dropped and the rest renormalised); antialias=True:
  ScaleAndTranslate with the Keys cubic kernel.
- "area": ResizeArea (always averages; antialias has no effect).
- "lanczos3", "lanczos5", "gaussian", "mitchellcubic": ScaleAndTranslate with that kernel,
  widened by the downscale factor when antialias=True.
Every method but nearest returns float32.

Each axis's taps (source indices and float32 weights per output index) are computed once per
(input size, output size, method, antialias) and cached; a pass gathers the taps and sums
them in TF's order (rows then columns; columns then rows for area), so the results are TF's
to the last bit except where a kernel calls sin or exp (lanczos, gaussian: the libm's last
bit). tests/io/test_image_tf.py states the differences per method, measured against TF.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from podkit.errors import ConfigError

_F = np.float32
_FLT_MIN = float(np.finfo(np.float32).tiny)


class ResizeMethod:
    """tf.image.ResizeMethod: the names `resize` takes (plain strings, as TF's)."""

    BILINEAR = "bilinear"
    NEAREST_NEIGHBOR = "nearest"
    BICUBIC = "bicubic"
    AREA = "area"
    LANCZOS3 = "lanczos3"
    LANCZOS5 = "lanczos5"
    GAUSSIAN = "gaussian"
    MITCHELLCUBIC = "mitchellcubic"


METHODS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian",
           "mitchellcubic")


def resize(images: Any, size: Any, method: str = "bilinear", preserve_aspect_ratio: bool = False,
           antialias: bool = False, name: str | None = None) -> np.ndarray:
    """tf.image.resize: a (height, width, channels) image or a (batch, height, width,
    channels) batch resized to size = (new_height, new_width) by `method` (a ResizeMethod name).

    preserve_aspect_ratio: resize to the largest size within `size` of the image's aspect
    ratio (rounded as TF). antialias: widen the kernel when downsampling (bilinear, bicubic and
    the ScaleAndTranslate kernels). float32 out, the input's dtype for "nearest".
    """
    arr = _images(images)
    method = _method(method)
    new_h, new_w = _size(size)
    if not isinstance(preserve_aspect_ratio, bool | np.bool_) or not isinstance(
            antialias, bool | np.bool_):
        raise ConfigError(f"resize: preserve_aspect_ratio={preserve_aspect_ratio!r}, "
                          f"antialias={antialias!r}; pass True or False.")
    batch = arr if arr.ndim == 4 else arr[None]
    _, in_h, in_w, channels = batch.shape
    if in_h == 0 or in_w == 0 or channels == 0:
        raise ConfigError(f"resize: the image has shape {arr.shape}; height, width and "
                          "channels must be positive.")
    if preserve_aspect_ratio:
        new_h, new_w = _aspect_size(in_h, in_w, new_h, new_w)
    if method == "nearest":
        out = np.take(np.take(batch, _nearest(in_h, new_h), axis=1), _nearest(in_w, new_w),
                      axis=2)
    elif method == "bilinear" and not antialias:
        out = _bilinear(batch, new_h, new_w)
    elif method == "area":
        scale = _F(1.0 / float(_scale(in_h, new_h) * _scale(in_w, new_w)))
        out = _pass(_pass(batch, 2, *_area_taps(in_w, new_w)), 1, *_area_taps(in_h, new_h))
        out *= scale
    else:
        if method == "bicubic" and not antialias:
            rows, cols = _bicubic_taps(in_h, new_h), _bicubic_taps(in_w, new_w)
        else:
            kernel = {"bilinear": "triangle", "bicubic": "keyscubic"}.get(method, method)
            rows = _scale_translate_taps(in_h, new_h, kernel, bool(antialias))
            cols = _scale_translate_taps(in_w, new_w, kernel, bool(antialias))
        out = _pass(_pass(batch, 1, *rows), 2, *cols)
    return out if arr.ndim == 4 else out[0]


# --- argument checks -----------------------------------------------------------------------

def _images(images: Any) -> np.ndarray:
    arr = np.asarray(images)
    if arr.ndim not in (3, 4):
        raise ConfigError(f"resize takes an image (height, width, channels) or a batch "
                          f"(batch, height, width, channels), got shape {arr.shape}; add a "
                          "channels axis to a 2-D image (image[..., None]).")
    if arr.dtype.kind not in "uif" and arr.dtype.name != "bfloat16":
        raise ConfigError(f"resize: the images are {arr.dtype}; pass an integer or float "
                          "array (as TF's resize kernels take).")
    return arr


def _method(method: Any) -> str:
    value = getattr(method, "value", method)  # an enum whose values are TF's names
    if not isinstance(value, str) or value not in METHODS:
        raise ConfigError(f"resize: method={method!r}; pass one of {list(METHODS)} "
                          "(pk.io.ResizeMethod's names, as tf.image.ResizeMethod).")
    return value


def _size(size: Any) -> tuple[int, int]:
    arr = np.asarray(size)
    if arr.shape != (2,) or arr.dtype.kind not in "iu" or (arr <= 0).any():
        raise ConfigError(f"resize: size={size!r}; pass two positive ints (new_height, "
                          "new_width).")
    return int(arr[0]), int(arr[1])


def _aspect_size(in_h: int, in_w: int, new_h: int, new_w: int) -> tuple[int, int]:
    """_resize_images_common's size for preserve_aspect_ratio, in its float32 arithmetic
    (tf.round: halves to even, as np.rint)."""
    scale = min(_F(new_h) / _F(in_h), _F(new_w) / _F(in_w))
    h, w = int(np.rint(scale * _F(in_h))), int(np.rint(scale * _F(in_w)))
    if h <= 0 or w <= 0:
        raise ConfigError(f"resize: preserve_aspect_ratio maps the {in_h}x{in_w} image into "
                          f"{new_h}x{new_w} as {h}x{w}; pass a larger size.")
    return h, w


# --- TF's kernels ---------------------------------------------------------------------------

def _scale(in_size: int, out_size: int) -> np.float32:
    return _F(in_size) / _F(out_size)  # CalculateResizeScale (no align_corners)


def _pass(arr: np.ndarray, axis: int, index: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """out[..., o, ...] = sum_k float32(arr[..., index[o, k], ...]) * weight[o, k], summed in
    k's order from the first product (TF's accumulation)."""
    out = None
    for k in range(index.shape[1]):
        term = np.take(arr, index[:, k], axis=axis).astype(_F, copy=False)
        term *= _along(weight[:, k], axis, arr.shape[3])
        out = term if out is None else np.add(out, term, out=out)
    return out


def _along(values: np.ndarray, axis: int, channels: int) -> np.ndarray:
    """Per-row (axis 1) or per-column (axis 2) factors shaped to multiply a batch; a column's
    repeated over the channels (numpy's broadcast over a short last axis is ~8x slower)."""
    if axis == 1:
        return values.reshape(1, -1, 1, 1)
    return np.repeat(values, channels).reshape(1, 1, -1, channels)


@lru_cache(maxsize=512)
def _nearest(in_size: int, out_size: int) -> np.ndarray:
    """ResizeNearestNeighbor, half-pixel centers: floor((i + 0.5) * scale), clamped."""
    pos = (np.arange(out_size, dtype=_F) + _F(0.5)) * _scale(in_size, out_size)
    return _frozen(np.clip(np.floor(pos).astype(np.int64), 0, in_size - 1))


@lru_cache(maxsize=512)
def _bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ResizeBilinear's compute_interpolation_weights (HalfPixelScaler)."""
    pos = (np.arange(out_size, dtype=_F) + _F(0.5)) * _scale(in_size, out_size) - _F(0.5)
    low = np.floor(pos)
    lower = np.maximum(low.astype(np.int64), 0)
    upper = np.minimum(np.ceil(pos).astype(np.int64), in_size - 1)
    return _frozen(lower), _frozen(upper), _frozen((pos - low).astype(_F))


def _bilinear(batch: np.ndarray, new_h: int, new_w: int) -> np.ndarray:
    """ResizeBilinear: top = tl + (tr - tl) * x_lerp, bottom likewise, top + (bottom - top) *
    y_lerp, in float32 (compute_lerp)."""
    _, in_h, in_w, _ = batch.shape
    if (in_h, in_w) == (new_h, new_w):  # TF's no-op resize is a cast
        return batch.astype(_F)
    y0, y1, yl = _bilinear_taps(in_h, new_h)
    x0, x1, xl = _bilinear_taps(in_w, new_w)
    top_rows, bottom_rows = np.take(batch, y0, axis=1), np.take(batch, y1, axis=1)
    xl = _along(xl, 2, batch.shape[3])

    def lerp(rows: np.ndarray) -> np.ndarray:  # np.take: ~3x numpy's fancy indexing here
        left = np.take(rows, x0, axis=2).astype(_F)
        return left + (np.take(rows, x1, axis=2).astype(_F) - left) * xl

    top = lerp(top_rows)
    return top + (lerp(bottom_rows) - top) * _along(yl, 1, 0)


@lru_cache(maxsize=1)
def _cubic_table() -> tuple[np.ndarray, np.ndarray]:
    """resize_bicubic_op.cc's InitCoeffsTable(-0.5): Keys' weights at 1/1024 steps, computed
    in double from a float position and stored as float."""
    a = -0.5
    x = (np.arange(1025) * 1.0 / 1024).astype(_F).astype(np.float64)
    near = (((a + 2) * x - (a + 3)) * x * x + 1).astype(_F)
    x1 = (x.astype(_F) + _F(1.0)).astype(np.float64)
    far = (((a * x1 - 5 * a) * x1 + 8 * a) * x1 - 4 * a).astype(_F)
    return near, far


@lru_cache(maxsize=512)
def _bicubic_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """ResizeBicubic's GetWeightsAndIndices with Keys' cubic (half-pixel centers): taps at
    floor(pos) - 1 .. + 2, those outside the image weighted 0, the rest renormalised."""
    near, far = _cubic_table()
    pos = (np.arange(out_size, dtype=_F) + _F(0.5)) * _scale(in_size, out_size) - _F(0.5)
    base = np.floor(pos).astype(np.int64)
    offset = np.rint((pos - base.astype(_F)) * _F(1024)).astype(np.int64)  # lrintf
    weight = np.stack([far[offset], near[offset], near[1024 - offset], far[1024 - offset]],
                      axis=1)
    index = base[:, None] + np.arange(-1, 3)
    inside = (index >= 0) & (index < in_size)
    weight = np.where(inside, weight, _F(0))
    total = ((weight[:, 0] + weight[:, 1]) + weight[:, 2]) + weight[:, 3]
    ok = np.abs(total) >= 1000 * _FLT_MIN
    weight = np.where(ok[:, None], weight * (_F(1) / np.where(ok, total, _F(1)))[:, None],
                      weight)
    return _frozen(np.clip(index, 0, in_size - 1)), _frozen(weight.astype(_F))


@lru_cache(maxsize=512)
def _area_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """ResizeArea's cells: the input cells [floor(i * scale), ceil((i + 1) * scale)) of output
    i, weighted by how much of each lies inside (in float32, as TF); bounded indices."""
    scale = _scale(in_size, out_size)
    i = np.arange(out_size, dtype=_F)
    lo, hi = i * scale, (i + _F(1)) * scale
    start = np.floor(lo).astype(np.int64)
    count = np.ceil(hi).astype(np.int64) - start
    cell = start[:, None] + np.arange(int(count.max()))
    c = cell.astype(_F)
    lo_, hi_ = lo[:, None], hi[:, None]
    weight = np.where(c < lo_, np.where(c + _F(1) > hi_, scale, c + _F(1) - lo_),
                      np.where(c + _F(1) > hi_, hi_ - c, _F(1))).astype(_F)
    weight = np.where(np.arange(cell.shape[1]) < count[:, None], weight, _F(0))
    return _frozen(np.clip(cell, 0, in_size - 1)), _frozen(weight)


def _kernel(name: str, x: np.ndarray) -> np.ndarray:
    """sampling_kernels.h's kernels of |x| (float32 in, float32 out)."""
    if name == "triangle":
        return np.where(x < 1, _F(1) - x, _F(0))
    if name == "keyscubic":
        return np.where(x >= 2, _F(0), np.where(
            x >= 1, ((_F(-0.5) * x + _F(2.5)) * x - _F(4)) * x + _F(2),
            ((_F(1.5) * x - _F(2.5)) * x) * x + _F(1)))
    if name == "mitchellcubic":
        return np.where(x >= 2, _F(0), np.where(
            x >= 1, ((_F(-7) / _F(18) * x + _F(2)) * x - _F(10) / _F(3)) * x + _F(16) / _F(9),
            ((_F(7) / _F(6) * x - _F(2)) * x) * x + _F(8) / _F(9)))
    if name == "gaussian":  # radius 1.5, sigma 0.5; the exponent in double, as TF
        value = np.exp(-(x * x).astype(np.float64) / (2.0 * 0.5 * 0.5)).astype(_F)
        return np.where(x >= _F(1.5), _F(0), value)
    radius = _F(3 if name == "lanczos3" else 5)
    pi = _F(3.14159265359)
    with np.errstate(divide="ignore", invalid="ignore"):
        px = pi * x
        # sin rounded from double: TF's sinf (glibc) can be 1 ulp off it, which moves a
        # weight by 1 ulp and an output by up to ~1e-6 of its range (measured in the tests).
        value = (radius * np.sin(px.astype(np.float64)).astype(_F)
                 * np.sin((px / radius).astype(np.float64)).astype(_F)) / (pi * pi * x * x)
    near_zero = x.astype(np.float64) <= 1e-3  # TF compares with the double 1e-3
    return np.where(x > radius, _F(0), np.where(near_zero, _F(1), value)).astype(_F)


_RADIUS = {"triangle": 1.0, "keyscubic": 2.0, "mitchellcubic": 2.0, "gaussian": 1.5,
           "lanczos3": 3.0, "lanczos5": 5.0}


@lru_cache(maxsize=512)
def _scale_translate_taps(in_size: int, out_size: int, kernel: str,
                          antialias: bool) -> tuple[np.ndarray, np.ndarray]:
    """ScaleAndTranslate's ComputeSpansCore (scale out/in, no translation): the kernel around
    each sample position, widened by 1/scale when downsampling with antialias, weights
    normalised to sum 1."""
    scale = _F(out_size) / _F(in_size)
    inv_scale = _F(1.0 / float(scale))
    kernel_scale = max(inv_scale, _F(1)) if antialias else _F(1)
    radius = _F(_RADIUS[kernel]) * kernel_scale
    span = min(2 * int(np.ceil(radius)) + 1, in_size)
    sample = (np.arange(out_size, dtype=_F) + _F(0.5)) * inv_scale + _F(-0.0)
    start = np.clip(np.ceil(sample - radius - _F(0.5)).astype(np.int64), 0, in_size - 1)
    end = np.clip(np.floor(sample + radius - _F(0.5)).astype(np.int64), 0, in_size - 1) + 1
    source = start[:, None] + np.arange(span)
    position = (source.astype(_F) + _F(0.5)) - sample[:, None]
    weight = _kernel(kernel, np.abs(position * (_F(1) / kernel_scale)))
    weight = np.where(source < end[:, None], weight, _F(0)).astype(_F)
    total = np.zeros(out_size, _F)
    for k in range(span):  # float32, in order
        total += weight[:, k]
    ok = np.abs(total) >= 1000 * _FLT_MIN
    weight = np.where(ok[:, None], weight * (_F(1) / np.where(ok, total, _F(1)))[:, None],
                      _F(0))
    return _frozen(np.clip(source, 0, in_size - 1)), _frozen(weight.astype(_F))


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False  # cached: shared by every call
    return arr
