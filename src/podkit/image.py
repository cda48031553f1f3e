"""pk.image: the tf.image names podkit has, so that TF code reads the same —
`tf.image.decode_and_crop_jpeg` becomes `pk.image.decode_and_crop_jpeg`. Each is pk.io's
function (numpy on the host, TF's pixels); pk.io holds them all under their tf.io names too.

    shape = pk.image.extract_jpeg_shape(jpeg)
    crop = pk.image.decode_and_crop_jpeg(jpeg, [y, x, h, w], channels=3)
    image = pk.image.resize(crop, [224, 224], method=pk.image.ResizeMethod.BILINEAR)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podkit import _lazy

_WHERE: dict[str, tuple[str, str | None]] = {
    **{name: ("podkit.io.image", name) for name in (
        "decode_and_crop_jpeg", "decode_image", "decode_jpeg", "decode_png", "encode_jpeg",
        "encode_png", "extract_jpeg_shape")},
    "ResizeMethod": ("podkit.io.resizing", "ResizeMethod"),
    "resize": ("podkit.io.resizing", "resize"),
}

__all__ = ["ResizeMethod", "decode_and_crop_jpeg", "decode_image", "decode_jpeg", "decode_png",
           "encode_jpeg", "encode_png", "extract_jpeg_shape", "resize"]

__getattr__, __dir__ = _lazy.attributes(__name__, _WHERE, globals())


if TYPE_CHECKING:  # what static tools see: the same names, imported eagerly
    from podkit.io.image import (
        decode_and_crop_jpeg,
        decode_image,
        decode_jpeg,
        decode_png,
        encode_jpeg,
        encode_png,
        extract_jpeg_shape,
    )
    from podkit.io.resizing import ResizeMethod, resize
