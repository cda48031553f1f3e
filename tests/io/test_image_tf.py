"""pk.io's tf.image functions against TensorFlow itself, live: decode_and_crop_jpeg and
extract_jpeg_shape on JPEGs of every chroma subsampling, resize with every method (exact but
for lanczos's sin, the bound stated below), decode_image's options. Skipped where tensorflow
is not installed (CI without the bench extra)."""

import io

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError, DataError

tf = pytest.importorskip("tensorflow")
simplejpeg = pytest.importorskip("simplejpeg")
Image = pytest.importorskip("PIL.Image")


def picture(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A photo-like RGB image: smooth colour gradients, an edge, some noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rgb = np.stack([128 + 100 * np.sin(x / 7 + y / 11), 128 + 90 * np.cos(y / 5 - x / 13),
                    60 + 3 * x % 180], axis=-1)
    rgb[(x - w / 2) ** 2 + (y - h / 3) ** 2 < (min(h, w) / 4) ** 2] = (240, 30, 60)
    return np.clip(rgb + rng.normal(0, 12, rgb.shape), 0, 255).astype(np.uint8)


def jpeg(kind: str, h: int = 53, w: int = 75) -> bytes:
    image = picture(h, w)
    if kind == "grey":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(image[:, :, :1]), quality=90,
                                      colorspace="GRAY", colorsubsampling="Gray")
    if kind == "progressive_420":
        out = io.BytesIO()
        Image.fromarray(image).save(out, "JPEG", quality=90, progressive=True, subsampling=2)
        return out.getvalue()
    return simplejpeg.encode_jpeg(image, quality=90, colorsubsampling=kind)


KINDS = ["grey", "444", "422", "420", "440", "411", "progressive_420"]


def windows(height: int, width: int, seed: int = 0) -> list[list[int]]:
    """Random windows and the edge cases of libjpeg-turbo's cropped decode: offsets on and off
    the 16-pixel iMCU grid, regions of even and odd width, 1 and 2 pixels wide, touching the
    image's right and bottom edges, the whole image."""
    rng = np.random.default_rng(seed)
    out = [[0, 0, height, width], [0, 0, 1, 1], [height - 1, width - 1, 1, 1],
           [0, 0, height, 1], [0, 0, height, 2], [0, width - 1, height, 1],
           [2, 1, height - 3, width - 1], [0, 0, 1, width]]
    for x in (16, 32, 15, 17, 31):
        for w in (1, 2, 3, 4, 5, 16, width - x):
            if x < width and 0 < w <= width - x:
                out.append([int(rng.integers(0, height // 2)), x, height // 2, w])
    for _ in range(40):
        y, x = int(rng.integers(0, height)), int(rng.integers(0, width))
        out.append([y, x, int(rng.integers(1, height - y + 1)),
                    int(rng.integers(1, width - x + 1))])
    return out


def tf_crop(data: bytes, window, **kwargs) -> np.ndarray:
    return tf.io.decode_and_crop_jpeg(data, window, **kwargs).numpy()


@pytest.mark.parametrize("kind", KINDS)
def test_decode_and_crop_jpeg_equals_tensorflow_on_every_window(kind):
    data = jpeg(kind)
    whole = tf.io.decode_jpeg(data).numpy()
    differs_from_slice = 0
    for window in windows(*whole.shape[:2]):
        theirs = tf_crop(data, window)
        ours = pk.io.decode_and_crop_jpeg(data, window)
        assert ours.dtype == np.uint8 and ours.shape == theirs.shape, window
        np.testing.assert_array_equal(ours, theirs, err_msg=str(window))
        y, x, h, w = window
        differs_from_slice += not np.array_equal(whole[y:y + h, x:x + w], theirs)
    # TF's cropped decode upsamples the chroma of 2x horizontally subsampled files differently
    # at the window's edges: the windows above reach that case, which plain slicing misses.
    assert (differs_from_slice > 0) == (kind in ("422", "420", "progressive_420")), \
        differs_from_slice


@pytest.mark.parametrize("kind", ["grey", "444", "420", "422"])
def test_decode_and_crop_jpeg_options_equal_tensorflow(kind):
    data = jpeg(kind, 61, 83)
    options = [{"channels": 1}, {"channels": 3}, {"fancy_upscaling": False},
               {"ratio": 2}, {"ratio": 4}, {"ratio": 8}, {"ratio": 2, "channels": 1}]
    if kind in ("grey", "444"):  # no upsampled chroma: the accurate IDCT is TF's as well
        options.append({"dct_method": "INTEGER_ACCURATE"})
    for kwargs in options:
        # crop_window is in the pixels of the image decoded at 1/ratio, as TF's
        height, width = tf.io.decode_jpeg(data, ratio=kwargs.get("ratio", 1)).shape[:2]
        for window in windows(height, width, seed=1)[:30]:
            np.testing.assert_array_equal(
                pk.io.decode_and_crop_jpeg(data, window, **kwargs), tf_crop(data, window,
                                                                            **kwargs),
                err_msg=f"{kwargs} {window}")


def test_decode_and_crop_jpeg_takes_tensorflows_window_types():
    data = jpeg("420")
    for window in ([3, 16, 20, 30], (3, 16, 20, 30), np.array([3, 16, 20, 30], np.int32),
                   tf.constant([3, 16, 20, 30])):
        np.testing.assert_array_equal(pk.io.decode_and_crop_jpeg(data, window),
                                      tf_crop(data, [3, 16, 20, 30]))


@pytest.mark.parametrize("window", [[0, 0, 54, 5], [0, 70, 5, 6], [-1, 0, 3, 3],
                                    [0, 0, 0, 5], [0, 0, 5, -2]])
def test_a_window_outside_the_image_is_an_error_as_in_tensorflow(window):
    data = jpeg("420")  # 53 x 75
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf_crop(data, window)
    with pytest.raises(ConfigError, match=r"crop_window=\[.*53x75 image.*extract_jpeg_shape"):
        pk.io.decode_and_crop_jpeg(data, window)
    with pytest.raises(ConfigError, match=r"27x38 image \(decoded at 1/2\)"):
        pk.io.decode_and_crop_jpeg(data, [0, 0, 28, 5], ratio=2)


def test_bad_crop_windows_and_data_are_errors_naming_them():
    data = jpeg("420")
    for window in ([0, 0, 5], [0.5, 0, 3, 3], "0,0,3,3", [[0, 0], [3, 3]], [True] * 4):
        with pytest.raises(ConfigError, match=r"crop_window=.*four ints \[y, x, height, width\]"):
            pk.io.decode_and_crop_jpeg(data, window)
    png = pk.io.encode_png(picture(8, 8))
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf_crop(png, [0, 0, 2, 2])
    with pytest.raises(DataError, match="not a JPEG.*decode_image"):
        pk.io.decode_and_crop_jpeg(png, [0, 0, 2, 2])
    with pytest.raises(DataError, match="decode_jpeg"):
        pk.io.decode_and_crop_jpeg(data[: len(data) // 2], [0, 0, 2, 2])


def test_decode_and_crop_jpeg_with_try_recover_truncated_reads_a_cut_file():
    data = jpeg("420", 96, 128)
    cut = data[: len(data) * 3 // 4]
    window = [40, 16, 50, 30]  # a recomputed left edge, in rows the cut file still holds
    ours = pk.io.decode_and_crop_jpeg(cut, window, try_recover_truncated=True)
    assert ours.shape == (50, 30, 3)


@pytest.mark.parametrize("kind", ["grey", "444", "420"])
def test_extract_jpeg_shape_equals_tensorflow(kind):
    data = jpeg(kind, 37, 58)
    for output_type, tf_type in ((np.int32, tf.int32), (np.int64, tf.int64)):
        ours = pk.io.extract_jpeg_shape(data, output_type)
        theirs = tf.io.extract_jpeg_shape(data, output_type=tf_type).numpy()
        np.testing.assert_array_equal(ours, theirs)
        assert ours.dtype == theirs.dtype


def test_extract_jpeg_shape_of_cmyk_and_bad_input():
    out = io.BytesIO()
    Image.fromarray(picture(9, 13)).convert("CMYK").save(out, "JPEG")
    cmyk = out.getvalue()
    np.testing.assert_array_equal(pk.io.extract_jpeg_shape(cmyk),
                                  tf.io.extract_jpeg_shape(cmyk).numpy())
    with pytest.raises(DataError, match="not a JPEG"):
        pk.io.extract_jpeg_shape(pk.io.encode_png(picture(4, 4)))
    with pytest.raises(ConfigError, match="output_type"):
        pk.io.extract_jpeg_shape(cmyk, np.float32)


# --- resize ------------------------------------------------------------------------------

METHODS = ["bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian",
           "mitchellcubic"]
# Largest difference from TF, as a fraction of the input's range (0..255 for uint8, the
# values' spread for floats). Every method is TF's kernel in TF's float32 order, bit for bit,
# but lanczos: TF's weights use the C library's sinf, which is 1 ulp off the correctly rounded
# sine for some positions (measured: 4.8e-7 for lanczos3, 9.5e-7 for lanczos5).
TOLERANCE = {"lanczos3": 2e-6, "lanczos5": 2e-6}
SIZES = [((37, 53), (20, 17)), ((37, 53), (80, 101)), ((17, 9), (5, 31)), ((50, 50), (50, 50)),
         ((120, 160), (31, 29)), ((7, 7), (3, 3)), ((1, 5), (4, 2))]


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_resize_equals_tensorflow(method, antialias):
    rng = np.random.default_rng(0)
    for (h, w), size in SIZES:
        for images in (rng.integers(0, 256, (h, w, 3)).astype(np.uint8),
                       rng.normal(0, 40, (2, h, w, 1)).astype(np.float32),
                       rng.integers(-500, 500, (h, w, 2)).astype(np.int16),
                       rng.normal(0, 1, (h, w, 4))):
            theirs = tf.image.resize(images, size, method=method, antialias=antialias).numpy()
            ours = pk.io.resize(images, size, method=method, antialias=antialias)
            assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (size, images.dtype)
            spread = float(np.ptp(images)) or 1.0
            assert np.abs(ours.astype(np.float64) - theirs).max() <= TOLERANCE.get(
                method, 0) * spread, (method, antialias, (h, w), size, images.dtype)


def test_resize_keeps_the_dtype_for_nearest_only_as_tensorflow():
    image = np.arange(5 * 7 * 1, dtype=np.int32).reshape(5, 7, 1)
    assert pk.io.resize(image, (5, 7), "nearest").dtype == np.int32
    assert pk.io.resize(image, (5, 7)).dtype == np.float32  # TF v2 resizes (casts) even then
    assert tf.image.resize(image, (5, 7)).dtype == tf.float32


def test_resize_preserve_aspect_ratio_sizes_as_tensorflow():
    image = np.zeros((37, 53, 3), np.uint8)
    for size in [(10, 20), (20, 10), (100, 100), (37, 53), (3, 1000), (1000, 7), (15, 15)]:
        theirs = tf.image.resize(image, size, preserve_aspect_ratio=True).shape
        assert pk.io.resize(image, size, preserve_aspect_ratio=True).shape == tuple(theirs)


def test_resize_is_reachable_as_tf_image_names():
    image = np.random.default_rng(1).integers(0, 256, (20, 30, 3)).astype(np.uint8)
    np.testing.assert_array_equal(
        pk.image.resize(image, [11, 13], method=pk.image.ResizeMethod.BICUBIC),
        tf.image.resize(image, [11, 13], method=tf.image.ResizeMethod.BICUBIC).numpy())
    assert pk.image.decode_and_crop_jpeg is pk.io.decode_and_crop_jpeg
    assert pk.image.extract_jpeg_shape is pk.io.extract_jpeg_shape


def test_bad_resize_arguments_are_errors_naming_them():
    image = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ConfigError, match=r"method='cubic'.*'bilinear', 'nearest'"):
        pk.io.resize(image, (4, 4), method="cubic")
    with pytest.raises(ConfigError, match="method='BILINEAR'"):  # TF takes lower case only
        pk.io.resize(image, (4, 4), method="BILINEAR")
    for size in [(4,), (4, 0), (4.0, 4.0), 4, (-1, 4), (4, 4, 4)]:
        with pytest.raises(ConfigError, match=r"size=.*two positive ints"):
            pk.io.resize(image, size)
    with pytest.raises(ConfigError, match=r"shape \(8, 8\).*image\[\.\.\., None\]"):
        pk.io.resize(image[:, :, 0], (4, 4))
    with pytest.raises(ConfigError, match="bool"):
        pk.io.resize(image.astype(bool), (4, 4))
    with pytest.raises(ConfigError, match=r"shape \(0, 8, 3\)"):
        pk.io.resize(image[:0], (4, 4))
    with pytest.raises(ConfigError, match="100x2 image into 1x100 as 1x0"):
        pk.io.resize(np.zeros((100, 2, 1)), (1, 100), preserve_aspect_ratio=True)
    with pytest.raises(ConfigError, match="antialias='yes'"):
        pk.io.resize(image, (4, 4), antialias="yes")


# --- decode_image ------------------------------------------------------------------------

def encoded_images() -> dict[str, bytes]:
    rgb = picture(12, 15)
    out = {"jpeg": pk.io.encode_jpeg(rgb), "jpeg_grey": pk.io.encode_jpeg(rgb[:, :, :1]),
           "png_rgb": pk.io.encode_png(rgb), "png_grey": pk.io.encode_png(rgb[:, :, :1]),
           "png_rgba": pk.io.encode_png(np.concatenate([rgb, rgb[:, :, :1]], axis=2)),
           "png16": pk.io.encode_png(rgb[:, :, :1].astype(np.uint16) * 256 + 3)}
    frames = [Image.fromarray(np.roll(rgb, 3 * i, axis=1)) for i in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    out["gif"] = gif.getvalue()
    bmp = io.BytesIO()
    Image.fromarray(rgb).save(bmp, "BMP")
    out["bmp"] = bmp.getvalue()
    return out


@pytest.mark.parametrize("kind", ["jpeg", "jpeg_grey", "png_rgb", "png_grey", "png_rgba", "png16",
                                  "gif", "bmp"])
def test_decode_image_equals_tensorflow_for_each_option(kind):
    data = encoded_images()[kind]
    for channels in (None, 1, 3, 4):
        for dtype, tf_dtype in ((np.uint8, tf.uint8), (np.uint16, tf.uint16),
                                (np.float32, tf.float32)):
            for expand in (True, False):
                try:
                    theirs = tf.io.decode_image(data, channels=channels, dtype=tf_dtype,
                                                expand_animations=expand).numpy()
                except (tf.errors.InvalidArgumentError, ValueError):
                    with pytest.raises((ConfigError, DataError)):
                        pk.io.decode_image(data, channels=channels, dtype=dtype,
                                           expand_animations=expand)
                    continue
                ours = pk.io.decode_image(data, channels=channels, dtype=dtype,
                                          expand_animations=expand)
                where = f"channels={channels} dtype={dtype.__name__} expand={expand}"
                assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, where
                np.testing.assert_array_equal(ours, theirs, err_msg=where)
