"""pk.io's tf.image functions without TensorFlow (CI): what holds whatever TF computes.
tests/io/test_image_tf.py checks every pixel against TensorFlow where it is installed."""

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError
from podkit.io import jpeg_crop

simplejpeg = pytest.importorskip("simplejpeg")


def photo(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([128 + 100 * np.sin(x / 5 + y / 9), 128 + 90 * np.cos(y / 4 - x / 11),
                    (7 * x + 3 * y) % 256], axis=-1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("subsampling", ["444", "420"])
def test_decode_and_crop_jpeg_is_the_whole_decode_but_for_tfs_edge_columns(subsampling):
    data = simplejpeg.encode_jpeg(photo(40, 70), quality=90, colorsubsampling=subsampling)
    whole = pk.io.decode_jpeg(data)
    assert pk.io.extract_jpeg_shape(data).tolist() == [40, 70, 3]
    for window in ([0, 0, 40, 70], [5, 16, 20, 30], [5, 17, 20, 31], [0, 32, 40, 2]):
        y, x, h, w = window
        crop = pk.io.decode_and_crop_jpeg(data, window)
        assert crop.shape == (h, w, 3) and crop.flags.owndata == (window != [0, 0, 40, 70])
        edges = [col for col, _ in jpeg_crop.edge_columns(tuple(window), 70, subsampling, 1)]
        keep = [c for c in range(w) if c not in edges]
        np.testing.assert_array_equal(crop[:, keep], whole[y:y + h, x:x + w][:, keep])
        if edges:  # where TF's cropped decode computes a column as an image edge
            assert not np.array_equal(crop, whole[y:y + h, x:x + w])
    assert jpeg_crop.edge_columns((5, 16, 20, 30), 70, "420", 1) == [(0, "left"), (29, "right")]
    assert jpeg_crop.edge_columns((5, 17, 20, 31), 70, "420", 1) == [(30, "right")]
    assert jpeg_crop.edge_columns((0, 32, 40, 2), 70, "420", 1) == [(0, "replicate"),
                                                                    (1, "replicate")]
    assert jpeg_crop.edge_columns((5, 16, 20, 30), 70, "420", 2) == []
    with pytest.raises(ConfigError, match="40x70"):
        pk.io.decode_and_crop_jpeg(data, [30, 0, 11, 5])


def test_resize_keeps_what_every_method_keeps():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (9, 13, 3)).astype(np.uint8)
    flat = np.full((9, 13, 2), 77, np.uint8)
    for method in ["bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5",
                   "gaussian", "mitchellcubic"]:
        out = pk.io.resize(image, (5, 21), method)
        assert out.shape == (5, 21, 3)
        assert out.dtype == (np.uint8 if method == "nearest" else np.float32)
        batch = pk.io.resize(np.stack([image, image]), (5, 21), method, antialias=True)
        assert batch.shape == (2, 5, 21, 3)
        np.testing.assert_allclose(pk.io.resize(flat, (4, 30), method, antialias=True), 77,
                                   rtol=3e-6)  # weights sum to 1 (in float32)
    for method in ["bilinear", "nearest", "bicubic", "area"]:  # same size: the image
        np.testing.assert_array_equal(pk.io.resize(image, (9, 13), method), image)
    assert pk.io.resize(image, (20, 20), preserve_aspect_ratio=True).shape == (14, 20, 3)
    assert pk.image.ResizeMethod.AREA == "area"
