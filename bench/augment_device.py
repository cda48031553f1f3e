"""What podkit's Keras image layers cost on the device, inside a jitted program (issue 51):
each layer's training-mode augmentation of one batch (its draw and its transform, as the
train step runs them), timed on the default device, and the program checked for host
callbacks (there must be none: the host's cores stay free for the input pipeline).

    python bench/augment_device.py [--batch 256] [--size 224] [--repeats 20]

Prints one line per layer: milliseconds per batch, images per second, and the number of
gathers in the program (the affine layers read each pixel's four neighbours). With `--fit`,
also a small convolutional model's fit() with the augmentation in the model and without it
(a center crop in its place): the step time each, from the same uint8 images on the device.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import podkit as pk

P = pk.layers


def layers(size: int) -> dict[str, pk.layers.Layer]:
    return {
        "RandomFlip": P.RandomFlip(),
        "RandomCrop": P.RandomCrop(size - 32, size - 32),
        "RandomRotation": P.RandomRotation(0.1),
        "RandomZoom": P.RandomZoom(0.2),
        "RandomTranslation": P.RandomTranslation(0.1, 0.1),
        "RandomContrast": P.RandomContrast(0.3),
        "RandomBrightness": P.RandomBrightness(0.2),
        "Resizing": P.Resizing(size // 2, size // 2),
        "CenterCrop": P.CenterCrop(size - 32, size - 32),
    }


def program(layer: pk.layers.Layer, shape: tuple[int, ...]) -> jax.stages.Wrapped:
    if hasattr(layer, "draw"):
        def run(key: jax.Array, images: jax.Array) -> jax.Array:
            return layer.transform(images, layer.draw(key, images.shape))
    else:
        module = layer.build(shape[1:], None)

        def run(key: jax.Array, images: jax.Array) -> jax.Array:
            return module(images)
    return jax.jit(run)


def fit_steps(batch: int, size: int, steps: int) -> None:
    """Seconds per train step of a small conv net, with and without the augmentation."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(batch * steps, size, size, 3), dtype=np.uint8)
    y = rng.integers(0, 10, size=batch * steps)
    crop = size - 32
    augment = [P.RandomFlip("horizontal"), P.RandomCrop(crop, crop), P.RandomRotation(0.05),
               P.RandomContrast(0.2)]
    for name, middle in (("augmented", augment), ("center crop", [P.CenterCrop(crop, crop)])):
        model = pk.Sequential([pk.Input((size, size, 3), dtype="uint8"), *middle,
                               P.Rescaling(1 / 255.0), P.Conv2D(32, 3, strides=2),
                               P.Conv2D(64, 3, strides=2), P.GlobalAveragePooling2D(),
                               P.Dense(10)])
        model.compile(optimizer="adam", steps_per_execution=steps,
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # compile
        start = time.perf_counter()
        history = model.fit(x, y, batch_size=batch, epochs=3, verbose=0)
        seconds = (time.perf_counter() - start) / (3 * steps)
        print(f"fit {name:12s} {seconds * 1e3:8.3f} ms/step, loss {history.history['loss']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--fit", type=int, default=0, metavar="STEPS",
                        help="also time fit() over this many steps per epoch")
    args = parser.parse_args()
    shape = (args.batch, args.size, args.size, 3)
    images = jax.device_put(np.random.default_rng(0).uniform(
        0, 255, size=shape).astype(np.float32))
    print(f"device: {jax.devices()[0].device_kind}, batch {shape}")
    for name, layer in layers(args.size).items():
        fn = program(layer, shape)
        key = jax.random.key(0)
        text = fn.lower(key, images).as_text()
        assert "callback" not in text, f"{name}: a host callback in the program"
        out = fn(key, images)
        out.block_until_ready()
        start = time.perf_counter()
        for i in range(args.repeats):
            out = fn(jax.random.key(i), images)
        out.block_until_ready()
        ms = (time.perf_counter() - start) / args.repeats * 1e3
        gathers = text.count("gather")
        print(f"{name:18s} {ms:8.3f} ms/batch {args.batch / ms * 1e3:12.0f} images/s "
              f"out {tuple(out.shape)} gathers {gathers}")
    if args.fit:
        fit_steps(args.batch, args.size, args.fit)


if __name__ == "__main__":
    main()
