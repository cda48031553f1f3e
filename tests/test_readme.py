"""Every Python snippet of the README runs as written (each in a fresh process, in a scratch
directory), after a few lines that make the data it names. The TensorFlow snippet it compares
with is the one block left out."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DATA = """
import numpy as np
import podkit as pk
rng = np.random.default_rng(0)
x_train = rng.normal(size=(512, 16)).astype("float32")
y_train = x_train[:, :10].argmax(1).astype("int32")
x_val, y_val = x_train[:64], y_train[:64]
def augment(x, y):
    return x, y
x = rng.normal(size=(256, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
x_test, y_test = x[:64], y[:64]
"""

MODEL = """
model = pk.Sequential([pk.layers.Dense(16, activation="relu"), pk.layers.Dense(2)])
"""

# What runs before each block, by the block's first line. A new snippet needs an entry here.
PRELUDES = {
    "strategy = tf.distribute.MirroredStrategy()": None,  # TensorFlow, for comparison
    "import podkit as pk": DATA,
    "ds = (pk.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10_000)": DATA + """
model = pk.Sequential([pk.layers.Dense(10, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
""",
    "pk.connect(cpu_devices=8)          # 8 virtual CPU devices (or PODKIT_CPU_DEVICES=8)":
        "import podkit as pk\n",
    "model.compile(optimizer=pk.optimizers.AdamW(learning_rate=1e-3),   # a schedule, or \"adam\"":
        DATA + MODEL,
    "model.fit(x, y, epochs=10, checkpoint=\"runs/exp/checkpoints\")   # or s3://..., gs://...":
        DATA + MODEL + "model.compile(optimizer='adam', loss=pk.losses."
        "SparseCategoricalCrossentropy(from_logits=True))\n",
}


def _blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]


def test_every_readme_snippet_has_a_prelude():
    firsts = [b.splitlines()[0] for b in _blocks()]
    missing = [f for f in firsts if f not in PRELUDES]
    assert not missing, f"README snippets without a prelude in tests/test_readme.py: {missing}"


@pytest.mark.parametrize("block", [b for b in _blocks()
                                   if PRELUDES.get(b.splitlines()[0]) is not None],
                         ids=lambda b: b.splitlines()[0][:40])
def test_the_readme_snippet_runs(block, tmp_path):
    script = PRELUDES[block.splitlines()[0]] + block
    if "pk.connect(cpu_devices=8)" in block:
        script += "\nimport jax\nassert jax.device_count() == 8\n"
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
