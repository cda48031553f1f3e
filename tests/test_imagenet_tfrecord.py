"""ImageNet-style TFRecord shards: the generator, the preprocessing, the config's pipeline and a
2-step fit of a tiny ResNet from configs/resnet50_tfrecord.toml (podkit.datasets.imagenet_*)."""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import podkit as pk
from podkit import config as config_lib
from podkit.datasets import imagenet_preprocessing as prep
from podkit.datasets import imagenet_tfrecord as inet

ROOT = Path(__file__).resolve().parent.parent
CLASSES = 10
SIDES = {"min_side": 40, "max_side": 96}
ALL = {"image/encoded": pk.io.FixedLenFeature((), "string"),
       "image/class/label": pk.io.FixedLenFeature((), "int64"),
       "image/height": pk.io.FixedLenFeature((), "int64"),
       "image/width": pk.io.FixedLenFeature((), "int64"),
       "image/format": pk.io.FixedLenFeature((), "string")}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """24 training images in 2 shards, 8 validation images in 2 more."""
    where = tmp_path_factory.mktemp("imagenet")
    inet.write_shards(str(where), 24, 2, classes=CLASSES, split="train", workers=1, **SIDES)
    inet.write_shards(str(where), 8, 2, classes=CLASSES, split="validation", workers=1,
                      **SIDES)
    return where


def records(files: list[str]) -> list[bytes]:
    return [r for f in files for r in pk.io.tf_record_iterator(f)]


def test_shards_are_named_and_filled_as_imagenets(shards):
    train = sorted(str(p) for p in shards.glob("train-*"))
    assert [os.path.basename(p) for p in train] == ["train-00000-of-00002",
                                                    "train-00001-of-00002"]
    recs = records(train)
    assert len(recs) == 24
    for r in recs:
        ex = pk.io.parse_single_example(r, ALL)
        image = pk.io.decode_jpeg(ex["image/encoded"])
        assert image.shape == (ex["image/height"], ex["image/width"], 3)
        assert 40 <= image.shape[0] <= 96 and 40 <= image.shape[1] <= 96
        assert 1 <= ex["image/class/label"] <= CLASSES  # 1-based, as ImageNet's conversion
        assert ex["image/format"] == b"JPEG"


def test_generation_is_deterministic_by_seed(shards, tmp_path):
    again = inet.write_shards(str(tmp_path / "a"), 24, 2, classes=CLASSES, split="train",
                              workers=1, **SIDES)
    assert records(again) == records(sorted(str(p) for p in shards.glob("train-*")))
    other = inet.example(0, CLASSES, seed=1, **SIDES)
    assert other != inet.example(0, CLASSES, seed=0, **SIDES)
    # an image is a function of (seed, split, index): not of the shard it lands in
    assert records(again)[13] == inet.example(13, CLASSES, seed=0, **SIDES)


def test_generator_refuses_bad_sizes(tmp_path):
    with pytest.raises(pk.ConfigError, match="shards = 5 is more than images = 3"):
        inet.write_shards(str(tmp_path), 3, 5)
    with pytest.raises(pk.ConfigError, match="max_side = 50 is below min_side = 60"):
        inet.write_shards(str(tmp_path), 3, 1, min_side=60, max_side=50)


def test_crop_boxes_stay_inside_and_follow_inceptions_ranges():
    rng = np.random.default_rng(0)
    for _ in range(500):
        h, w = (int(v) for v in rng.integers(20, 400, 2))
        top, left, ch, cw = prep.random_crop_box(rng, h, w, 224)
        assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w
        if (ch, cw) != prep.center_crop_box(h, w, 224)[2:]:
            # rounding to whole pixels moves area and aspect by a pixel at most
            assert 0.08 * h * w * 0.8 <= ch * cw <= h * w
            assert 3 / 4 * 0.9 <= cw / ch <= 4 / 3 * 1.1
    # no box of aspect 3/4..4/3 and >= 8% of the area fits a 10x1000 strip: the center crop
    assert prep.random_crop_box(rng, 10, 1000, 224) == prep.center_crop_box(10, 1000, 224)
    assert prep.center_crop_box(256, 300, 224) == (16, 38, 224, 224)  # 87.5% of 256


def test_dct_scaling_only_when_the_crop_is_twice_the_output():
    assert prep.dct_factor((0, 0, 500, 460), 224) == 2
    assert prep.dct_factor((0, 0, 500, 440), 224) == 1
    assert prep.dct_factor((0, 0, 1800, 1800), 224) == 8
    image, _ = inet.synthetic_image(0, min_side=480, max_side=480)
    jpeg = pk.io.encode_jpeg(image, quality=95)
    whole = (0, 0, 480, 480)
    half = prep.decode_crop_resize(jpeg, 120, whole, scaled_decode=True)
    full = prep.decode_crop_resize(jpeg, 120, whole, scaled_decode=False)
    assert half.shape == full.shape == (120, 120, 3) and half.dtype == np.uint8
    # the same picture: a DCT-scaled decode is a low-pass like the antialiased resize
    assert np.abs(half.astype(int) - full.astype(int)).mean() < 4
    mirrored = prep.decode_crop_resize(jpeg, 120, whole, scaled_decode=False, flip=True)
    np.testing.assert_array_equal(mirrored, full[:, ::-1])


def test_normalize_is_imagenets_mean_and_std():
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    want = (image.astype(np.float32) - prep.MEAN_RGB) / prep.STDDEV_RGB
    np.testing.assert_allclose(prep.normalize(image), want, rtol=1e-6, atol=1e-6)
    got = prep.normalize(image, ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (5, 7, 3)
    np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16))


def test_train_image_is_the_drawn_crop_then_the_drawn_flip(shards):
    jpeg = pk.io.parse_single_example(records(sorted(map(str, shards.glob("train-*"))))[0],
                                      ALL)["image/encoded"]
    flips = set()
    for index in range(12):
        got = prep.train_image(jpeg, prep.element_rng(7, index), 32)
        rng = prep.element_rng(7, index)
        height, width = pk.io.decode_jpeg(jpeg).shape[:2]
        box = prep.random_crop_box(rng, height, width, 32)
        crop = prep.decode_crop_resize(jpeg, 32, box)
        flip = rng.random() < 0.5
        flips.add(flip)
        np.testing.assert_array_equal(got, prep.normalize(crop[:, ::-1] if flip else crop))
        # the same (seed, index): the same pixels; the image is normalised float32
        np.testing.assert_array_equal(got, prep.train_image(jpeg, prep.element_rng(7, index), 32))
        assert got.dtype == np.float32 and abs(float(got.mean())) < 3
    assert flips == {True, False}


def test_a_label_outside_the_classes_names_the_fix(shards):
    rec = records(sorted(map(str, shards.glob("train-*"))))[0]
    label = pk.io.parse_single_example(rec, ALL)["image/class/label"]
    bad = inet.Preprocess(size=16, classes=1, label_offset=label + 1)
    with pytest.raises(pk.DataError, match="data.label_offset"):
        bad(0, rec)


def test_a_damaged_shard_is_named_before_training(shards, tmp_path, monkeypatch):
    """Its record count is unknown (as tf.data's): no shuffle of one record, no run that
    stops at the bad record."""
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "train-bad"
    data = (shards / "train-00000-of-00002").read_bytes()
    bad.write_bytes(data[:-3])  # truncated
    files = [str(shards / "train-00001-of-00002"), str(bad)]
    with pytest.raises(pk.DataError, match=r"data.files: a corrupt or truncated record in "
                                           r".*train-bad"):
        inet.pipeline(files, 4, inet.Preprocess(size=16, classes=CLASSES))


def tiny_config(shards: Path, **more: str) -> config_lib.Config:
    sets = {"data.generate": "0", "data.files": f'"{shards}/train-*"',
            "data.validation_files": f'"{shards}/validation-*"', "data.batch_size": "4",
            "data.image_size": "32", "data.classes": str(CLASSES), "model.depth": "18",
            "model.width": "4", "train.steps": "2", "train.steps_per_execution": "1",
            "train.warmup_steps": "0", "train.eval_every": "2", "train.eval_steps": "1",
            **more}
    return config_lib.load(ROOT / "configs/resnet50_tfrecord.toml",
                           [f"{k}={v}" for k, v in sets.items()])


@pytest.fixture(scope="module")
def data(shards):
    return pk.datasets.load(tiny_config(shards).data, seed=0)


def test_the_configs_pipeline_gives_pixels_their_statistics_and_labels(shards, data):
    assert data.streamed and data.rows == 24
    assert data.info["classes"] == CLASSES and data.info["image_shape"] == (32, 32, 3)
    assert data.info["validation_batches"] == 2
    # the config ships uint8 pixels; the ResNet normalises them on the device with these
    assert data.info["pixel_mean"] == prep.MEAN_RGB.tolist()
    assert data.info["pixel_std"] == prep.STDDEV_RGB.tolist()
    x, y = next(iter(data.train))
    assert x.shape == (4, 32, 32, 3) and x.dtype == np.uint8
    assert y.shape == (4,) and y.dtype == np.int32 and ((0 <= y) & (y < CLASSES)).all()
    # validation: in file order, labels 1-based in the files, 0-based out
    want = [pk.io.parse_single_example(r, ALL)["image/class/label"] - 1
            for r in records(sorted(map(str, shards.glob("validation-*"))))]
    got = np.concatenate([b[1] for b in data.validation])
    np.testing.assert_array_equal(got, want)


def first_batches(files: list[str], p: inet.Preprocess, **kw) -> list:
    it = iter(inet.pipeline(files, 4, p, shuffle_seed=5, **kw))
    out = [next(it) for _ in range(3)]
    it.close()
    return out


def assert_same(a: list, b: list) -> None:
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa.astype(np.float32), xb.astype(np.float32))


def test_workers_and_threads_crop_what_the_consumer_crops(shards):
    files = sorted(map(str, shards.glob("train-*")))
    p = inet.Preprocess(size=24, classes=CLASSES, seed=3)
    # the same elements in the same order, the same pixels, in 0 or 2 worker processes
    assert_same(first_batches(files, p, num_parallel_calls=None),
                first_batches(files, p, num_parallel_calls=2))
    # threads: their own seeded order when training, the same on every run ...
    threads = first_batches(files, p, num_parallel_calls=3, parallel="threads")
    assert_same(threads, first_batches(files, p, num_parallel_calls=3, parallel="threads"))
    # ... and the records' order without shuffling
    once = inet.Preprocess(size=24, classes=CLASSES, training=False)
    assert_same(first_batches(files, once, repeat=False, num_parallel_calls=2),
                first_batches(files, once, repeat=False, num_parallel_calls=3,
                              parallel="threads"))


def test_generate_writes_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    config = config_lib.load(ROOT / "configs/resnet50_tfrecord.toml", [
        "data.generate=8", "data.shards=2", "data.validation_fraction=0.5", "data.min_side=24",
        "data.max_side=40", "data.batch_size=4"]).data
    train, val = inet.generated(config)
    assert [os.path.basename(f) for f in train] == ["train-00000-of-00002",
                                                    "train-00001-of-00002"]
    assert len(val) == 2 and len(records(train)) == 8 and len(records(val)) == 4
    stamp = [os.stat(f).st_mtime_ns for f in train]
    assert inet.generated(config) == (train, val)
    assert [os.stat(f).st_mtime_ns for f in train] == stamp  # read, not written again
    with pytest.raises(pk.ConfigError, match="exactly one of them"):
        pk.datasets.load(config_lib.load(ROOT / "configs/resnet50_tfrecord.toml",
                                         ['data.files="x/train-*"']).data)


def test_uint8_images_normalised_on_the_device_equal_the_hosts_normalisation(shards):
    # data.image_dtype = "uint8": the pipeline hands the pixels over and the ResNet
    # subtracts the mean and divides by the std on the device, as the host's table does.
    import flax.nnx as nnx

    from podkit.config import ResNetConfig
    from podkit.models.resnet import ResNet

    files = sorted(str(p) for p in shards.glob("train-*"))
    record = records(files)[3]
    pixels, label = inet.Preprocess(size=32, classes=CLASSES, dtype="uint8")(3, record)
    floats, same = inet.Preprocess(size=32, classes=CLASSES, dtype="float32")(3, record)
    assert pixels.dtype == np.uint8 and label == same
    np.testing.assert_array_equal(prep.normalize(pixels), floats)
    config = ResNetConfig(depth=18, width=8, precision="float32")
    stats = {"pixel_mean": prep.MEAN_RGB.tolist(), "pixel_std": prep.STDDEV_RGB.tolist()}
    with nnx.use_eager_sharding(False):
        on_device = ResNet(config, CLASSES, (32, 32, 3), nnx.Rngs(0), **stats)
        on_host = ResNet(config, CLASSES, (32, 32, 3), nnx.Rngs(0))
        with pytest.raises(pk.ConfigError, match="pixel_std = None"):
            ResNet(config, CLASSES, (32, 32, 3), nnx.Rngs(0), stats["pixel_mean"])
    on_device.eval(), on_host.eval()
    np.testing.assert_allclose(np.asarray(on_device(pixels[None])),
                               np.asarray(on_host(floats[None])), rtol=1e-5, atol=1e-5)
    data = inet.load_imagenet_tfrecord(config_lib.ImageNetTFRecordDataConfig(
        files=",".join(files), batch_size=8, classes=CLASSES, image_size=32,
        image_dtype="uint8"))
    assert data.info["pixel_mean"] == stats["pixel_mean"]
    x, _ = next(iter(data.train))
    assert x.dtype == np.uint8 and x.shape == (8, 32, 32, 3)
