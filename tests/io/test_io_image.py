"""pk.io's image codecs against TensorFlow's outputs on TF-encoded files (tests/golden/tf:
the images, and TF's decodes as arrays or SHA-256 digests in images.npz / images.json)."""

import numpy as np
import pytest
from tf_golden import GOLDEN, digest, load

import podkit as pk
from podkit.errors import ConfigError, DataError

INFO = load("images.json")
FILES, DIGESTS = INFO["files"], INFO["digests"]
JPEGS = sorted(k for k in FILES if k.startswith("jpeg"))
PNGS = sorted(k for k in FILES if k.startswith("png_"))


@pytest.fixture(scope="module")
def arrays():
    with np.load(GOLDEN / "images.npz") as z:
        return {k: z[k] for k in z.files}


def data(name: str) -> bytes:
    return (GOLDEN / FILES[name]["file"]).read_bytes()


JPEG_DECODES = {
    "decode": {}, "accurate": {"dct_method": "INTEGER_ACCURATE"},
    "no_fancy": {"fancy_upscaling": False}, "ratio2": {"ratio": 2}, "ratio8": {"ratio": 8},
    "channels1": {"channels": 1}, "channels3": {"channels": 3},
}


@pytest.mark.parametrize("name", JPEGS)
def test_decode_jpeg_equals_tensorflow_exactly(name):
    # Grey and RGB, 4:2:0 and 4:4:4, three sizes: every option's pixels are TF's own.
    for variant, kwargs in JPEG_DECODES.items():
        assert digest(pk.io.decode_jpeg(data(name), **kwargs)) == DIGESTS[f"{name}/{variant}"], \
            variant


def test_decode_image_to_float_equals_tensorflow(arrays):
    for name in [n for n in JPEGS if "17x23" in n]:
        got = pk.io.decode_image(data(name), dtype=np.float32)
        np.testing.assert_array_equal(got, arrays[f"{name}/decode_image_f32"])


@pytest.mark.parametrize("name", JPEGS)
def test_encode_jpeg_gives_tensorflows_pixels(name, arrays):
    source = arrays[f"{name}/source"]
    chroma = not name.endswith("_444")
    for ours, theirs in ((pk.io.encode_jpeg(source, quality=90, chroma_downsampling=chroma),
                          arrays[f"{name}/encode_jpeg_q90"].tobytes()),
                         (pk.io.encode_jpeg(source), arrays[f"{name}/encode_jpeg_default"]
                          .tobytes())):
        np.testing.assert_array_equal(pk.io.decode_jpeg(ours), pk.io.decode_jpeg(theirs))
        if source.shape[2] == 3:  # colour: TF's very bytes (greyscale headers differ)
            assert ours == theirs


@pytest.mark.parametrize("name", PNGS)
def test_decode_png_equals_tensorflow(name, arrays):
    source = arrays[f"{name}/source"]
    np.testing.assert_array_equal(pk.io.decode_png(data(name)), source)
    np.testing.assert_array_equal(pk.io.decode_image(data(name)), source)
    for ch in (1, 3, 4):
        assert digest(pk.io.decode_png(data(name), channels=ch)) == \
            DIGESTS[f"{name}/channels{ch}"], ch
    assert digest(pk.io.decode_png(data(name), dtype=np.uint16)) == DIGESTS[f"{name}/uint16"]


def test_sixteen_bit_png_equals_tensorflow(arrays):
    raw = data("png16_20x30_c1")
    np.testing.assert_array_equal(pk.io.decode_png(raw, dtype=np.uint16),
                                  arrays["png16_20x30_c1/uint16"])
    np.testing.assert_array_equal(pk.io.decode_png(raw), arrays["png16_20x30_c1/decode"])
    source = arrays["png16_20x30_c1/source"]
    np.testing.assert_array_equal(pk.io.decode_png(pk.io.encode_png(source), dtype=np.uint16),
                                  source)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_encode_png_round_trips(arrays, channels):
    source = arrays[f"png_17x23_c{channels}/source"]
    np.testing.assert_array_equal(pk.io.decode_png(pk.io.encode_png(source)), source)


def test_decode_raw_equals_tensorflow(arrays):
    raw = arrays["raw/bytes"].tobytes()
    np.testing.assert_array_equal(pk.io.decode_raw(raw, np.int32), arrays["raw/int32_le"])
    np.testing.assert_array_equal(pk.io.decode_raw(raw, "int32", little_endian=False),
                                  arrays["raw/int32_be"])
    np.testing.assert_array_equal(pk.io.decode_raw(raw, np.float16), arrays["raw/float16"])
    assert pk.io.decode_raw([raw, raw], np.int32).shape == (2, 12)


def test_bad_image_data_is_a_data_error_and_bad_options_a_config_error():
    jpeg = data(JPEGS[0])
    with pytest.raises(DataError, match="decode_jpeg"):
        pk.io.decode_jpeg(b"not a jpeg")
    with pytest.raises(DataError, match="decode_jpeg"):
        pk.io.decode_jpeg(jpeg[: len(jpeg) // 2])
    with pytest.raises(DataError, match="not a PNG"):
        pk.io.decode_png(jpeg)
    with pytest.raises(DataError, match="decode_image"):
        pk.io.decode_image(b"GIF89a-broken")
    with pytest.raises(ConfigError, match="channels=2"):
        pk.io.decode_jpeg(jpeg, channels=2)
    with pytest.raises(ConfigError, match="str"):
        pk.io.decode_jpeg("a path?")
    with pytest.raises(ConfigError, match="uint8"):
        pk.io.encode_jpeg(np.zeros((4, 4, 3), np.float32))


def test_try_recover_truncated_decodes_what_a_cut_jpeg_holds():
    name = [n for n in JPEGS if "96x128_c3_420" in n][0]
    jpeg = data(name)
    image = pk.io.decode_jpeg(jpeg[: len(jpeg) * 3 // 4], try_recover_truncated=True)
    assert image.shape == (96, 128, 3)


def test_decode_jpeg_takes_a_parsed_feature():
    jpeg = data(JPEGS[0])
    record = pk.io.serialize_example({"image": jpeg})
    parsed = pk.io.parse_single_example(record, {"image": pk.io.FixedLenFeature([], "string")})
    np.testing.assert_array_equal(pk.io.decode_jpeg(parsed["image"]), pk.io.decode_jpeg(jpeg))
    batch = pk.io.parse_example([record], {"image": pk.io.FixedLenFeature([], "string")})
    np.testing.assert_array_equal(pk.io.decode_jpeg(batch["image"][0]), pk.io.decode_jpeg(jpeg))


def test_decode_image_to_float_reads_png_at_sixteen_bits_as_tensorflow(arrays):
    for c in (1, 3, 4):
        got = pk.io.decode_image(data(f"png_17x23_c{c}"), dtype=np.float32)
        np.testing.assert_array_equal(got, arrays[f"png_17x23_c{c}/decode_image_f32"])


@pytest.mark.parametrize("name", ["anim_12x15.gif", "rgb_12x15.bmp", "rgb_12x15.webp"])
def test_decode_image_reads_gif_bmp_and_webp_as_tensorflow(name, arrays):
    np.testing.assert_array_equal(pk.io.decode_image(data(name)), arrays[f"{name}/source"])
    np.testing.assert_array_equal(pk.io.decode_image(data(name), expand_animations=False),
                                  arrays[f"{name}/first_frame"])


def test_decode_jpeg_takes_png_and_gif_as_tensorflows_does(arrays):
    """tf.io.decode_jpeg decodes PNGs and non-animated GIFs too ("the interface is the
    same"); a TF pipeline that relies on it keeps working."""
    png = (GOLDEN / "png_17x23_c3.png").read_bytes()
    np.testing.assert_array_equal(pk.io.decode_jpeg(png), pk.io.decode_png(png))
    grey = pk.io.decode_jpeg(png, channels=1)
    assert grey.shape == (17, 23, 1)
    np.testing.assert_array_equal(grey, pk.io.decode_png(png, channels=1))


def test_empty_bytes_are_an_error_naming_the_missing_image():
    for decode in (pk.io.decode_jpeg, pk.io.decode_png, pk.io.decode_image):
        with pytest.raises(DataError, match="the image is empty"):
            decode(b"")
