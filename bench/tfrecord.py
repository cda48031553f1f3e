"""ImageNet-style TFRecord input on CPU: podkit's pipeline against tf.data, the same shards.

    .venv/bin/python bench/tfrecord.py                    # ~2-4 minutes on 2 cores
    .venv/bin/python bench/tfrecord.py --images 4096 --rounds 5 --workers 8

The shards: `--images` synthetic ImageNet-style JPEGs (200-500 px sides, 58 KB on average)
in `--shards` TFRecord files of tf.train.Examples, written by
`podkit.datasets.imagenet_tfrecord` (the generator `configs/resnet50_tfrecord.toml` uses).

The task, per image, in both: read the record, parse the Example (`image/encoded`,
`image/class/label`), decode the JPEG, Inception's random-resized crop (area 8-100%, aspect
3/4-4/3, 10 attempts, else the center crop), bilinear resize to 224x224, random horizontal
flip, ImageNet mean/std normalisation, bfloat16; shuffled over all records, repeated,
batches of 128 (drop_remainder). The same task, not the same work: podkit decodes the whole
JPEG (at 1/2, 1/4 or 1/8 scale, libjpeg-turbo's DCT scaling, when the crop is at least twice
224 px both ways) and resizes with Pillow's bilinear filter, which antialiases (it reads
every pixel of the crop); tf.data decodes only the crop window, at full scale, and resizes
from 4 pixels per output pixel. The script counts the decoded pixels of both over the shards
(`decode_work`) and prints them beside the ratio.

  podkit  `imagenet_tfrecord.pipeline(...)`, the config's pipeline: pk.data.TFRecordDataset
          (random access through its record index) .shuffle(all).repeat().enumerate()
          .map(Preprocess, num_parallel_calls=W worker processes, deterministic=False)
          .batch(128).prefetch(AUTOTUNE); pk.io.parse_single_example, pk.io.decode_jpeg
          (libjpeg-turbo; 1/2-1/8 DCT scaling when the crop is twice the output or more),
          Pillow's bilinear resize
  tf      tf.data with every trick of TensorFlow's TPU ResNet input (tensorflow/tpu
          `imagenet_input.py`, `resnet_preprocessing.py`): TFRecordDataset(num_parallel_reads=
          AUTOTUNE) .shuffle(all).repeat().map(f, num_parallel_calls=W threads,
          deterministic=False).batch(128, drop_remainder=True).prefetch(AUTOTUNE), where f is
          tf.io.parse_single_example, tf.image.sample_distorted_bounding_box +
          tf.image.decode_and_crop_jpeg (only the crop window is decoded), tf.image.resize
          bilinear, random_flip_left_right, normalise, cast to bfloat16
  threads the same podkit pipeline with `parallel="threads"`: the map on W threads of the
          consuming process (an interleave of W shards of the records), no worker processes
  serial  podkit's map alone in one process pinned to one core (no workers): the per-core rate,
          so `serial x W` is what perfect parallelism of podkit's work would give

W = `--workers` (default: the usable cores) for both. Each contestant runs in a fresh process,
the contestants interleaved round by round (a noisy neighbour hits them alike); each reports
images/s over `--batches` batches after `--warmup` batches (workers up, caches warm); the
median round is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BATCH = 128
SIZE = 224


def podkit_batches(files: list[str], workers: int, serial: bool):
    from podkit.datasets import imagenet_tfrecord as inet

    prep = inet.Preprocess(size=SIZE, training=True, seed=0, classes=1000, label_offset=1,
                           dtype="bfloat16")
    if serial is None:  # the same map on threads of this process
        return iter(inet.pipeline(files, BATCH, prep, shuffle_seed=0, num_parallel_calls=workers,
                                  deterministic=False, parallel="threads"))
    if serial:  # one process, no workers: the map's per-core rate
        from podkit import data

        ds = (data.TFRecordDataset(files).repeat().enumerate().map(prep)
              .batch(BATCH, drop_remainder=True))
    else:
        ds = inet.pipeline(files, BATCH, prep, shuffle_seed=0, num_parallel_calls=workers,
                           deterministic=False)
    return iter(ds)


def tf_batches(files: list[str], workers: int):
    import tensorflow as tf

    mean = tf.constant([0.485 * 255, 0.456 * 255, 0.406 * 255], tf.float32)
    std = tf.constant([0.229 * 255, 0.224 * 255, 0.225 * 255], tf.float32)
    spec = {"image/encoded": tf.io.FixedLenFeature((), tf.string, ""),
            "image/class/label": tf.io.FixedLenFeature((), tf.int64, -1)}

    def center_crop(image_bytes, shape):
        # the reference's _decode_and_center_crop: 224/256 of the shorter side
        h, w = shape[0], shape[1]
        side = tf.cast(SIZE / (SIZE + 32) * tf.cast(tf.minimum(h, w), tf.float32), tf.int32)
        window = tf.stack([(h - side + 1) // 2, (w - side + 1) // 2, side, side])
        return tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)

    def preprocess(record):
        parsed = tf.io.parse_single_example(record, spec)
        image_bytes = parsed["image/encoded"]
        label = tf.cast(parsed["image/class/label"], tf.int32) - 1
        shape = tf.io.extract_jpeg_shape(image_bytes)
        bbox = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, bounding_boxes=bbox, min_object_covered=0.1,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        oy, ox, _ = tf.unstack(begin)
        th, tw, _ = tf.unstack(size)
        # the reference's test for "no box found" (the whole image came back): center crop
        whole = tf.logical_and(tf.equal(th, shape[0]), tf.equal(tw, shape[1]))
        image = tf.cond(
            whole, lambda: center_crop(image_bytes, shape),
            lambda: tf.image.decode_and_crop_jpeg(image_bytes, tf.stack([oy, ox, th, tw]),
                                                  channels=3))
        image = tf.image.resize([image], [SIZE, SIZE], method="bilinear")[0]
        image = tf.image.random_flip_left_right(image)
        image = (image - mean) / std
        return tf.cast(image, tf.bfloat16), label

    n = sum(1 for _ in tf.data.TFRecordDataset(files))
    ds = (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
          .shuffle(n, seed=0).repeat()
          .map(preprocess, num_parallel_calls=workers, deterministic=False)
          .batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    return iter(ds.as_numpy_iterator())


def contestant(name: str, files: list[str], workers: int, warmup: int, batches: int) -> dict:
    if name == "serial":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        warmup, batches = 1, max(2, batches // workers)  # a slower rate: fewer batches
    t0 = time.perf_counter()
    it = tf_batches(files, workers) if name == "tf" else \
        podkit_batches(files, workers, serial=None if name == "threads" else name == "serial")
    first = next(it)
    t1 = time.perf_counter()
    shape, dtype = tuple(first[0].shape), str(first[0].dtype)
    for _ in range(warmup - 1):
        next(it)
    t2 = time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = time.perf_counter() - t2
    if hasattr(it, "close"):
        it.close()
    return {"images_per_s": batches * BATCH / seconds, "first_batch_s": t1 - t0,
            "shape": shape, "dtype": dtype}


def decode_work(files: list[str]) -> dict:
    """The pixels each side decodes per image, over one pass of the shards with podkit's crop
    draws (tf.data draws its own, from the same distribution): podkit the whole image, at
    1/factor of each side when `dct_factor` allows; tf.data the crop window. JPEG headers
    only, nothing decoded."""
    import numpy as np

    from podkit import data, io
    from podkit.datasets import imagenet_preprocessing as prep

    spec = {"image/encoded": io.FixedLenFeature((), "string")}
    whole = window = scaled = n = 0
    for index, record in enumerate(data.TFRecordDataset(files)):
        jpeg = io.parse_single_example(record, spec)["image/encoded"]
        jpeg = jpeg.item() if isinstance(jpeg, np.ndarray) else jpeg
        height, width = prep.jpeg_size(jpeg)
        box = prep.random_crop_box(prep.element_rng(0, index), height, width, SIZE)
        factor = prep.dct_factor(box, SIZE)
        whole += -(-height // factor) * -(-width // factor)  # a scaled decode rounds up
        window += box[2] * box[3]
        scaled += factor > 1
        n += 1
    return {"images": n, "scaled": scaled, "podkit_pixels": whole / n,
            "tf_pixels": window / n}


def run_one(name: str, directory: str, args: argparse.Namespace) -> dict | None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, __file__, "--contestant", name, "--dir", directory,
         "--workers", str(args.workers), "--warmup", str(args.warmup),
         "--batches", str(args.batches)], capture_output=True, text=True, env=env)
    if proc.returncode:
        print(f"{name} failed:\n{proc.stderr[-3000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--warmup", type=int, default=3, help="batches before the clock")
    parser.add_argument("--batches", type=int, default=16, help="timed batches per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="podkit,threads,tf,serial")
    parser.add_argument("--contestant", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.contestant:
        files = sorted(os.path.join(args.dir, f) for f in os.listdir(args.dir)
                       if f.startswith("train-"))
        print(json.dumps(contestant(args.contestant, files, args.workers, args.warmup,
                                    args.batches)))
        return

    peers = [p for p in args.peers.split(",") if p != "tf" or installed("tensorflow")]
    from podkit.datasets import imagenet_tfrecord as inet

    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    with tempfile.TemporaryDirectory(prefix="podkit-tfrecord-") as directory:
        t = time.perf_counter()
        files = inet.write_shards(directory, args.images, args.shards, seed=0)
        mib = sum(os.path.getsize(f) for f in files) / 2**20
        work = decode_work(files)
        print(f"$ {command}\n{args.images} images in {args.shards} TFRecord shards ({mib:.1f} "
              f"MiB, {1024 * mib / args.images:.0f} KiB per record; "
              f"{time.perf_counter() - t:.1f} s to write); {args.workers} workers/threads; "
              f"batch {BATCH}; {args.batches} timed batches after {args.warmup}; median of "
              f"{args.rounds} rounds; {len(os.sched_getaffinity(0))} usable cores")
        rounds: dict[str, list[dict]] = {p: [] for p in peers}
        for r in range(args.rounds):
            for name in peers:
                result = run_one(name, directory, args)
                if result is not None:
                    rounds[name].append(result)
                    print(f"  round {r + 1} {name:<7} {result['images_per_s']:8,.0f} images/s"
                          f"  (first batch {result['first_batch_s']:.1f} s, "
                          f"{result['shape']} {result['dtype']})", flush=True)
    median = {name: statistics.median(x["images_per_s"] for x in rs)
              for name, rs in rounds.items() if rs}
    print(f"\n{'contestant':<10} {'images/s (median)':>18} {'podkit / it':>12}")
    ours = median.get("podkit", float("nan"))
    for name, rate in median.items():
        print(f"{name:<10} {rate:>18,.0f} {ours / rate:>11.2f}x")
    if "tf" in median:
        print(f"\npodkit / tf.data: {ours / median['tf']:.2f}x (target >= 1.0x)")
        if "threads" in median:
            print(f"podkit parallel='threads' / tf.data: {median['threads'] / median['tf']:.2f}x")
        print(f"  the same task, not the same work: podkit decodes the whole JPEG, "
              f"{work['podkit_pixels']:,.0f} pixels an image on average (at 1/2-1/8 scale for "
              f"{work['scaled']} of {work['images']}: crops at least twice {SIZE} px both "
              f"ways), and resizes with an antialiasing filter that reads all of the crop; "
              f"tf.data decodes the crop window, {work['tf_pixels']:,.0f} pixels "
              f"(podkit decodes {work['podkit_pixels'] / work['tf_pixels']:.2f}x as many), "
              f"and resizes from 4 pixels per output pixel")
    if "serial" in median:
        ideal = median["serial"] * args.workers
        print(f"ideal: podkit's map on one core x {args.workers} = {ideal:,.0f} images/s; "
              f"podkit / ideal: {ours / ideal:.2f}x")


if __name__ == "__main__":
    main()
