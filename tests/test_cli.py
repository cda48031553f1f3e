"""`podkit train` on a shrunken seed config, and the config tree's checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podkit import config as config_lib
from podkit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "configs" / "seed_mlp.toml"


def podkit_cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "podkit.cli", *args], capture_output=True, text=True, cwd=cwd,
        env=env, timeout=300,
    )


def test_cli_trains_a_shrunken_config(tmp_path):
    out = podkit_cli(
        "train", str(SEED), "--cpu-devices", "2",
        "--set", "train.epochs=2", "--set", f"run.dir={tmp_path / 'runs'}",
        "--set", "run.name=smoke", "--set", "train.log_every=5",
        "--set", "train.steps_per_execution=5",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "2 cpu device(s)" in out.stdout
    run = tmp_path / "runs" / "smoke"
    resolved = config_lib.load(run / "config.toml")
    assert resolved.train.epochs == 2 and resolved.run.name == "smoke"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) >= 10
    for r in steps:
        assert {"step", "loss", "accuracy"} <= set(r)
        assert r["step"] % 5 == 0
    assert any("samples_per_s" in r for r in steps)  # with the telemetry, twice a second
    assert any("val_accuracy" in r for r in records)
    final = json.loads((run / "final.json").read_text())
    assert final["val_accuracy"] > 0.5


def test_cli_bad_key_names_the_allowed_ones(tmp_path):
    out = podkit_cli("train", str(SEED), "--set", "train.epoch=2", cwd=tmp_path)
    assert out.returncode == 2
    assert "unknown key 'epoch' in [train]; allowed keys in [train]: epochs," in out.stderr


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"'optimiser' in \[train\]; allowed keys in \[train\]"):
        config_lib.from_dict({"train": {"optimiser": "adam"}})
    with pytest.raises(ConfigError, match=r"unknown key 'trainer'; allowed keys: run, data"):
        config_lib.from_dict({"trainer": {}})
    with pytest.raises(ConfigError, match=r"train.epochs = '3' should be of type int"):
        config_lib.from_dict({"train": {"epochs": "3"}})
    with pytest.raises(ConfigError, match=r"data.name = 'mnist'; allowed values: digits"):
        config_lib.from_dict({"data": {"name": "mnist"}})
    with pytest.raises(ConfigError, match=r"train.epochs = 0; it must be >= 1"):
        config_lib.from_dict({"train": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"does not exist"):
        config_lib.load(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"not section.key=value"):
        config_lib.load(SEED, ["train.epochs"])
    c = config_lib.load(SEED, ["train.epochs=3", "model.hidden=[64, 32]", "train.optimizer=sgd"])
    assert (c.train.epochs, c.model.hidden, c.train.optimizer) == (3, [64, 32], "sgd")
    assert config_lib.from_dict({}) == config_lib.Config()
    again = tmp_path / "again.toml"
    again.write_text(config_lib.to_toml(c))
    assert config_lib.load(again) == c


GPT = ROOT / "configs" / "gpt_small.toml"
TINY_GPT = ["--set", "train.steps=4", "--set", "train.steps_per_execution=2",
            "--set", "train.log_every=2", "--set", "train.warmup_steps=1",
            "--set", "model.layers=1", "--set", "model.embed=32", "--set", "model.mlp=64",
            "--set", "model.heads=2", "--set", "model.sample_tokens=8",
            "--set", "data.seq_len=32", "--set", "data.batch_size=8",
            "--set", "data.max_bytes=200000", "--set", "data.vocab_size=300",
            "--set", "checkpoint.enabled=false"]


def test_cli_trains_gpt_under_an_inline_table_mesh_and_writes_shardings_json(tmp_path):
    out = podkit_cli(
        "train", str(GPT), "--cpu-devices", "8", "--set", f"run.dir={tmp_path / 'runs'}",
        "--set", 'strategy.kind="tensor_parallel"',
        "--set", "strategy.mesh={data = 4, model = 2}", *TINY_GPT, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "--- sample ---" in out.stdout  # the language model writes a text sample
    assert "'model': 2" in out.stdout and "'data': 4" in out.stdout
    rows = json.loads((tmp_path / "runs" / "gpt_small" / "shardings.json").read_text())
    assert {r["kind"] for r in rows} == {"param", "opt_state"}
    for r in rows:
        assert set(r) == {"path", "shape", "dtype", "spec", "bytes_per_device", "kind"}
    # Tensor parallelism splits the MLP's hidden dim over the 2-way model axis.
    mlp = [r for r in rows if r["kind"] == "param" and "model" in json.dumps(r["spec"])]
    assert mlp, rows
    for r in mlp:
        full = 4 * int(__import__("math").prod(r["shape"]))
        assert r["bytes_per_device"] * 2 == full


def test_cli_mesh_axes_that_the_strategy_kind_does_not_use_are_an_error(tmp_path):
    out = podkit_cli("train", str(GPT), "--cpu-devices", "8",
                     "--set", "strategy.mesh={data = 4, model = 2}", *TINY_GPT, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "has axes ['model'] that kind = 'fsdp' does not use" in out.stderr


def test_cli_mesh_of_the_wrong_device_count_names_the_numbers(tmp_path):
    out = podkit_cli("train", str(GPT), "--cpu-devices", "8",
                     "--set", 'strategy.kind="tensor_parallel"',
                     "--set", "strategy.mesh={data = 3, model = 2}", *TINY_GPT, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "8" in out.stderr and "6" in out.stderr


def test_ctrl_c_in_podkit_train_saves_a_checkpoint_and_a_rerun_resumes(tmp_path):
    """Ctrl-C (SIGINT) mid-training stops as a scheduler's SIGTERM does: a checkpoint at the
    next step, exit status 0, no traceback; the same command then resumes from that step."""
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}
    # SIGINT as a terminal delivers it: a test runner started in the background hands its
    # children SIGINT ignored, which podkit (rightly) keeps ignored.
    cmd = [sys.executable, "-u", "-c", "import runpy, signal; signal.signal(signal.SIGINT, "
           "signal.default_int_handler); runpy.run_module('podkit.cli', run_name='__main__')",
           "train", str(SEED), "--set", "train.epochs=100000", "--set", f"run.dir={tmp_path}",
           "--set", "run.name=ctrl_c", "--set", "checkpoint.every_steps=45000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    try:
        for line in proc.stdout:
            if line.startswith("Epoch 3"):
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Ctrl-C: stopping at the next step with a checkpoint" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    steps = sorted((tmp_path / "ctrl_c" / "checkpoints").glob("step_*"))
    assert len(steps) == 1
    saved = int(steps[0].name.split("_")[1])
    assert f"preempted at step {saved}" in out
    # The rerun goes past the saved step (45 steps an epoch), however late the signal landed
    # on a loaded machine.
    epochs = saved // 45 + 2
    again = podkit_cli("train", str(SEED), "--set", f"train.epochs={epochs}", "--set",
                       f"run.dir={tmp_path}", "--set", "run.name=ctrl_c", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from checkpoint step {saved}" in again.stdout


def test_generated_text_cannot_drive_the_terminal():
    from podkit.cli import _printable

    text = "def f():\n\treturn 1\x1b[2J\x07 é\u200b"
    assert _printable(text) == "def f():\n\treturn 1\\x1b[2J\\x07 é\\u200b"
