"""docs/migrating.md runs as written: its podkit blocks in order, in one fresh process in a
scratch directory, after a set-up process that writes what the page reads (ImageNet-style
TFRecord shards, and `model.keras` saved by Keras 3 itself). Where TensorFlow is installed (the
bench extra; not in CI), its TensorFlow blocks run the same way, so both columns stay true."""

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "migrating.md"

SETUP = """
import os
os.environ["KERAS_BACKEND"] = "jax"
import keras
from podkit.datasets.imagenet_tfrecord import write_shards

write_shards("data", images=160, shards=4, classes=10, min_side=48, max_side=96, workers=1)
model = keras.Sequential([keras.Input((64, 64, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.save("model.keras")
"""


def _blocks() -> list[str]:
    text = DOC.read_text()
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


def _is_tensorflow(block: str) -> bool:
    return block.startswith("import tensorflow")


def _run(code: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("migrating")
    done = _run(SETUP, where, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def test_the_page_has_both_columns():
    blocks = _blocks()
    assert sum(map(_is_tensorflow, blocks)) == 3, "one TensorFlow block per part (1-3)"
    assert len(blocks) - 3 >= 4


def test_the_podkit_blocks_run_in_order(scratch):
    blocks = [b for b in _blocks() if not _is_tensorflow(b)]
    # Each block's start is printed, so a failure names the block it happened in.
    script = "\n".join(f"print('-- block {i}', flush=True)\n{b}" for i, b in enumerate(blocks))
    done = _run(script, scratch, 600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "(32, 64, 64, 3) int64" in done.stdout
    assert "(4, 10)" in done.stdout
    assert (scratch / "trained.keras").is_file()
    assert (scratch / "ckpt" / "best.keras").is_file()
    assert any((scratch / "logs").rglob("*tfevents*"))


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is not installed (the bench extra): its column is "
                           "checked where it is")
def test_the_tensorflow_blocks_run_in_order(scratch):
    blocks = [b for b in _blocks() if _is_tensorflow(b)]
    done = _run("\n".join(blocks), scratch, 600)
    assert done.returncode == 0, done.stderr[-4000:]
