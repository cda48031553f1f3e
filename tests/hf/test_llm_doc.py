"""docs/llm.md's Python runs as written, in a fresh process in a scratch directory, after a
prelude that writes the tiny Hugging Face directory it reads (a random Qwen2 that
transformers' save_pretrained writes)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
PRELUDE = """
import torch, transformers
torch.manual_seed(0)
transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=True)).save_pretrained("tiny-qwen2")
"""


def test_the_walk_from_a_hugging_face_directory_runs_and_agrees(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "llm.md").read_text(), re.S)
    assert len(blocks) == 1
    out = subprocess.run([sys.executable, "-c", PRELUDE + blocks[0]], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    difference = float(re.search(r"max \|podkit - transformers\|: (\S+)", out.stdout)[1])
    assert difference < 1e-4
    assert (tmp_path / "tiny-qwen2-tuned" / "config.json").is_file()
