"""Input-pipeline throughput: pk.data against plain Grain, tf.data and torch's DataLoader.

    .venv/bin/python bench/data_pipeline.py                 # all peers that are installed
    .venv/bin/python bench/data_pipeline.py --records 8192  # quicker

The work, the same in every contestant: read records from files, decode them (zlib-compressed
32x32x3 uint8 images with a label byte), augment with numpy (reflect-pad + random 32x32 crop,
random flip, brightness/contrast jitter, per-image standardization), shuffle, batch 256.
Augmentation is seeded by the record, so every contestant computes the same pixels.

  podkit  pk.data.ArrayRecordDataset(...).shuffle(n).map(f, num_parallel_calls=AUTOTUNE)
          .batch(256).prefetch(AUTOTUNE)
  grain   plain Grain: MapDataset.source(ArrayRecordDataSource).shuffle().map(f).batch(256)
          .to_iter_dataset().mp_prefetch(2 workers)
  tf      tf.data: TFRecordDataset of the same records, shuffle, map(tf.numpy_function(f),
          num_parallel_calls=AUTOTUNE), batch(256), prefetch(AUTOTUNE)
  torch   torch.utils.data.DataLoader(batch_size=256, shuffle=True, num_workers=2,
          persistent_workers=True) over a map-style Dataset reading the ArrayRecord files

Each contestant runs in its own process, one after another, for `--epochs` passes. Reported:
the time to the first batch; the steady rate (elements/s over the epochs after the first, when
every contestant's workers are up); the total time of all epochs from iter(). Best of
`--repeats`, contestants interleaved.

The ideal for this machine is measured in the same run, in processes pinned to one core: the
whole pipeline computed in one process (num_parallel_calls=None) times the usable cores — what
perfect parallelism of the same work gives — and, as an upper bound, the map function alone
over records already in memory times the cores.

The second part trains the seed MLP on the digits from a pk.data pipeline and prints the share
of step time fit() waited for input (`input_wait`), next to the same fit from arrays.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

START = time.perf_counter()  # this process's start, for the cold-start column
BATCH = 256
SIDE = 32


# -- the work ---------------------------------------------------------------------------------
def make_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten classes of oriented colour gratings with noise: images with real structure."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    images = np.empty((n, SIDE, SIDE, 3), np.uint8)
    for c in range(10):
        idx = np.flatnonzero(labels == c)
        angle = np.pi * c / 10
        freq = 2 + (c % 3)
        wave = np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle)))
        tint = np.array([1 + np.cos(c), 1 + np.sin(c), 1 + np.cos(2 * c)]) / 2
        base = 127 + 80 * wave[..., None] * tint
        noise = rng.normal(0, 20, (len(idx), SIDE, SIDE, 3))
        images[idx] = np.clip(base + noise, 0, 255).astype(np.uint8)
    return images, labels.astype(np.uint8)


def encode(image: np.ndarray, label: int) -> bytes:
    return bytes([label]) + zlib.compress(image.tobytes(), 6)


def decode_augment(record: bytes) -> tuple[np.ndarray, np.int32]:
    label = record[0]
    img = np.frombuffer(zlib.decompress(record[1:]), np.uint8).reshape(SIDE, SIDE, 3)
    rng = np.random.default_rng(zlib.crc32(record))
    padded = np.pad(img, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    i, j = rng.integers(0, 9, 2)
    img = padded[i:i + SIDE, j:j + SIDE]
    if rng.random() < 0.5:
        img = img[:, ::-1]
    x = img.astype(np.float32) / 255.0
    x = x * rng.uniform(0.8, 1.2) + rng.uniform(-0.1, 0.1)
    x = (x - x.mean(axis=(0, 1))) / (x.std(axis=(0, 1)) + 1e-5)
    return x.astype(np.float32), np.int32(label)


def write_files(directory: str, n: int, shards: int) -> list[str]:
    import podkit as pk

    images, labels = make_images(n)
    records = [encode(images[i], int(labels[i])) for i in range(n)]
    files = pk.data.write_array_record(pk.data.Dataset.from_sequence(records),
                                       os.path.join(directory, "images"), shards)
    with open(os.path.join(directory, "count"), "w") as f:
        f.write(str(n))
    with open(os.path.join(directory, "records.bin"), "wb") as f:  # for the TFRecord copy
        for r in records:
            f.write(len(r).to_bytes(4, "little") + r)
    return files


# -- contestants (each in its own process) ------------------------------------------------------
def run_podkit(files: list[str], epochs: int):
    import podkit as pk
    import podkit.data.reader  # podkit loads Grain lazily; the peers are imported too

    n = len(pk.data.ArrayRecordDataset(files))
    ds = (pk.data.ArrayRecordDataset(files).shuffle(n, seed=0)
          .map(decode_augment, num_parallel_calls=pk.data.AUTOTUNE)
          .batch(BATCH).prefetch(pk.data.AUTOTUNE))
    return lambda: iter(ds.repeat(epochs))


def run_grain(files: list[str], epochs: int):
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    source = grain.sources.ArrayRecordDataSource(files)
    ds = (grain.MapDataset.source(source).shuffle(seed=0).map(decode_augment)
          .batch(BATCH).repeat(epochs)
          .to_iter_dataset(grain.ReadOptions(num_threads=0))
          .mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=2)))
    return lambda: iter(ds)


def run_tf(directory: str, epochs: int):
    import tensorflow as tf

    path = os.path.join(directory, "images.tfrecord")
    if not os.path.exists(path):
        with open(os.path.join(directory, "records.bin"), "rb") as f, \
                tf.io.TFRecordWriter(path) as w:
            while header := f.read(4):
                w.write(f.read(int.from_bytes(header, "little")))
    n = sum(1 for _ in tf.data.TFRecordDataset(path))

    def f(record):
        x, y = tf.numpy_function(decode_augment, [record], (tf.float32, tf.int32))
        x.set_shape((SIDE, SIDE, 3))
        y.set_shape(())
        return x, y

    ds = (tf.data.TFRecordDataset(path).shuffle(n, seed=0)
          .map(f, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
          .prefetch(tf.data.AUTOTUNE).repeat(epochs))
    return lambda: iter(ds.as_numpy_iterator())


class TorchRecords:
    """torch map-style Dataset over the ArrayRecord files."""

    def __init__(self, files: list[str], n: int) -> None:
        # The reader is opened in each worker only: a reader's threads do not survive fork.
        self.files, self.n, self.source = files, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.source is None:  # opened in each worker
            import grain

            self.source = grain.sources.ArrayRecordDataSource(self.files)
        return decode_augment(self.source[i])


def run_torch(files: list[str], epochs: int):
    import torch

    n = int(open(os.path.join(os.path.dirname(files[0]), "count")).read())
    loader = torch.utils.data.DataLoader(
        TorchRecords(files, n), batch_size=BATCH, shuffle=True, num_workers=2,
        generator=torch.Generator().manual_seed(0), persistent_workers=True)

    def epochs_iter():
        for _ in range(epochs):
            yield from loader
    return epochs_iter


def serial_pipeline(files: list[str]):
    """The podkit pipeline computed in this one process (no workers)."""
    import podkit as pk

    n = len(pk.data.ArrayRecordDataset(files))
    ds = (pk.data.ArrayRecordDataset(files).shuffle(n, seed=0).map(decode_augment)
          .batch(BATCH))
    return lambda: iter(ds)


def serial_map(files: list[str]):
    """The map function alone, over records already in memory."""
    import podkit as pk

    records = list(pk.data.ArrayRecordDataset(files))

    def batches():
        for i in range(0, len(records), BATCH):
            yield None, [decode_augment(r)[1] for r in records[i:i + BATCH]]
    return batches


def contestant(name: str, directory: str, files: list[str], epochs: int) -> dict:
    if name.startswith("serial"):  # one core, one epoch: the per-core rate of the work
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        epochs = 1
    make = {"podkit": lambda: run_podkit(files, epochs), "grain": lambda: run_grain(files, epochs),
            "tf": lambda: run_tf(directory, epochs),
            "torch": lambda: run_torch(files, epochs),
            "serial-pipeline": lambda: serial_pipeline(files),
            "serial-map": lambda: serial_map(files)}[name]()
    n = int(open(os.path.join(directory, "count")).read())
    t0 = time.perf_counter()
    it = iter(make())
    first = next(it)
    t1 = time.perf_counter()
    count, mark = len(first[1]), None
    for batch in it:
        count += len(batch[1])
        if mark is None and count >= n:  # the first epoch is done
            mark = (time.perf_counter(), count)
    t2 = time.perf_counter()
    if hasattr(it, "close"):
        it.close()
    if mark is None or count == mark[1]:  # one epoch only: the rate after the first batch
        steady = (count - len(first[1])) / (t2 - t1)
    else:
        steady = (count - mark[1]) / (t2 - mark[0])
    return {"elements": count, "startup_s": t1 - t0, "elements_per_s": steady,
            "total_s": t2 - t0, "cold_start_s": t1 - START}


# -- the seed example: is fit() input-bound? ------------------------------------------------------
def _seed_model(pk):
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Dense(128, activation="relu"),
                               pk.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=9)
    return model


def fit_input_wait(epochs: int) -> dict:
    """The seed config (digits, batch 32, steps_per_execution 9) fed from arrays and from a
    pk.data pipeline; plus the pipeline alone, to show its headroom over the steps."""
    import podkit as pk

    (x, y), (vx, vy) = pk.datasets.load_digits()
    pipeline = (pk.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x))
                .batch(32).prefetch(pk.data.AUTOTUNE))
    out = {}
    for source in ("arrays", "pk.data"):
        model = _seed_model(pk)
        kwargs = dict(x=x, y=y, batch_size=32) if source == "arrays" else dict(x=pipeline)
        model.fit(epochs=1, verbose=0, **kwargs)  # compiles the step for this input kind
        t = time.perf_counter()
        history = model.fit(epochs=epochs, verbose=0, **kwargs)
        seconds = time.perf_counter() - t
        out[source] = {"samples_per_s": epochs * len(x) / seconds,
                       "input_wait": float(np.mean(history.history["input_wait"])),
                       "val_accuracy": model.evaluate(vx, vy, verbose=0,
                                                   return_dict=True)["accuracy"]}
    it = iter(pipeline.repeat(epochs))
    t = time.perf_counter()
    alone = sum(len(b[1]) for b in it)
    out["pipeline alone"] = {"samples_per_s": alone / (time.perf_counter() - t)}
    return out


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_one(name: str, directory: str, epochs: int) -> dict | None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, __file__, "--contestant", name, "--dir", directory,
         "--epochs", str(epochs)], capture_output=True, text=True, env=env)
    if proc.returncode:
        print(f"{name} failed:\n{proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=16384)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peers", default="podkit,grain,tf,torch")
    parser.add_argument("--fit-epochs", type=int, default=10)
    parser.add_argument("--contestant", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.contestant:
        files = sorted(f for f in os.listdir(args.dir) if f.endswith(".array_record"))
        files = [os.path.join(args.dir, f) for f in files]
        print(json.dumps(contestant(args.contestant, args.dir, files, args.epochs)))
        return

    modules = {"podkit": "podkit", "grain": "grain", "tf": "tensorflow", "torch": "torch"}
    peers = [p for p in args.peers.split(",") if installed(modules[p])]
    missing = [p for p in args.peers.split(",") if p not in peers]
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="podkit-bench-") as directory:
        t = time.perf_counter()
        write_files(directory, args.records, args.shards)
        print(f"{args.records} records in {args.shards} ArrayRecord files "
              f"({time.perf_counter() - t:.1f} s to write); {args.epochs} epochs per run, "
              f"best of {args.repeats}; {cores} usable cores")
        results: dict[str, dict] = {}
        for _ in range(args.repeats):
            for name in [*peers, "serial-pipeline", "serial-map"]:
                r = run_one(name, directory, args.epochs)
                if r is not None and (name not in results
                                      or r["elements_per_s"] > results[name]["elements_per_s"]):
                    results[name] = r
    serial = {k: results.pop(k) for k in ("serial-pipeline", "serial-map") if k in results}
    print(f"\n{'contestant':<10} {'steady el/s':>12} {'first batch s':>14} {'(cold)':>7} "
          f"{'total s':>8} {'podkit / it':>12} {'(total)':>8}")
    ours = results.get("podkit", {})
    rate = ours.get("elements_per_s", float("nan"))
    for name, r in results.items():
        print(f"{name:<10} {r['elements_per_s']:>12,.0f} {r['startup_s']:>14.2f} "
              f"{r['cold_start_s']:>7.2f} {r['total_s']:>8.1f} "
              f"{rate / r['elements_per_s']:>11.2f}x"
              f" {r['total_s'] / ours.get('total_s', float('nan')):>7.2f}x")
    print("first batch: from iter(), libraries imported; (cold): from the process's start, "
          "imports included")
    others = {k: v for k, v in results.items() if k != "podkit"}
    if others:
        best = max(others, key=lambda k: others[k]["elements_per_s"])
        print(f"\npodkit / best peer ({best}), steady: "
              f"{rate / others[best]['elements_per_s']:.2f}x (target >= 1.0x)")
    if "torch" in results:
        print(f"podkit / torch DataLoader (2 workers), steady: "
              f"{rate / results['torch']['elements_per_s']:.2f}x (target >= 1.0x)")
    if "serial-pipeline" in serial:
        one = serial["serial-pipeline"]["elements_per_s"]
        print(f"ideal: the same pipeline in one process on one core, {one:,.0f} el/s x {cores} "
              f"cores = {one * cores:,.0f} el/s; podkit / ideal: {rate / (one * cores):.2f}x "
              "(target >= 0.9x)")
    if "serial-map" in serial:
        one = serial["serial-map"]["elements_per_s"]
        print(f"bound: the map function alone on one core, {one:,.0f} el/s x {cores} cores = "
              f"{one * cores:,.0f} el/s; podkit / bound: {rate / (one * cores):.2f}x")
    if "grain" in results:
        overhead = 1 - rate / results["grain"]["elements_per_s"]
        print(f"podkit overhead over plain Grain: {100 * overhead:+.1f}% (target <= 10%)")
    if "podkit" in results:
        print(f"podkit first batch after {ours['startup_s']:.2f} s")
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (make bench-setup)")

    print(f"\nSeed MLP on the digits (batch 32, steps_per_execution 9, 1 CPU device), "
          f"{args.fit_epochs} epochs:")
    import podkit as pk

    pk.connect(cpu_devices=1)
    for source, r in fit_input_wait(args.fit_epochs).items():
        line = f"  {source:<15} {r['samples_per_s']:>10,.0f} samples/s"
        if "input_wait" in r:
            line += (f"  input_wait {100 * r['input_wait']:4.1f}% of step time  "
                     f"val_accuracy {r['val_accuracy']:.4f}")
        print(line)


if __name__ == "__main__":
    main()
