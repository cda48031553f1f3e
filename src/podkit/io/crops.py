"""The crop-and-resize of an image pipeline in one call, and the random crop window it takes.

TensorFlow's input code spells a training crop as four ops (`extract_jpeg_shape`,
`sample_distorted_bounding_box`, `decode_and_crop_jpeg`, `resize`); podkit's `pk.io` has
each of them with TF's pixels, and these two for speed:

    window = pk.io.sample_crop_window(rng, pk.io.extract_jpeg_shape(jpeg), area_range=(0.25, 1))
    image = pk.io.decode_crop_resize(jpeg, window, (96, 96), flip=rng.random() < 0.5)

`decode_crop_resize` decodes with libjpeg-turbo (simplejpeg; the GIL released), at 1/2, 1/4
or 1/8 scale when the window is at least that many times the output (libjpeg's DCT scaling:
fewer pixels decoded and resized), and resizes the window with Pillow's filters (the box in
floating point, so no pixel is cut twice; bilinear antialiases when it shrinks, as
tf.image.resize(antialias=True)). Its result is uint8: converting to float is the caller's
choice (a table look-up, or the model's `Rescaling` on the device).

kornia-rs's SIMD resize (tf.image.resize's bilinear without antialiasing) was tried: 3x
faster per image alone, but it splits each resize over a rayon thread pool, and with one
input worker per core that hand-off made the 13-core TPU host's pipeline 14% slower than
Pillow's (2,452-2,483 against 2,835-2,861 images/s), and 2.8x slower with rayon's default pool.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from podkit.errors import ConfigError, DataError
from podkit.io import image

DCT_FACTORS = (8, 4, 2)  # libjpeg-turbo's fast scaled decodes (1/8, 1/4, 1/2)
METHODS = ("bilinear", "nearest", "bicubic", "lanczos")  # Pillow's resampling filters


def _size(size: Any, what: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        h = w = 0
    if h <= 0 or w <= 0 or (isinstance(size, str)):
        raise ConfigError(f"{what}: size={size!r}; pass (height, width), two positive ints.")
    return h, w


def _window(window: Any, height: int, width: int, what: str) -> tuple[int, int, int, int]:
    try:
        top, left, h, w = (int(v) for v in np.asarray(window).reshape(-1))
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: crop_window={window!r}; pass [y, x, height, width], four "
                          "ints (tf.image.decode_and_crop_jpeg's).") from None
    if h <= 0 or w <= 0 or top < 0 or left < 0 or top + h > height or left + w > width:
        raise ConfigError(f"{what}: crop_window [y, x, height, width] = {[top, left, h, w]} "
                        f"does not fit in the {height}x{width} image; keep y + height <= "
                        f"{height} and x + width <= {width} with positive sizes (e.g. from "
                        "pk.io.sample_crop_window(rng, pk.io.extract_jpeg_shape(jpeg))).")
    return top, left, h, w


def sample_crop_window(rng: np.random.Generator, image_shape: Any,
                       area_range: tuple[float, float] = (0.08, 1.0),
                       aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3),
                       max_attempts: int = 10) -> np.ndarray:
    """[y, x, height, width] (int32): a window of a uniform share of the image's area in
    `area_range` and a uniform aspect ratio (width / height) in `aspect_ratio_range`, redrawn
    up to `max_attempts` times, else the whole image: tf.image.sample_distorted_bounding_box's
    rule for a whole-image box (`use_image_if_no_bounding_boxes=True`), from a numpy
    generator (seed it per element, e.g. `np.random.default_rng([seed, index])`, for crops
    that are the same after a resume)."""
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"sample_crop_window takes a numpy Generator, got {rng!r}; pass "
                          "np.random.default_rng([seed, index]) (one per element, so a resume "
                          "crops alike).")
    try:
        height, width = int(image_shape[0]), int(image_shape[1])
    except (TypeError, ValueError, IndexError):
        height = width = 0
    if height <= 0 or width <= 0:
        raise ConfigError(f"sample_crop_window: image_shape={image_shape!r}; pass the image's "
                          "[height, width, ...] with positive sides (pk.io.extract_jpeg_shape).")
    lo, hi = (float(v) for v in area_range)
    if not 0 < lo <= hi <= 1:
        raise ConfigError(f"sample_crop_window: area_range={area_range!r}; pass (low, high) "
                          "with 0 < low <= high <= 1.")
    alo, ahi = (float(v) for v in aspect_ratio_range)
    if not 0 < alo <= ahi:
        raise ConfigError(f"sample_crop_window: aspect_ratio_range={aspect_ratio_range!r}; "
                          "pass (low, high) with 0 < low <= high.")
    window = draw_window(rng, height, width, (lo, hi), (alo, ahi), max_attempts)
    return np.array(window if window is not None else (0, 0, height, width), np.int32)


def draw_window(rng: np.random.Generator, height: int, width: int,
                area_range: tuple[float, float], aspect_ratio_range: tuple[float, float],
                max_attempts: int) -> tuple[int, int, int, int] | None:
    """Inception's draw: (y, x, h, w) of a uniform share of the area and a uniform aspect
    ratio that fits, redrawn up to `max_attempts` times; None when none fit (the caller's
    fallback: the whole image, or the ImageNet reference's center crop)."""
    area = height * width
    for _ in range(int(max_attempts)):
        target = rng.uniform(*area_range) * area
        ratio = rng.uniform(*aspect_ratio_range)  # width / height
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < h <= height and 0 < w <= width:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    return None


def dct_factor(crop_height: int, crop_width: int, height: int, width: int) -> int:
    """The largest fast DCT scaling (8, 4, 2; else 1) that leaves a crop at least the output's
    size both ways: decoding smaller would make the resize enlarge."""
    for factor in DCT_FACTORS:
        if crop_height >= height * factor and crop_width >= width * factor:
            return factor
    return 1


def decode_crop_resize(contents: Any, crop_window: Any, size: Any, method: str = "bilinear",
                       flip: bool = False, scaled_decode: bool = True) -> np.ndarray:
    """JPEG bytes -> (height, width, 3) uint8: the `crop_window` [y, x, h, w] (in the full
    image's pixels) resized to `size`, mirrored left-right when `flip`.

    method: Pillow's "bilinear", "bicubic", "lanczos" (antialiased when shrinking: TF's
    resize with antialias=True within 3 levels inside the window) or "nearest". At the
    window's edges Pillow's filter also reads the image's pixels just outside it, where TF's
    resize of the cut-out window has none (up to ~20 levels on the edge rows and columns).
    scaled_decode: decode at 1/2, 1/4 or 1/8 scale where the window is at least that many
    times `size`: a low-pass filter of its own (mean differences of 0.7-3 levels from the full
    decode's result for outputs of 112-32 px, single pixels up to ~30); False decodes full
    size."""
    import simplejpeg
    from PIL import Image

    what = "decode_crop_resize"
    out_h, out_w = _size(size, what)
    if method not in METHODS:
        raise ConfigError(f"{what}: method={method!r}; pass one of {list(METHODS)}.")
    data = image.encoded_bytes(contents, what)
    if not data.startswith(b"\xff\xd8"):
        raise DataError(f"{what}: not a JPEG ({len(data)} bytes, starting {bytes(data[:8])!r}); "
                        "for PNG, GIF or BMP use pk.io.decode_image, then crop and "
                        "pk.io.resize.")
    try:
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
    except ValueError as e:
        raise DataError(f"{what}: invalid JPEG data ({len(data)} bytes, starting "
                        f"{bytes(data[:4])!r}): {e}") from None
    top, left, h, w = _window(crop_window, height, width, what)
    factor = dct_factor(h, w, out_h, out_w) if scaled_decode else 1
    kwargs: dict[str, Any] = {}
    if factor > 1:  # exactly 1/factor: libjpeg's scaled size is ceil(size / factor)
        kwargs = {"min_height": -(-height // factor), "min_width": -(-width // factor),
                  "min_factor": float(factor)}
    try:
        decoded = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, **kwargs)
    except ValueError as e:
        raise DataError(f"{what}: invalid JPEG data ({e}); is the file a complete JPEG?") \
            from None
    # The window in the decoded image's pixels (a scaled decode rounds its sides up).
    sy, sx = decoded.shape[0] / height, decoded.shape[1] / width
    box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
    out = Image.fromarray(decoded).resize((out_w, out_h), _FILTERS[method], box=box)
    if flip:  # in Pillow: numpy's copy of a reversed (h, w, 3) view costs ~20x more
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


_FILTERS = {"bilinear": 2, "bicubic": 3, "lanczos": 1, "nearest": 0}  # PIL.Image.Resampling
