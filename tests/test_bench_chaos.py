"""bench/chaos.py in a tiny form, so that it cannot rot: a 2-process GPT of one small block
under `podkit launch`, one process SIGKILLed and its local checkpoint tier deleted, against the
same run uninterrupted; the bench must complete and find the final weights bit-identical."""

import os
import subprocess
import sys
from pathlib import Path

from helpers import fast_xla_env

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.layers=1", "model.embed=32", "model.mlp=64", "model.heads=2",
        "data.seq_len=32", "data.batch_size=8", "data.max_bytes=200000", "data.vocab_size=300",
        "train.warmup_steps=2"]


def test_chaos_bench_kills_a_process_and_ends_on_the_uninterrupted_weights(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "chaos.py"), "--steps", "100",
           "--kill-every", "2:2", "--kills", "1", "--delete-local", "--no-targets",
           "--persistent-every", "100",
           "--where", str(tmp_path)]
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # the suite's (conftest.py): compiled once
        cmd += ["--compile-cache", os.environ["JAX_COMPILATION_CACHE_DIR"]]
    for s in TINY:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    env.update(fast_xla_env())
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-4000:]
    assert "SIGKILL process" in said and "deleted its local tier" in said, said[-3000:]
    assert "1 restarts" in said, said[-3000:]  # the chaos run's accounting saw the restart
    assert "final weights: bit-identical" in said, said[-3000:]
    chaos_log = (tmp_path / "chaos.log").read_text()
    assert "podkit launch: restart 1 of" in chaos_log
    # It resumed from the local tier (the persistent one holds only the end), the killed
    # process's shards from its peer's copy (its own were deleted).
    assert "podkit: restoring step" in chaos_log and "from the local tier" in chaos_log
    assert "'s copy" in chaos_log, chaos_log[-2000:]
