"""pk.io.decode_crop_resize and sample_crop_window: a pipeline's crop in one call, against
TensorFlow's four ops where it is installed, and its refusals."""

import numpy as np
import pytest

import podkit as pk
from podkit.errors import ConfigError, DataError
from podkit.io import crops

simplejpeg = pytest.importorskip("simplejpeg")


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    rgb = np.stack([128 + 100 * np.sin(x / 5 + y / 9), 128 + 90 * np.cos(y / 4 - x / 11),
                    (7 * x + 3 * y) % 256], axis=-1) + rng.normal(0, 6, (h, w, 3))
    return np.clip(rgb, 0, 255).astype(np.uint8)


def jpeg(h: int, w: int, seed: int = 0) -> bytes:
    return simplejpeg.encode_jpeg(photo(h, w, seed), quality=90, colorsubsampling="420")


def test_decode_crop_resize_is_tensorflows_decode_crop_and_antialiased_resize():
    tf = pytest.importorskip("tensorflow")
    worst, edges = 0.0, []
    for seed, (h, w) in enumerate([(262, 242), (160, 320), (301, 177)]):
        data = jpeg(h, w, seed)
        rng = np.random.default_rng(seed)
        for _ in range(6):
            window = pk.io.sample_crop_window(rng, pk.io.extract_jpeg_shape(data), (0.25, 1.0))
            y, x, wh, ww = (int(v) for v in window)
            for flip in (False, True):
                ours = pk.io.decode_crop_resize(data, window, (96, 96), flip=flip,
                                                scaled_decode=False)
                full = tf.io.decode_jpeg(data, channels=3)[y:y + wh, x:x + ww]
                ref = tf.image.resize(full, (96, 96), antialias=True).numpy()
                ref = ref[:, ::-1] if flip else ref
                assert ours.dtype == np.uint8 and ours.shape == (96, 96, 3)
                # Inside: Pillow's fixed-point triangle filter and the uint8 rounding. At the
                # window's edges Pillow's filter reads the image's pixels beyond the window,
                # where TF's resize of the cut window has none.
                worst = max(worst, float(np.abs(ours - ref)[3:-3, 3:-3].max()))
                edges.append(float(np.abs(ours - ref).mean()))
    assert worst <= 3.0, worst
    assert max(edges) < 1.5, max(edges)


def test_a_scaled_decode_reads_fewer_pixels_and_stays_close():
    data = jpeg(960, 900, 3)
    window = [20, 30, 900, 800]  # over four times 200 both ways: decoded at 1/4
    scaled = pk.io.decode_crop_resize(data, window, (200, 200))
    full = pk.io.decode_crop_resize(data, window, (200, 200), scaled_decode=False)
    diff = np.abs(scaled.astype(int) - full)
    assert 0 < diff.mean() < 4, diff.mean()  # the scaled DCT is itself a low-pass filter
    assert crops.dct_factor(900, 800, 200, 200) == 4
    assert crops.dct_factor(399, 800, 200, 200) == 1


def test_sample_crop_window_follows_the_area_and_aspect_ranges():
    rng = np.random.default_rng(0)
    areas, ratios = [], []
    for _ in range(400):
        y, x, h, w = pk.io.sample_crop_window(rng, (240, 200), (0.25, 1.0), (3 / 4, 4 / 3))
        assert 0 <= y and 0 <= x and y + h <= 240 and x + w <= 200 and h > 0 and w > 0
        if (h, w) != (240, 200):
            areas.append(h * w / (240 * 200))
            ratios.append(w / h)
    assert 0.23 < min(areas) and max(areas) <= 1.0 and 0.5 < np.mean(areas) < 0.7
    assert 0.7 < min(ratios) and max(ratios) < 1.4
    # A range no window can meet: the whole image, as sample_distorted_bounding_box's fallback
    whole = pk.io.sample_crop_window(rng, (10, 100), (0.9, 1.0), (20.0, 30.0))
    assert whole.tolist() == [0, 0, 10, 100]
    # Seeded per element: the same (seed, index), the same window
    a = pk.io.sample_crop_window(np.random.default_rng([7, 3]), (240, 200))
    b = pk.io.sample_crop_window(np.random.default_rng([7, 3]), (240, 200))
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("call, error, said", [
    (lambda d: pk.io.decode_crop_resize(d, [0, 0, 50, 60], (96, 96)), ConfigError,
     r"does not fit in the 40x70 image"),
    (lambda d: pk.io.decode_crop_resize(d, [-1, 0, 10, 10], (96, 96)), ConfigError, "-1"),
    (lambda d: pk.io.decode_crop_resize(d, [0, 0, 10], (96, 96)), ConfigError,
     r"\[y, x, height, width\]"),
    (lambda d: pk.io.decode_crop_resize(d, [0, 0, 10, 10], (96, 0)), ConfigError,
     "two positive ints"),
    (lambda d: pk.io.decode_crop_resize(d, [0, 0, 10, 10], "96"), ConfigError, "size='96'"),
    (lambda d: pk.io.decode_crop_resize(d, [0, 0, 10, 10], (9, 9), "area"), ConfigError,
     "method='area'"),
    (lambda d: pk.io.decode_crop_resize(d.decode("latin1"), [0, 0, 1, 1], (9, 9)),
     ConfigError, "as bytes"),
    (lambda d: pk.io.decode_crop_resize(b"", [0, 0, 1, 1], (9, 9)), DataError, "empty"),
    (lambda d: pk.io.decode_crop_resize(b"not a jpeg", [0, 0, 1, 1], (9, 9)), DataError,
     "not a JPEG"),
    (lambda d: pk.io.decode_crop_resize(pk.io.encode_png(np.zeros((4, 4, 3), np.uint8)),
                                        [0, 0, 1, 1], (9, 9)), DataError, "decode_image"),
    (lambda d: pk.io.decode_crop_resize(d[:2] + b"garbage", [0, 0, 1, 1], (9, 9)), DataError,
     "invalid JPEG"),
    (lambda d: pk.io.sample_crop_window(0, (9, 9)), ConfigError, "default_rng"),
    (lambda d: pk.io.sample_crop_window(np.random.default_rng(0), (0, 0, 3)), ConfigError,
     "positive sides"),
    (lambda d: pk.io.sample_crop_window(np.random.default_rng(0), (9, 9), (0.5, 1.5)),
     ConfigError, "area_range"),
    (lambda d: pk.io.sample_crop_window(np.random.default_rng(0), (9, 9), (0.5, 1), (2, 1)),
     ConfigError, "aspect_ratio_range"),
])
def test_bad_input_is_an_error_naming_it(call, error, said):
    with pytest.raises(error, match=said):
        call(jpeg(40, 70))
