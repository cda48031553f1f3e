"""ResNet-50 on one TPU chip fed from ImageNet-style TFRecord files, one run, three contestants.

    python bench/tpu_images.py                 # on the TPU host (docs/tpu.md), ~6 minutes
    python bench/tpu_images.py --smoke         # any CPU: 64x64 images, a ResNet-18 of width
                                               # 8, a few steps (checks that it runs)

Model: podkit's ResNet-50 (`configs/resnet50_tfrecord.toml`'s: bottlenecks, width 64, 1000
classes), mixed bfloat16 (float32 master weights), SGD 0.1 with momentum 0.9, batch
`--batch` (128), `steps_per_execution` 4, sparse categorical cross-entropy from logits.

  files   `model.fit()` on the config's pipeline over `--images` synthetic ImageNet-style
          JPEGs in TFRecord shards written first (podkit.datasets.imagenet_tfrecord):
          parse, decode, random-resized crop, flip, normalise in pk.data's worker processes
          (one per core but one), uint8 batches (`--image-dtype uint8`, the default: the
          model subtracts ImageNet's mean and divides by its std on the chip, as
          `data.image_dtype = "uint8"`; `bfloat16`: normalised on the host)
  arrays  the same `fit()` from synthetic arrays in host memory (uint8 or bfloat16, 224x224x3,
          staged on the chip once: no input work at all)
  hand    a hand-written loop on the same podkit ResNet module: `jax.jit` of 4 steps in one
          `lax.scan` (podkit's steps_per_execution), params, optimizer state and BatchNorm
          statistics donated, the same batches already on the chip, optax's SGD

Reported: images/s of each (the epochs after the first: compile and start-up excluded),
files / arrays (target >= 0.95x), arrays / hand (target >= 1.0x), and the device idle share
podkit's own telemetry measured during the files run (`device_idle` in metrics.jsonl: the
share of wall time the chip had nothing to run; target <= 5%) and the loop's `input_wait`.
It needs no network and no TensorFlow: jax, flax, optax, grain and podkit's own wheels.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time


class EpochClock:
    """A Keras callback noting when each epoch ended (the rate is taken over the later ones:
    the first holds the compile and the input workers' start)."""

    def __init__(self) -> None:
        import podkit as pk

        class Clock(pk.callbacks.Callback):
            def __init__(inner) -> None:
                super().__init__()
                inner.ends = []

            def on_epoch_end(inner, epoch, logs=None) -> None:
                inner.ends.append(time.perf_counter())

        self.callback = Clock()

    def rate(self, samples_per_epoch: int) -> float:
        ends = self.callback.ends
        return samples_per_epoch * (len(ends) - 1) / (ends[-1] - ends[0])


def model_for(args):
    import podkit as pk
    from podkit.config import ResNetConfig
    from podkit.models.resnet import build_resnet

    with pk.DataParallel().scope():
        model = build_resnet(ResNetConfig(depth=args.depth, width=args.width,
                                          precision="mixed_bfloat16"),
                             {"classes": args.classes, "image_shape": (args.size, args.size, 3),
                              **pixel_stats(args)})
        model.compile(optimizer=pk.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=args.k)
    return model


def pixel_stats(args) -> dict:
    """With uint8 images the model normalises them on the chip (data.image_dtype = "uint8")."""
    if args.image_dtype != "uint8":
        return {}
    from podkit.datasets.imagenet_preprocessing import MEAN_RGB, STDDEV_RGB

    return {"pixel_mean": MEAN_RGB.tolist(), "pixel_std": STDDEV_RGB.tolist()}


def images(rng, shape, dtype: str):
    """Synthetic images as the pipeline gives them: uint8 pixels or normalised bfloat16."""
    import ml_dtypes
    import numpy as np

    if dtype == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape, np.float32).astype(ml_dtypes.bfloat16)


def telemetry(run_dir: str) -> dict:
    """The median device_idle and input_wait of the run's log points after its first epoch."""
    lines = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]

    def pick(name: str) -> float | None:
        values = [v for rec in lines for k, v in rec.items()
                  if k.split("/")[-1] == name and isinstance(v, (int, float))]
        later = values[len(values) // 3:] or values  # past the first epoch's start-up
        return statistics.median(later) if later else None

    return {"device_idle": pick("device_idle"), "input_wait": pick("input_wait")}


def bench_fit(args, source: str, files: list[str] | None = None) -> dict:
    import numpy as np

    model = model_for(args)
    clock = EpochClock()
    steps = args.steps
    run_dir = tempfile.mkdtemp(prefix=f"podkit-tpu-images-{source}-")
    kwargs = dict(epochs=args.epochs + 1, steps_per_epoch=steps, verbose=0,
                  callbacks=[clock.callback], run_dir=run_dir)
    if source == "files":
        from podkit.datasets import imagenet_tfrecord as inet

        prep = inet.Preprocess(size=args.size, training=True, seed=0, classes=args.classes,
                               label_offset=1, dtype=args.image_dtype)
        ds = inet.pipeline(files, args.batch, prep, shuffle_seed=0)
        model.fit(ds, **kwargs)
    else:
        rng = np.random.default_rng(0)
        n = args.batch * args.k * 2
        x = images(rng, (n, args.size, args.size, 3), args.image_dtype)
        y = rng.integers(0, args.classes, n).astype(np.int32)
        model.fit(x, y, batch_size=args.batch, **kwargs)
    out = {"images_per_s": clock.rate(steps * args.batch), **telemetry(run_dir)}
    return out


def bench_hand(args) -> dict:
    import flax.nnx as nnx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from podkit.config import ResNetConfig
    from podkit.models.resnet import ResNet

    config = ResNetConfig(depth=args.depth, width=args.width, precision="mixed_bfloat16")
    with nnx.use_eager_sharding(False):  # one chip: no mesh to lay the parameters on
        module = ResNet(config, args.classes, (args.size, args.size, 3), nnx.Rngs(0),
                        **pixel_stats(args))
    module.train()  # BatchNorm on the batch's statistics, updating the running ones
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
    tx = optax.sgd(0.1, momentum=0.9)
    opt_state = jax.jit(tx.init)(params)

    def loss_fn(p, r, xb, yb):
        net = nnx.merge(graphdef, p, r)
        logits = net(xb)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
        return loss, nnx.to_pure_dict(nnx.state(net, nnx.Not(nnx.Param)))

    def one_step(carry, batch):
        p, o, r = carry
        (loss, r), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, r, *batch)
        updates, o = tx.update(grads, o, p)
        return (optax.apply_updates(p, updates), o, r), loss

    def k_steps(p, o, r, xs, ys):  # podkit's steps_per_execution: k steps in one call
        (p, o, r), losses = jax.lax.scan(one_step, (p, o, r), (xs, ys))
        return p, o, r, losses.mean()

    step = jax.jit(k_steps, donate_argnums=(0, 1, 2))
    rng = np.random.default_rng(0)
    calls = 2  # distinct batches on the chip, cycled
    shape = (args.k, args.batch, args.size, args.size, 3)
    data = [(jnp.asarray(images(rng, shape, args.image_dtype)),
             jnp.asarray(rng.integers(0, args.classes, shape[:2]).astype(np.int32)))
            for _ in range(calls)]
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, rest, *data[0]).compile()
    compile_s = time.perf_counter() - start
    per_epoch = args.steps // args.k
    for i in range(per_epoch):  # warm-up: one epoch's calls
        params, opt_state, rest, loss = compiled(params, opt_state, rest, *data[i % calls])
    loss.block_until_ready()
    start = time.perf_counter()
    for i in range(per_epoch * args.epochs):
        params, opt_state, rest, loss = compiled(params, opt_state, rest, *data[i % calls])
    loss.block_until_ready()
    seconds = time.perf_counter() - start
    return {"images_per_s": per_epoch * args.epochs * args.k * args.batch / seconds,
            "compile_s": compile_s, "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", default=["files", "arrays", "hand"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-dtype", default="uint8", choices=["uint8", "bfloat16"],
                        help="what the pipeline hands the chip: uint8 pixels normalised by "
                             "the model on the chip (default), or normalised bfloat16")
    parser.add_argument("--steps", type=int, default=40, help="steps per timed epoch")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs (after one)")
    parser.add_argument("--images", type=int, default=4096, help="JPEGs written for 'files'")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny: 64x64 images, ResNet-18 of width 8, batch 8, 8 steps")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    args.k, args.depth, args.width, args.size, args.classes = 4, 50, 64, 224, 1000
    sides = (200, 500)
    if args.smoke:
        args.batch, args.steps, args.epochs, args.images = 8, 8, 2, 64
        args.depth, args.width, args.size, args.classes, sides = 18, 8, 64, 10, (72, 128)

    import jax

    device = jax.devices()[0]
    command = " ".join([os.path.relpath(sys.executable), *sys.argv])
    print(f"$ {command}\ndevice: {device.device_kind} ({device.platform}); ResNet-{args.depth} "
          f"width {args.width}, {args.size}x{args.size}, batch {args.batch}, "
          f"{args.k} steps per call, {args.steps} steps x {args.epochs} timed epochs",
          flush=True)
    results: dict = {"device": device.device_kind, "command": command}
    with tempfile.TemporaryDirectory(prefix="podkit-tpu-images-") as directory:
        files = None
        if "files" in args.only:
            from podkit.datasets import imagenet_tfrecord as inet

            t = time.perf_counter()
            files = inet.write_shards(directory, args.images, shards=16, seed=0,
                                      classes=args.classes, min_side=sides[0],
                                      max_side=sides[1])
            print(f"{args.images} JPEGs in 16 TFRecord shards, "
                  f"{sum(os.path.getsize(f) for f in files) / 2**20:.0f} MiB, written in "
                  f"{time.perf_counter() - t:.1f} s; {len(os.sched_getaffinity(0))} cores",
                  flush=True)
        for who in args.only:
            gc.collect()
            jax.clear_caches()  # the previous contestant's executables leave the chip
            try:
                r = bench_hand(args) if who == "hand" else bench_fit(args, who, files)
            except Exception as e:  # a contestant that fails (e.g. out of memory) is reported
                r = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            results[who] = r
            print(who, json.dumps(r), flush=True)
    rate = {k: v["images_per_s"] for k, v in results.items()
            if isinstance(v, dict) and "images_per_s" in v}
    print()
    for who in rate:
        print(f"{who:<8} {rate[who]:>10,.0f} images/s")
    if "files" in rate and "arrays" in rate:
        f = results["files"]
        idle = f.get("device_idle")
        wait = f.get("input_wait")
        print(f"files / arrays: {rate['files'] / rate['arrays']:.3f}x (target >= 0.95x); "
              f"device idle while reading files: "
              f"{'n/a' if idle is None else f'{100 * idle:.1f}%'} (target <= 5%), input_wait "
              f"{'n/a' if wait is None else f'{100 * wait:.1f}%'}")
    if "arrays" in rate and "hand" in rate:
        print(f"podkit fit() / hand loop: {rate['arrays'] / rate['hand']:.3f}x (target >= 1.0x)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)


if __name__ == "__main__":
    main()
