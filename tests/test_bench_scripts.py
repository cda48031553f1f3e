"""The benchmark scripts refuse what they do not understand, before anything runs (issue 41):
a contestant setting that is no key of the model's config is an error naming it, not a run of
the defaults under another label."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("argv, said", [
    (["tpu.py", "--only", "podkit:vocab_chunks=0"], "vocab_chunks: not a key of GPTConfig"),
    (["tpu.py", "--model", "llama", "--only", "expert:batch=x"], "batch takes a positive int"),
    (["tpu.py", "--only", "podkit:grad_norm=1"], "grad_norm takes bool"),
    (["gpt.py", "--settings", "3:dp"], "choose from"),
])
def test_an_unknown_setting_is_refused_by_name(argv, said):
    out = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0, out.stdout[-500:]
    assert said in out.stdout + out.stderr, (out.stdout + out.stderr)[-800:]
