"""ImageNet-style TFRecord shards: a generator, and the input pipeline that reads them.

The files are what TensorFlow's ImageNet conversion (tensorflow/models `build_imagenet_data.py`,
tensorflow/tpu `imagenet_to_gcs.py`) writes: shards named `train-00000-of-01024`, each record a
`tf.train.Example` with `image/encoded` (the JPEG's bytes), `image/class/label` (int64, 1..1000:
0 is the unused background class), `image/height`, `image/width`, `image/format` (b"JPEG"),
`image/colorspace` (b"RGB") and `image/channels` (3). Real ImageNet shards read as they are:

    [data]
    name = "imagenet_tfrecord"
    files = "gs://bucket/imagenet/train-*"
    validation_files = "gs://bucket/imagenet/validation-*"

or `generate = N` writes N synthetic images (and `validation_fraction` x N for validation) once
into the cache (`$PODKIT_CACHE/imagenet_tfrecord/...`) and reads those. From a shell:

    python -m podkit.datasets.imagenet_tfrecord --out DIR --images 10000 --shards 16

A synthetic image: `min_side`-`max_side` px on each side (any aspect ratio in that square),
RGB, its class's smooth colour field (a sum of 2-D sinusoids, shifted per image) in a random
contrast, plus pixel noise and 8x8-block texture, encoded at JPEG quality 90 with 4:2:0 chroma
(ImageNet's usual): 19-125 KB, 58 KB on average at 200-500 px, 0.47 bytes per pixel
(ImageNet's training JPEGs average ~110 KB at ~400x350, nearer 0.8: these decode a little
faster per pixel than real photographs). Every image is a function of (seed, split,
index), so shards are reproducible and can be written in parallel.

The pipeline (`pipeline()`, what the config's loader builds) runs in pk.data's workers: the
records of every shard through the TFRecord index (random access: a full shuffle, exact
resume, the per-process split), `pk.io.parse_single_example`, then
`imagenet_preprocessing`'s decode + crop + resize + flip + normalise, batched.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from podkit.config import IMAGE_DTYPES
from podkit.errors import ConfigError, DataError

QUALITY = 90  # JPEG quality of the generated images
WAVES = 4  # sinusoids per channel in a class's template
SPLITS = {"train": 0, "validation": 1}  # a split's images are drawn from its own stream
LAYOUT_VERSION = 1  # in the cache key: a change in what is written makes a new set


# -- the generator ----------------------------------------------------------------------------
def synthetic_image(index: int, classes: int = 1000, seed: int = 0, split: str = "train",
                    min_side: int = 200, max_side: int = 500) -> tuple[np.ndarray, int]:
    """(image (h, w, 3) uint8, label in 1..classes): image `index` of a split."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    label = int(rng.integers(classes)) + 1
    h, w = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
    # The class's template: the same waves for every image of the class (its own stream).
    crng = np.random.default_rng([seed, 2, label])
    freq = crng.uniform(0.5, 4.0, (3, WAVES, 2)).astype(np.float32) * np.float32(2 * np.pi)
    phase = crng.uniform(0, 2 * np.pi, (3, WAVES)).astype(np.float32)
    amp = crng.uniform(0.5, 1.0, (3, WAVES)).astype(np.float32)
    shift = rng.uniform(-0.25, 0.25, 2).astype(np.float32)
    scale = np.float32(max(h, w))
    yy = np.arange(h, dtype=np.float32) / scale + shift[0]
    xx = np.arange(w, dtype=np.float32) / scale + shift[1]
    image = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        for k in range(WAVES):
            # sin(a + b) as two outer products: separable, so ~h + w sines, not h * w
            a = freq[c, k, 0] * yy
            b = freq[c, k, 1] * xx + phase[c, k]
            image[:, :, c] += amp[c, k] * (np.outer(np.sin(a), np.cos(b))
                                           + np.outer(np.cos(a), np.sin(b)))
    lo, hi = image.min(), image.max()
    image = (image - lo) * np.float32(255 / max(hi - lo, 1e-6))
    image = 127.5 + (image - 127.5) * np.float32(rng.uniform(0.6, 1.0))
    # Pixel noise and 8x8-block texture: what keeps a JPEG from compressing to nothing.
    image += rng.standard_normal((h, w, 3), dtype=np.float32) * np.float32(rng.uniform(10, 20))
    blocks = rng.standard_normal((h // 8 + 1, w // 8 + 1, 3), dtype=np.float32)
    image += np.repeat(np.repeat(blocks, 8, 0), 8, 1)[:h, :w] * np.float32(10)
    return np.clip(image, 0, 255).astype(np.uint8), label


def example(index: int, classes: int = 1000, seed: int = 0, split: str = "train",
            min_side: int = 200, max_side: int = 500) -> bytes:
    """One serialized tf.train.Example, with the features ImageNet's conversion writes."""
    import simplejpeg

    from podkit import io

    image, label = synthetic_image(index, classes, seed, split, min_side, max_side)
    jpeg = simplejpeg.encode_jpeg(image, quality=QUALITY, colorspace="RGB",
                                  colorsubsampling="420")
    # deterministic: map entries sorted by key (protobuf's own order varies by process), so
    # the same seed writes the same bytes wherever a shard is written
    return io.make_example({
        "image/encoded": jpeg,
        "image/class/label": label,
        "image/height": image.shape[0],
        "image/width": image.shape[1],
        "image/format": b"JPEG",
        "image/colorspace": b"RGB",
        "image/channels": 3,
        "image/filename": f"{split}_{index:08d}.JPEG".encode(),
    }).SerializeToString(deterministic=True)


def shard_names(directory: str, split: str, shards: int) -> list[str]:
    """`DIR/train-00000-of-00016`, ... as ImageNet's conversion names them."""
    return [os.path.join(directory, f"{split}-{k:05d}-of-{shards:05d}") for k in range(shards)]


def _write_shard(path: str, indices: range, classes: int, seed: int, split: str,
                 min_side: int, max_side: int) -> str:
    from podkit import io

    with io.TFRecordWriter(path) as writer:
        for i in indices:
            writer.write(example(i, classes, seed, split, min_side, max_side))
    return path


def write_shards(directory: str, images: int, shards: int = 16, classes: int = 1000,
                 seed: int = 0, split: str = "train", min_side: int = 200,
                 max_side: int = 500, workers: int | None = None) -> list[str]:
    """Write `images` synthetic images as `shards` TFRecord files named as ImageNet's
    (`split-00000-of-000NN`) into `directory`; returns their paths. Shard k holds images
    [k * images // shards, (k + 1) * images // shards). `workers` > 1 writes shards in that
    many processes (default: one per usable core, at most one per shard)."""
    for key, value, low in (("images", images, 1), ("shards", shards, 1),
                            ("classes", classes, 1), ("min_side", min_side, 8)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{key} = {value!r}; use an int >= {low}.")
    if max_side < min_side:
        raise ConfigError(f"max_side = {max_side} is below min_side = {min_side}; give "
                          "min_side <= max_side.")
    if shards > images:
        raise ConfigError(f"shards = {shards} is more than images = {images}: a shard would "
                          "be empty. Use at most one shard per image.")
    if split not in SPLITS:
        raise ConfigError(f"split = {split!r}; use one of {', '.join(SPLITS)}.")
    os.makedirs(directory, exist_ok=True)
    paths = shard_names(directory, split, shards)
    jobs = [(path, range(k * images // shards, (k + 1) * images // shards), classes, seed,
             split, min_side, max_side) for k, path in enumerate(paths)]
    workers = min(len(os.sched_getaffinity(0)) if workers is None else workers, shards)
    if workers <= 1:
        return [_write_shard(*job) for job in jobs]
    _write_in_processes(jobs, workers)
    return paths


def _write_in_processes(jobs: list[tuple], workers: int) -> None:
    """Each shard written by `python -m podkit.datasets.imagenet_tfrecord --shard ...`, at
    most `workers` at a time: a fresh interpreter, so neither a fork of this process (which
    may run JAX's threads) nor multiprocessing's spawn (which re-runs the caller's
    `__main__`: a flat script would need an `if __name__ == "__main__"` guard)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    pending, running = list(jobs), []
    try:
        while pending or running:
            while pending and len(running) < workers:
                path, indices, classes, seed, split, lo, hi = pending.pop(0)
                command = [sys.executable, "-m", "podkit.datasets.imagenet_tfrecord",
                           "--shard", path, "--first", str(indices.start),
                           "--images", str(len(indices)), "--classes", str(classes),
                           "--seed", str(seed), "--split", split, "--min-side", str(lo),
                           "--max-side", str(hi)]
                running.append((path, subprocess.Popen(command, env=env,
                                                       stdout=subprocess.DEVNULL,
                                                       stderr=subprocess.PIPE)))
            path, proc = running.pop(0)
            _, err = proc.communicate()
            if proc.returncode:
                raise DataError(f"writing {path} failed (exit {proc.returncode}):\n"
                                f"{err.decode(errors='replace')[-3000:]}")
    finally:
        for _, proc in running:
            proc.kill()
            proc.wait()


# -- the pipeline -----------------------------------------------------------------------------


def _features() -> dict:
    from podkit import io

    return {"image/encoded": io.FixedLenFeature((), "string"),
            "image/class/label": io.FixedLenFeature((), "int64")}


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """The map of the pipeline: (element index, serialized Example) -> (image, label).

    image: (size, size, 3) normalised, `dtype`; label: int32 in 0..classes-1 (the record's
    `image/class/label` minus `label_offset`: 1 for ImageNet's 1-based labels). Training
    draws its crop and flip from (seed, index): the element index counts across epochs, so
    every epoch crops anew, and the same index crops alike in any worker."""

    size: int = 224
    training: bool = True
    seed: int = 0
    classes: int = 1000
    label_offset: int = 1
    dtype: str = "bfloat16"
    scaled_decode: bool = True

    def __call__(self, index: Any, record: Any) -> tuple[np.ndarray, np.int32]:
        from podkit import io
        from podkit.datasets import imagenet_preprocessing as prep

        parsed = io.parse_single_example(record, _features())
        jpeg = parsed["image/encoded"]
        jpeg = jpeg.item() if isinstance(jpeg, np.ndarray) else jpeg
        raw = int(parsed["image/class/label"])
        label = raw - self.label_offset
        if not 0 <= label < self.classes:
            raise DataError(f"element {int(index)}: image/class/label = {raw}, outside "
                            f"[{self.label_offset}, {self.classes + self.label_offset}) "
                            f"(data.label_offset = {self.label_offset}, data.classes = "
                            f"{self.classes}); set data.label_offset to the smallest label "
                            "(1 for ImageNet's conversion, 0 for labels from 0) and "
                            "data.classes to the number of classes.")
        dtype = _numpy_dtype(self.dtype)
        if self.training:
            rng = prep.element_rng(self.seed, index)
            image = prep.train_image(jpeg, rng, self.size, dtype, self.scaled_decode)
        else:
            image = prep.eval_image(jpeg, self.size, dtype, self.scaled_decode)
        return image, np.int32(label)


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    if name == "float32":
        return np.float32
    if name == "uint8":  # the model normalises on the device (info["pixel_mean"], ["pixel_std"])
        return np.uint8
    raise ConfigError(f"data.image_dtype = {name!r}; use one of {', '.join(IMAGE_DTYPES)}.")


PARALLEL = ("threads", "processes")


def whole_records(files: list[str], what: str = "files") -> Any:
    """TFRecordDataset(files), whose length the shuffle and the epochs need: a file with a
    corrupt or truncated record (its count then unknown, as tf.data's) is a DataError now,
    not a shuffle of one record and a run that stops at the bad one."""
    from podkit import data
    from podkit.data.tfrecords import TFRecordSource

    records = data.TFRecordDataset(files)
    if records.cardinality() < 0:
        plan = records.plan
        named = plan.source.damaged if isinstance(plan, TFRecordSource) else files
        raise DataError(f"data.{what}: a corrupt or truncated record in {', '.join(named)} "
                        "(pk.io.tf_record_iterator shows where); write the file again or "
                        "leave it out.")
    return records


def pipeline(files: list[str], batch_size: int, preprocess: Preprocess, *,
             shuffle_seed: int | None = 0, repeat: bool = True,
             num_parallel_calls: Any = None, deterministic: bool | None = None,
             parallel: str = "processes") -> Any:
    """A pk.data Dataset of (images, labels) batches of `files`: for training (`repeat`)
    shuffled over every record (a new order each pass), endless; else in file order, once.

    `parallel`: "processes" (default) maps in pk.data's worker processes (random access
    kept: in a job of several processes each computes only its own share); "threads" maps
    on `num_parallel_calls` threads of this process (an `interleave` of `shard`s of the
    records, one per thread, taken in turn: the records' order), where libjpeg-turbo,
    Pillow and numpy release the GIL for most of an image's work and no image crosses a
    process boundary -- a stream, so a multi-process job computes every image and keeps its
    share. `num_parallel_calls` defaults to AUTOTUNE: a worker per usable core (one fewer from
    4 cores up, for the consumer), or a thread per core."""
    from podkit import data
    from podkit.data.cores import schedulable_cores

    if parallel not in PARALLEL:
        raise ConfigError(f"data.parallel = {parallel!r}; use one of {', '.join(PARALLEL)}.")
    records = whole_records(files)
    if parallel == "threads":
        n = schedulable_cores() if num_parallel_calls in (None, data.AUTOTUNE) \
            else int(num_parallel_calls)
        # Thread k owns records k, k + n, ... (shuffled among themselves each pass when
        # training): every pass reads each record once; taken in turn without shuffling,
        # they are the records' order.
        images = data.Dataset.range(n).interleave(
            _Shard(records, n, preprocess, repeat, shuffle_seed), cycle_length=n,
            block_length=1, num_parallel_calls=n, deterministic=deterministic)
    else:
        if repeat:
            records = records.shuffle(max(int(records.cardinality()), 1),
                                      seed=shuffle_seed).repeat()
        calls = data.AUTOTUNE if num_parallel_calls is None else num_parallel_calls
        # the element index seeds its crop and flip
        images = records.enumerate().map(preprocess, num_parallel_calls=calls,
                                         deterministic=deterministic)
    return images.batch(batch_size, drop_remainder=True).prefetch(data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class _Shard:
    """interleave's function: the k-th of n shards of the records, preprocessed; element j
    of shard k is element j * n + k of the whole (its crop's seed)."""

    records: Any
    n: int
    preprocess: Preprocess
    repeat: bool
    seed: int | None

    def __call__(self, k: Any) -> Any:
        k = int(k)
        shard = self.records.shard(self.n, k)
        if self.repeat:
            seed = None if self.seed is None else self.seed * self.n + k
            shard = shard.shuffle(max(int(shard.cardinality()), 1), seed=seed).repeat()
        return shard.enumerate().map(_Indexed(self.preprocess, self.n, k))


@dataclasses.dataclass(frozen=True)
class _Indexed:
    preprocess: Preprocess
    n: int
    k: int

    def __call__(self, j: Any, record: Any) -> tuple[np.ndarray, np.int32]:
        return self.preprocess(int(j) * self.n + self.k, record)


def cache_dir() -> Path:
    """Where generated shards are kept: `$PODKIT_CACHE/imagenet_tfrecord`."""
    from podkit.paths import cache_root

    return cache_root() \
        / "imagenet_tfrecord"


def generated(config: Any) -> tuple[list[str], list[str]]:
    """(train files, validation files) of `data.generate` images, written into the cache
    once (one process writes; the others of a job wait on the lock and read them)."""
    validation = int(round(config.generate * config.validation_fraction))
    settings = {"images": config.generate, "validation": validation,
                "shards": config.shards, "classes": config.classes,
                "min_side": config.min_side, "max_side": config.max_side,
                "version": LAYOUT_VERSION}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    where = cache_dir() / f"generated-{key}"
    where.mkdir(parents=True, exist_ok=True)
    val_shards = max(1, min(config.shards, validation)) if validation else 0
    train_files = shard_names(str(where), "train", config.shards)
    val_files = shard_names(str(where), "validation", val_shards) if validation else []
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (where / "meta.json").is_file():
                common = dict(classes=config.classes, min_side=config.min_side,
                              max_side=config.max_side)
                write_shards(str(where), config.generate, config.shards, split="train",
                             **common)
                if validation:
                    write_shards(str(where), validation, val_shards, split="validation",
                                 **common)
                fd, tmp = tempfile.mkstemp(dir=where, prefix=".meta.")
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(settings, indent=2))
                os.replace(tmp, where / "meta.json")  # last: its presence says all is whole
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return train_files, val_files


def load_imagenet_tfrecord(config: Any, seed: int = 0) -> Any:
    """`[data] name = "imagenet_tfrecord"`: endless shuffled training batches of `files`
    (or of `generate` synthetic images), validation batches of `validation_files` (or of the
    generated validation split), with classes and the image shape in `info`."""
    from podkit.datasets.files import expand
    from podkit.datasets.registry import Data, check_ints

    check_ints(config, {"batch_size": 1, "classes": 2, "image_size": 8, "shards": 1})
    if bool(config.files) == bool(config.generate):
        raise ConfigError("data.name = 'imagenet_tfrecord' reads data.files (TFRecord shards "
                          "of tf.train.Examples, e.g. \"imagenet/train-*\") or writes "
                          "data.generate synthetic images; give exactly one of them (it has "
                          f"files = {config.files!r}, generate = {config.generate}).")
    if config.generate:
        files, val_files = generated(config)
    else:
        files = expand(config.files, "files")
        val_files = expand(config.validation_files, "validation_files") \
            if config.validation_files else []
    b = config.batch_size
    make = lambda training: Preprocess(
        size=config.image_size, training=training, seed=seed, classes=config.classes,
        label_offset=config.label_offset, dtype=config.image_dtype,
        scaled_decode=config.scaled_decode)
    rows = int(whole_records(files).cardinality())
    if rows < b:
        raise ConfigError(f"data.files hold {rows} records, fewer than one batch of "
                          f"data.batch_size = {b}; lower data.batch_size or add files.")
    train = pipeline(files, b, make(True), shuffle_seed=seed, parallel=config.parallel)
    val, val_batches = None, 0
    if val_files:
        val_rows = int(whole_records(val_files, "validation_files").cardinality())
        val_batches = val_rows // b  # whole batches only: they must divide over devices
        if val_batches == 0:
            raise ConfigError(f"the validation files hold {val_rows} records, fewer than one "
                              f"batch of data.batch_size = {b}; lower data.batch_size, or "
                              "give no validation files (data.validation_fraction = 0).")
        val = pipeline(val_files, b, make(False), repeat=False, parallel=config.parallel)
    shape = (config.image_size, config.image_size, 3)
    info = {"classes": config.classes, "image_shape": shape, "input_shape": shape,
            "files": len(files), "validation_batches": val_batches}
    if config.image_dtype == "uint8":  # what the model subtracts and divides by on the device
        from podkit.datasets.imagenet_preprocessing import MEAN_RGB, STDDEV_RGB

        info["pixel_mean"], info["pixel_std"] = MEAN_RGB.tolist(), STDDEV_RGB.tolist()
    return Data(train, val, info, rows=rows)


# -- the command line -------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m podkit.datasets.imagenet_tfrecord",
        description="Write synthetic ImageNet-style TFRecord shards (tf.train.Examples of "
                    "JPEGs, as ImageNet's TensorFlow conversion writes them).")
    parser.add_argument("--out", help="the directory to write into")
    parser.add_argument("--images", type=int, required=True, help="training images")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--validation", type=int, default=0,
                        help="validation images (validation-*-of-* shards)")
    parser.add_argument("--validation-shards", type=int, default=0,
                        help="default: as --shards, at most one per image")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--min-side", type=int, default=200)
    parser.add_argument("--max-side", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, help="processes (default: the usable cores)")
    parser.add_argument("--split", default="train", help=argparse.SUPPRESS)
    parser.add_argument("--shard", help=argparse.SUPPRESS)  # one shard, for write_shards
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.shard:
        _write_shard(args.shard, range(args.first, args.first + args.images), args.classes,
                     args.seed, args.split, args.min_side, args.max_side)
        return 0
    if not args.out:
        parser.error("--out DIR is required")
    try:
        common = dict(classes=args.classes, seed=args.seed, min_side=args.min_side,
                      max_side=args.max_side, workers=args.workers)
        written = write_shards(args.out, args.images, args.shards, split="train", **common)
        if args.validation:
            shards = args.validation_shards or min(args.shards, args.validation)
            written += write_shards(args.out, args.validation, shards, split="validation",
                                    **common)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(os.path.getsize(p) for p in written)
    print(f"wrote {len(written)} files, {size / 2**20:.1f} MiB, into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
