"""CIFAR-shaped synthetic images with a learnable class signal (for throughput, not accuracy).

Each class has a template: a smooth random colour field (a sum of a few low-frequency 2-D
sinusoids per channel, so neighbouring pixels are correlated as in photographs). An image is
its class's template, shifted by up to a quarter of the image in each direction (a ResNet's
convolutions are translation-equivariant, an MLP on raw pixels is not), scaled in contrast,
plus pixel noise, clipped to [0, 1]. The classes are separable but not at a glance: a
classifier has to learn the templates. Nothing is downloaded; the same seed gives the same
images on every machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

WAVES = 4  # sinusoids per channel in a template
NOISE = 0.15  # pixel noise (std) on a [0, 1] scale


def _templates(classes: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """(classes, size, size, 3) smooth colour fields in [0, 1]."""
    grid = np.arange(size, dtype=np.float32) / size
    yy, xx = np.meshgrid(grid, grid, indexing="ij")
    out = np.zeros((classes, size, size, 3), np.float32)
    for c in range(classes):
        for ch in range(3):
            freq = rng.uniform(0.5, 3.0, (WAVES, 2))
            phase = rng.uniform(0, 2 * np.pi, WAVES)
            amp = rng.uniform(0.5, 1.0, WAVES)
            for k in range(WAVES):
                out[c, :, :, ch] += amp[k] * np.sin(
                    2 * np.pi * (freq[k, 0] * yy + freq[k, 1] * xx) + phase[k])
    lo = out.min(axis=(1, 2, 3), keepdims=True)
    hi = out.max(axis=(1, 2, 3), keepdims=True)
    return (out - lo) / (hi - lo)


def synthetic_images(samples: int, size: int, classes: int,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(x (samples, size, size, 3) float32 in [0, 1], y (samples,) int32 in 0..classes-1)."""
    rng = np.random.default_rng(seed)
    templates = _templates(classes, size, rng)
    y = rng.integers(0, classes, samples).astype(np.int32)
    x = np.empty((samples, size, size, 3), np.float32)
    shift = max(1, size // 4)
    # In chunks: one roll per (dy, dx) pair present, so generation stays vectorized.
    dy = rng.integers(-shift, shift + 1, samples)
    dx = rng.integers(-shift, shift + 1, samples)
    contrast = rng.uniform(0.6, 1.0, samples).astype(np.float32)
    for i in range(samples):
        x[i] = np.roll(templates[y[i]], (dy[i], dx[i]), axis=(0, 1))
    x = 0.5 + (x - 0.5) * contrast[:, None, None, None]
    x += rng.normal(0.0, NOISE, x.shape).astype(np.float32)
    np.clip(x, 0.0, 1.0, out=x)
    return x, y


def load_images(config: Any, seed: int = 0) -> Any:
    """`[data] name = "images"`: synthetic (x, y) split into train and validation."""
    from podkit.datasets.registry import Data, check_ints, split_tail

    check_ints(config, {"samples": 2, "image_size": 4, "classes": 2})
    x, y = synthetic_images(config.samples, config.image_size, config.classes, seed)
    shape = (config.image_size, config.image_size, 3)
    info = {"classes": config.classes, "image_shape": shape, "input_shape": shape}
    return Data(*split_tail(x, y, config), info)
