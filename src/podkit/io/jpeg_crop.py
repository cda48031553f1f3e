"""The edge columns of tf.io.decode_and_crop_jpeg's window, as TensorFlow's libjpeg-turbo
gives them.

TensorFlow decodes only the window: `jpeg_crop_scanline` moves its left edge down to an iMCU
boundary (16 pixels at ratio 1 for 2x horizontally subsampled chroma, 16 / ratio when
scaled) and ends the decoded rows at the window's right edge, and `jpeg_skip_scanlines` skips
the rows above. The chroma upsampler then treats the decoded region's left and right edges as
the image's edges. Where libjpeg-turbo upsamples chroma 2x horizontally with its "fancy"
(interpolating) upsampler — 4:2:0 at ratio 1, 4:2:2 at ratios 1, 2 and 4 (TF's default
fancy_upscaling=True) — two columns can differ from the whole image's decode: the window's
first column when it starts on an iMCU boundary, and its last column when the decoded region
is an even number of pixels wide and ends inside the image (a region 1 or 2 pixels wide is
upsampled by replication). Rows are as in the whole image.

podkit decodes the whole image (simplejpeg: libjpeg-turbo, the same pixels) and recomputes
those columns here from the raw planes (Y and the chroma before upsampling, from Pillow's
libjpeg-turbo in draft mode: TF's fast integer IDCT and DCT scaling, chroma replicated, not
interpolated) with libjpeg-turbo's upsampling (jdsample.c) and colour conversion (jdcolor.c)
formulas: the window equals TF's (tests/io/test_image_tf.py checks every edge case).
"""

from __future__ import annotations

import io as _stdio
from functools import cache

import numpy as np

from podkit.errors import DataError

# (TurboJPEG's subsampling name, ratio) -> the vertical upsampling factor, where libjpeg-turbo
# upsamples the chroma 2x horizontally with its fancy upsampler: h2v2 or h2v1. At other ratios
# the chroma's DCT is scaled to full size (4:2:0) or the upsampler replicates (scaled DCT of
# one pixel: ratio 8).
_FANCY = {("420", 1): 2, ("422", 1): 1, ("422", 2): 1, ("422", 4): 1}


def edge_columns(window: tuple[int, int, int, int], width: int, subsampling: str,
                 ratio: int) -> list[tuple[int, str]]:
    """The window-relative columns whose chroma TF's cropped decode computes differently from
    the whole image's, each with its rule: "left" or "right" (an edge of the upsampled region)
    or "replicate" (a region under 3 pixels wide). Empty when the whole-image decode's
    columns are TF's."""
    y, x, h, w = window
    if (subsampling, ratio) not in _FANCY or w == width:  # no crop at full width
        return []
    if -(-width // 2) <= 2:  # the whole image's chroma is replicated as well
        return []
    imcu = 16 // ratio  # jpeg_crop_scanline's alignment: scaled DCT size x max_h_samp_factor 2
    start = x - x % imcu
    region = x + w - start
    if -(-region // 2) < 2:  # jpeg_crop_scanline re-initialises the upsampler: replication
        return [(col, "replicate") for col in range(w)]
    columns = []
    if x == start and x > 0:
        columns.append((0, "left"))
    if region % 2 == 0 and x + w < width:
        columns.append((w - 1, "right"))
    return columns


def fix_edges(data: bytes, window: tuple[int, int, int, int], image: np.ndarray,
              shape: tuple[int, int], subsampling: str, ratio: int,
              strict: bool = True) -> np.ndarray:
    """`image` (the window of the whole-image decode at 1/ratio, RGB; that image of `shape`
    (height, width)) with its edge columns replaced by the pixels TF's cropped decode gives.
    Returns `image` itself when no column differs (or, with strict=False, when Pillow cannot
    read a truncated file)."""
    columns = edge_columns(window, shape[1], subsampling, ratio)
    if not columns:
        return image
    vertical = _FANCY[subsampling, ratio]
    planes = _raw_planes(data, vertical, ratio, shape, strict)
    if planes is None:
        return image
    luma, chroma = planes
    y, x, h, w = window
    rows = np.arange(y, y + h)
    near = chroma[rows // vertical].astype(np.int32)  # (h, chroma width, [Cb, Cr])
    if vertical == 2:
        # h2v2: the column sum 3 * nearer row + farther row (the row above for even output
        # rows, below for odd ones, replicated at the image's top and bottom).
        far = np.clip(np.where(rows % 2 == 0, rows // 2 - 1, rows // 2 + 1), 0,
                      chroma.shape[0] - 1)
        colsum = 3 * near + chroma[far].astype(np.int32)
    out = image.copy()
    for col, rule in columns:
        j = (x + col) // 2
        if rule == "replicate" or vertical == 1:
            c = near[:, j]  # h2v1's edge outputs keep the sample, as replication does
        else:  # h2v2's edge outputs: (sum * 4 + 8) >> 4 on the left, + 7 on the right
            c = (colsum[:, j] * 4 + (8 if rule == "left" else 7)) >> 4
        out[:, col] = _ycc_to_rgb(luma[rows, x + col].astype(np.int32), c[:, 0], c[:, 1])
    return out


def _raw_planes(data: bytes, vertical: int, ratio: int, shape: tuple[int, int],
                strict: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """(Y (height, width), chroma (chroma rows, chroma columns, [Cb, Cr])) at 1/ratio as
    libjpeg-turbo's fast integer IDCT gives them, before upsampling."""
    from PIL import Image

    try:
        img = Image.open(_stdio.BytesIO(data))
        # A requested size of full // ratio makes Pillow pick libjpeg's scale 1/ratio.
        img.draft("YCbCr", (max(1, img.size[0] // ratio), max(1, img.size[1] // ratio)))
        # Pillow's draft flag: libjpeg's fast integer IDCT (JDCT_FASTEST, TF's default) and
        # no fancy upsampling, so each chroma sample is replicated over its 2x2 (2x1) pixels.
        img.decoderconfig = (ratio, 1)
        ycc = np.asarray(img)
    except OSError as e:
        if not strict:  # a truncated file read with try_recover_truncated
            return None
        raise DataError(f"decode_and_crop_jpeg: invalid JPEG data ({e}).") from e
    except Image.DecompressionBombError as e:  # more pixels than Pillow's safety limit
        raise DataError(f"decode_and_crop_jpeg: {e} Raise PIL.Image.MAX_IMAGE_PIXELS if the "
                        "image is trusted.") from e
    if ycc.shape != (*shape, 3):
        raise DataError(f"decode_and_crop_jpeg: Pillow read the JPEG as {img.mode} "
                        f"{ycc.shape}, not YCbCr {(*shape, 3)}.")
    return ycc[:, :, 0], ycc[::vertical, ::2, 1:]


@cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """libjpeg's build_ycc_rgb_table (jdcolor.c): 16-bit fixed point, rounded as libjpeg."""
    x = np.arange(256, dtype=np.int64) - 128

    def fix(v: float) -> int:
        return int(v * 65536 + 0.5)

    half = 1 << 15
    return ((fix(1.40200) * x + half) >> 16, (fix(1.77200) * x + half) >> 16,
            -fix(0.71414) * x, -fix(0.34414) * x + half)


def _ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    cr_r, cb_b, cr_g, cb_g = _tables()
    rgb = np.stack([y + cr_r[cr], y + ((cb_g[cb] + cr_g[cr]) >> 16), y + cb_b[cb]], axis=-1)
    return np.clip(rgb, 0, 255).astype(np.uint8)
