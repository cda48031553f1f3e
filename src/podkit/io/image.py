"""tf.io's image codecs without TensorFlow: decode_jpeg / encode_jpeg through simplejpeg
(libjpeg-turbo, as TensorFlow's), decode_png / encode_png and the other formats of
decode_image through Pillow, decode_raw through numpy.

TensorFlow's defaults are kept: decode_jpeg uses libjpeg's fast integer IDCT (TF's
`dct_method=""`, tensorflow/core/lib/jpeg/jpeg_mem.h `UncompressFlags`) and fancy upsampling,
so its pixels equal TensorFlow's; encode_jpeg writes quality 95 with 4:2:0 chroma.
"""

from __future__ import annotations

import io as _stdio
from typing import Any

import numpy as np

from podkit.errors import ConfigError, DataError

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_OTHER_IMAGE_MAGICS = (_PNG_MAGIC, b"GIF87a", b"GIF89a")  # what TF's decode_jpeg also takes
_DCT_METHODS = ("", "INTEGER_FAST", "INTEGER_ACCURATE")


def encoded_bytes(contents: Any, what: str) -> bytes:
    """The encoded image as bytes: bytes, np.bytes_, a 0-d object array (a parsed feature)."""
    if isinstance(contents, np.ndarray) and contents.ndim == 0:
        contents = contents[()]
    if isinstance(contents, np.bytes_ | bytearray | memoryview):
        contents = bytes(contents)
    if isinstance(contents, bytes):
        if not contents:  # a missing image feature parsed with default_value=""
            raise DataError(f"{what}: the image is empty (0 bytes); is the feature missing "
                            "from this record?")
        return contents
    raise ConfigError(f"{what} takes the encoded image as bytes, got a "
                      f"{type(contents).__name__}; pass the bytes of the file (e.g. a parsed "
                      "FixedLenFeature([], 'string')).")


def _channels(channels: Any, allowed: tuple[int, ...], what: str) -> int:
    if channels not in allowed:
        raise ConfigError(f"{what}: channels={channels!r}; pass one of {list(allowed)} (0: as "
                          "many as the image has).")
    return int(channels)


def decode_jpeg(contents: Any, channels: int = 0, ratio: int = 1, fancy_upscaling: bool = True,
                try_recover_truncated: bool = False, acceptable_fraction: float = 1,
                dct_method: str = "", name: str | None = None) -> np.ndarray:
    """tf.io.decode_jpeg: JPEG bytes -> uint8 array (height, width, channels).

    channels: 0 (as in the file: 1 for greyscale, 3 for colour), 1 or 3. ratio: 1, 2, 4 or 8,
    decoding at 1/ratio the size (libjpeg's DCT scaling, as TF). dct_method: "" (TF's default,
    libjpeg's fast integer IDCT), "INTEGER_FAST" or "INTEGER_ACCURATE".
    try_recover_truncated: decode what a truncated file holds (the rest grey) instead of an
    error; `acceptable_fraction` is accepted but not checked (podkit differs: TF errs below it).
    """
    import simplejpeg

    data = encoded_bytes(contents, "decode_jpeg")
    channels = _channels(channels, (0, 1, 3), "decode_jpeg")
    if not data.startswith(_JPEG_MAGIC) and data.startswith(_OTHER_IMAGE_MAGICS):
        # TF's decode_jpeg decodes PNGs and non-animated GIFs too ("the interface is the
        # same"): so does podkit's, through decode_image.
        image = decode_image(data, channels=channels, expand_animations=False)
        return image if image.ndim == 3 else image[:, :, None]
    if ratio not in (1, 2, 4, 8):
        raise ConfigError(f"decode_jpeg: ratio={ratio!r}; pass 1, 2, 4 or 8.")
    if dct_method not in _DCT_METHODS:
        raise ConfigError(f"decode_jpeg: dct_method={dct_method!r}; pass '', 'INTEGER_FAST' "
                          "or 'INTEGER_ACCURATE'.")
    strict = not try_recover_truncated
    try:
        if channels == 0:
            colorspace = simplejpeg.decode_jpeg_header(data, strict=strict)[2]
            channels = 1 if colorspace == "Gray" else 3
        kwargs: dict[str, Any] = {}
        if ratio > 1:
            h, w = simplejpeg.decode_jpeg_header(data, strict=strict)[:2]
            # libjpeg's scaled size is ceil(size / ratio): ask for at least that, and a factor
            # of at least `ratio`, so that exactly 1/ratio is chosen.
            kwargs = {"min_height": -(-h // ratio), "min_width": -(-w // ratio),
                      "min_factor": float(ratio)}
        image = simplejpeg.decode_jpeg(
            data, colorspace="GRAY" if channels == 1 else "RGB",
            fastdct=dct_method != "INTEGER_ACCURATE", fastupsample=not fancy_upscaling,
            strict=strict, **kwargs)
    except ValueError as e:
        raise DataError(f"decode_jpeg: invalid JPEG data ({e}); is the file a complete JPEG "
                        "(try_recover_truncated=True reads what a truncated one holds)?") from e
    return image if image.ndim == 3 else image[:, :, None]


def extract_jpeg_shape(contents: Any, output_type: Any = np.int32,
                       name: str | None = None) -> np.ndarray:
    """tf.io.extract_jpeg_shape: [height, width, channels] of a JPEG from its header alone
    (channels as in the file: 1 grey, 3 colour, 4 CMYK), as `output_type` (int32 or int64)."""
    import simplejpeg

    data = encoded_bytes(contents, "extract_jpeg_shape")
    if np.dtype(output_type) not in (np.int32, np.int64):
        raise ConfigError(f"extract_jpeg_shape: output_type={output_type!r}; pass np.int32 "
                          "or np.int64.")
    if not data.startswith(_JPEG_MAGIC):
        raise DataError("extract_jpeg_shape: the data is not a JPEG (no JPEG signature).")
    try:
        height, width, colorspace = simplejpeg.decode_jpeg_header(data)[:3]
    except ValueError as e:
        raise DataError(f"extract_jpeg_shape: invalid JPEG header ({e}).") from e
    channels = {"Gray": 1, "CMYK": 4, "YCCK": 4}.get(colorspace, 3)
    return np.array([height, width, channels], dtype=output_type)


def decode_and_crop_jpeg(contents: Any, crop_window: Any, channels: int = 0, ratio: int = 1,
                         fancy_upscaling: bool = True, try_recover_truncated: bool = False,
                         acceptable_fraction: float = 1, dct_method: str = "",
                         name: str | None = None) -> np.ndarray:
    """tf.io.decode_and_crop_jpeg: the window crop_window = [y, x, height, width] of a JPEG,
    in the pixels of the image decoded at 1/ratio (as TF), uint8 (height, width, channels).
    Other arguments as decode_jpeg.

    The pixels are TF's. TF decodes only the window (libjpeg-turbo's jpeg_crop_scanline and
    jpeg_skip_scanlines); podkit decodes the whole image and returns the window (no Python
    binding exposes libjpeg-turbo's cropped decode), so it does more work than TF for a small
    window. Where TF's cropped decode upsamples the chroma of a 4:2:0 or 4:2:2 file
    differently at the window's first or last column (the decoded region's edges), podkit
    recomputes those columns as libjpeg-turbo does (podkit.io.jpeg_crop); with
    dct_method="INTEGER_ACCURATE" it cannot (no reader gives the accurate IDCT's raw chroma),
    nor for a cut file read with try_recover_truncated, and such a column can differ from
    TF's.
    """
    import simplejpeg

    from podkit.io import jpeg_crop

    data = encoded_bytes(contents, "decode_and_crop_jpeg")
    window = _crop_window(crop_window)
    if not data.startswith(_JPEG_MAGIC):
        raise DataError("decode_and_crop_jpeg: the data is not a JPEG (TF's decode_and_crop_"
                        "jpeg reads JPEG only); use decode_image and slice the result.")
    image = decode_jpeg(data, channels=channels, ratio=ratio, fancy_upscaling=fancy_upscaling,
                        try_recover_truncated=try_recover_truncated,
                        acceptable_fraction=acceptable_fraction, dct_method=dct_method)
    height, width = image.shape[:2]
    y, x, h, w = window
    if not (h > 0 and w > 0 and y >= 0 and x >= 0 and y + h <= height and x + w <= width):
        at = f" (decoded at 1/{ratio})" if ratio != 1 else ""
        raise ConfigError(
            f"decode_and_crop_jpeg: crop_window={list(window)} ([y, x, height, width]) is not "
            f"inside the {height}x{width} image{at}; pass height, width > 0, y, x >= 0, "
            f"y + height <= {height} and x + width <= {width} (pk.io.extract_jpeg_shape "
            "reads the size from the header).")
    out = image[y:y + h, x:x + w]
    if out.shape != image.shape:
        out = out.copy()  # not a view that keeps the whole decoded image alive
    if fancy_upscaling and image.shape[2] == 3 and dct_method != "INTEGER_ACCURATE":
        colorspace, subsampling = simplejpeg.decode_jpeg_header(
            data, strict=not try_recover_truncated)[2:]
        if colorspace == "YCbCr":
            out = jpeg_crop.fix_edges(data, window, out, (height, width), subsampling, ratio,
                                      strict=not try_recover_truncated)
    return out


def _crop_window(crop_window: Any) -> tuple[int, int, int, int]:
    arr = np.asarray(crop_window)
    if arr.shape != (4,) or arr.dtype.kind not in "iu":
        raise ConfigError(f"decode_and_crop_jpeg: crop_window={crop_window!r}; pass four ints "
                          "[y, x, height, width] (the window's top-left corner and size).")
    y, x, h, w = (int(v) for v in arr)
    return y, x, h, w


def encode_jpeg(image: Any, format: str = "", quality: int = 95, progressive: bool = False,
                optimize_size: bool = False, chroma_downsampling: bool = True,
                density_unit: str = "in", x_density: int = 300, y_density: int = 300,
                xmp_metadata: str = "", name: str | None = None) -> bytes:
    """tf.io.encode_jpeg: a uint8 (height, width, 1 or 3) array -> JPEG bytes, quality 95 and
    4:2:0 chroma (chroma_downsampling=False: 4:4:4) by default, as TF, through Pillow's
    libjpeg-turbo: the bytes are TF's. `format` "grayscale" or "rgb" forces the colour space.
    A "cm" density is written in dots per inch, and `xmp_metadata` is not written (podkit
    differs; neither changes a pixel)."""
    arr = _image_array(image, "encode_jpeg", np.uint8)
    if format not in ("", "grayscale", "rgb"):
        raise ConfigError(f"encode_jpeg: format={format!r}; pass '', 'grayscale' or 'rgb'.")
    if not isinstance(quality, int) or not 0 <= quality <= 100:
        raise ConfigError(f"encode_jpeg: quality={quality!r}; pass an int from 0 to 100.")
    grey = arr.shape[2] == 1
    if format == "grayscale" and not grey or format == "rgb" and grey:
        raise ConfigError(f"encode_jpeg: format={format!r} but the image has "
                          f"{arr.shape[2]} channels.")
    if arr.shape[2] not in (1, 3):
        raise ConfigError(f"encode_jpeg: the image has {arr.shape[2]} channels; pass 1 "
                          "(greyscale) or 3 (RGB).")
    if density_unit not in ("in", "cm"):
        raise ConfigError(f"encode_jpeg: density_unit={density_unit!r}; pass 'in' or 'cm'.")
    from PIL import Image

    # Pillow's libjpeg-turbo with TF's settings writes TF's bytes (the same quantization,
    # ISLOW DCT and smooth chroma downsampling; simplejpeg's TurboJPEG API downsamples
    # differently: up to 10 levels apart after decoding).
    scale = 2.54 if density_unit == "cm" else 1.0  # Pillow writes dots per inch
    out = _stdio.BytesIO()
    Image.fromarray(arr[:, :, 0] if grey else arr).save(
        out, "JPEG", quality=quality, progressive=progressive, optimize=optimize_size,
        subsampling=2 if chroma_downsampling else 0,
        dpi=(round(x_density * scale), round(y_density * scale)))
    return out.getvalue()


def _image_array(image: Any, what: str, *dtypes: Any) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim != 3:
        raise ConfigError(f"{what} takes an image of shape (height, width, channels), got "
                          f"shape {arr.shape}.")
    if arr.dtype not in [np.dtype(d) for d in dtypes]:
        names = " or ".join(np.dtype(d).name for d in dtypes)
        raise ConfigError(f"{what} takes a {names} image, got {arr.dtype}; cast it first "
                          "(e.g. np.clip(x * 255, 0, 255).astype(np.uint8)).")
    return arr


def _open_pil(data: bytes, what: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(_stdio.BytesIO(data))
        img.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DataError(f"{what}: invalid image data ({e}).") from e
    except Image.DecompressionBombError as e:  # more pixels than Pillow's safety limit
        raise DataError(f"{what}: {e} Raise PIL.Image.MAX_IMAGE_PIXELS if the image is "
                        "trusted.") from e
    return img


# Pillow mode -> the channels TF's decoder gives for that file.
_PIL_NATIVE = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "1": 1, "I;16": 1, "I;16B": 1, "I": 1}


def _pil_to_array(img: Any, channels: int, what: str) -> np.ndarray:
    """Pixels as TF's decoders give them: palettes expanded (to RGBA when transparent), then
    channels converted as libpng does (grey -> RGB by copying, RGB -> grey by luminance)."""
    mode = img.mode
    if mode == "P" or mode == "PA":
        img = img.convert("RGBA" if "transparency" in img.info or mode == "PA" else "RGB")
        mode = img.mode
    if mode == "1":
        img, mode = img.convert("L"), "L"
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img).astype(np.uint16)[:, :, None]
    elif mode in _PIL_NATIVE:
        arr = np.asarray(img)
        arr = arr[:, :, None] if arr.ndim == 2 else arr
    else:  # CMYK, YCbCr, ...: RGB
        arr = np.asarray(img.convert("RGB"))
    have = arr.shape[2]
    if channels in (0, have):
        return arr
    if channels == 1 or channels == 2:
        colour = arr[:, :, :3] if have >= 3 else arr[:, :, :1]
        if colour.shape[2] == 3:
            # libpng's rgb_to_gray as TF sets it (0.299, 0.587 in 1/2^15, truncated):
            # equal to TF's on every pixel of the golden files.
            grey = (colour[:, :, 0].astype(np.uint32) * 9797 + colour[:, :, 1].astype(
                np.uint32) * 19234 + colour[:, :, 2].astype(np.uint32) * 3737) >> 15
            colour = grey.astype(arr.dtype)[:, :, None]
        if channels == 1:
            return colour
        alpha = arr[:, :, -1:] if have in (2, 4) else np.full_like(colour, _max(arr.dtype))
        return np.concatenate([colour, alpha], axis=2)
    colour = arr[:, :, :1].repeat(3, axis=2) if have <= 2 else arr[:, :, :3]
    if channels == 3:
        return colour
    alpha = arr[:, :, -1:] if have in (2, 4) else np.full_like(arr[:, :, :1], _max(arr.dtype))
    return np.concatenate([colour, alpha], axis=2)


def _max(dtype: np.dtype) -> int:
    return int(np.iinfo(dtype).max)


def _convert_dtype(arr: np.ndarray, dtype: Any, what: str) -> np.ndarray:
    """tf.image.convert_image_dtype between uint8, uint16 and floats (x * (1 / max) in the
    float type, as TF computes it)."""
    target = np.dtype(dtype)
    if target == arr.dtype:
        return arr
    if target == np.uint16 and arr.dtype == np.uint8:
        return arr.astype(np.uint16) << 8  # TF scales by (65535 + 1) // (255 + 1)
    if target == np.uint8 and arr.dtype == np.uint16:
        return (arr >> 8).astype(np.uint8)
    if target.kind == "f":
        return arr.astype(target) * target.type(1.0 / _max(arr.dtype))
    raise ConfigError(f"{what}: dtype={dtype!r}; pass uint8, uint16 or a float dtype.")


def decode_png(contents: Any, channels: int = 0, dtype: Any = np.uint8,
               name: str | None = None) -> np.ndarray:
    """tf.io.decode_png: PNG bytes -> (height, width, channels) uint8 or uint16.

    channels: 0 (as in the file, 2 for grey+alpha), 1 grey, 3 RGB, 4 RGBA; palettes expand to
    RGB(A). A 16-bit PNG with dtype uint8 is scaled down, an 8-bit one with uint16 scaled up
    (x 257), as TF. 16-bit colour PNGs are read by Pillow as 8-bit (podkit differs)."""
    data = encoded_bytes(contents, "decode_png")
    channels = _channels(channels, (0, 1, 3, 4), "decode_png")
    if np.dtype(dtype) not in (np.uint8, np.uint16):
        raise ConfigError(f"decode_png: dtype={dtype!r}; pass uint8 or uint16.")
    if not data.startswith(_PNG_MAGIC):
        raise DataError("decode_png: the data is not a PNG (no PNG signature); use "
                        "decode_image for any format.")
    arr = _pil_to_array(_open_pil(data, "decode_png"), channels, "decode_png")
    if arr.dtype == np.uint16 and np.dtype(dtype) == np.uint8:
        # libpng's png_set_strip_16 (TF's 16 -> 8 bit) keeps the high byte.
        return (arr >> 8).astype(np.uint8)
    if arr.dtype == np.uint8 and np.dtype(dtype) == np.uint16:
        return arr.astype(np.uint16) * 257  # libpng's png_set_expand_16
    return arr


def encode_png(image: Any, compression: int = -1, name: str | None = None) -> bytes:
    """tf.io.encode_png: a uint8 or uint16 (height, width, 1-4) array -> PNG bytes.
    compression: zlib's 0-9, -1 for its default."""
    from PIL import Image

    arr = _image_array(image, "encode_png", np.uint8, np.uint16)
    c = arr.shape[2]
    if c not in (1, 2, 3, 4):
        raise ConfigError(f"encode_png: the image has {c} channels; pass 1 to 4.")
    if not isinstance(compression, int) or not -1 <= compression <= 9:
        raise ConfigError(f"encode_png: compression={compression!r}; pass -1 to 9.")
    if arr.dtype == np.uint16:
        if c != 1:
            raise ConfigError("encode_png: podkit writes 16-bit PNGs with one channel only; "
                              "pass uint8 for colour.")
        img = Image.fromarray(np.ascontiguousarray(arr[:, :, 0]))  # mode I;16
    else:
        img = Image.fromarray(np.ascontiguousarray(arr[:, :, 0] if c == 1 else arr))
    out = _stdio.BytesIO()
    img.save(out, "PNG", compress_level=6 if compression == -1 else compression)
    return out.getvalue()


def decode_image(contents: Any, channels: int | None = None, dtype: Any = np.uint8,
                 name: str | None = None, expand_animations: bool = True) -> np.ndarray:
    """tf.io.decode_image: JPEG, PNG, GIF, BMP or WebP bytes -> (height, width, channels)
    (GIF and WebP: (frames, height, width, channels) with expand_animations, as TF; podkit
    reads a WebP's first frame). dtype uint8, uint16 or a float (scaled to [0, 1], as
    tf.image.convert_image_dtype; a PNG is read at 16 bits for them, as TF)."""
    data = encoded_bytes(contents, "decode_image")
    want = 0 if channels is None else _channels(channels, (0, 1, 3, 4), "decode_image")
    if data.startswith(_JPEG_MAGIC):
        if want == 4:
            raise ConfigError("decode_image: a JPEG decodes to 1 or 3 channels, not 4.")
        arr = decode_jpeg(data, channels=want)
    elif data.startswith(_PNG_MAGIC):
        # As TF: a PNG read for a float or uint16 result is read at 16 bits first.
        wide = np.dtype(dtype) == np.uint16 or np.dtype(dtype).kind == "f"
        arr = decode_png(data, channels=want, dtype=np.uint16 if wide else np.uint8)
    else:
        img = _open_pil(data, "decode_image")
        if img.format == "GIF":
            frames = []
            for i in range(getattr(img, "n_frames", 1)):
                img.seek(i)
                frames.append(np.asarray(img.convert("RGB")))
                if not expand_animations:
                    break
            arr = np.stack(frames) if expand_animations else frames[0]
            if want not in (0, 3):
                raise ConfigError(f"decode_image: a GIF decodes to 3 channels, not {want}.")
        elif img.format == "BMP":
            if want not in (0, 3, 4):  # TF's BMP decoder
                raise ConfigError(f"decode_image: a BMP decodes to 3 or 4 channels, not {want}.")
            arr = _pil_to_array(img, want, "decode_image")
        elif img.format == "WEBP":  # TF reads WebP as (possibly animated) frames
            arr = _pil_to_array(img, want, "decode_image")
            arr = arr[None] if expand_animations else arr
        else:
            raise DataError(f"decode_image: unknown image format {img.format!r}; JPEG, PNG, "
                            "GIF, BMP and WebP are read.")
    return _convert_dtype(arr, dtype, "decode_image")


def decode_raw(input_bytes: Any, out_type: Any, little_endian: bool = True,
               fixed_length: int | None = None, name: str | None = None) -> np.ndarray:
    """tf.io.decode_raw: bytes -> a 1-D array of `out_type` (a list of equal-length bytes ->
    2-D). `fixed_length` pads or cuts each input to that many bytes first."""
    dtype = np.dtype(out_type).newbyteorder("<" if little_endian else ">")
    if isinstance(input_bytes, list | tuple) or (isinstance(input_bytes, np.ndarray)
                                                  and input_bytes.ndim >= 1):
        rows = [decode_raw(b, out_type, little_endian, fixed_length) for b in input_bytes]
        if len({r.shape for r in rows}) > 1:
            raise DataError("decode_raw: the inputs have different lengths; pass "
                            "fixed_length= to read them as rows of one array.")
        return np.stack(rows) if rows else np.zeros((0, 0), np.dtype(out_type))
    data = encoded_bytes(input_bytes, "decode_raw")
    if fixed_length is not None:
        data = data[:fixed_length].ljust(fixed_length, b"\0")
    if len(data) % dtype.itemsize:
        raise DataError(f"decode_raw: {len(data)} bytes is not a multiple of the "
                        f"{dtype.itemsize} bytes of a {np.dtype(out_type).name}.")
    return np.frombuffer(data, dtype).astype(np.dtype(out_type))
