"""From a finished run to use: `pk.models.from_run`, `podkit eval`, `generate` and `export`
on GPT, ResNet and DLRM runs that `podkit train` wrote (real CLI processes, real files)."""

import json
import math
import os
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import podkit as pk
from helpers import fast_xla_env, finish
from helpers import start_cli as start

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

TINY = {
    "gpt": ("gpt_small.toml", ["train.steps=4", "train.steps_per_execution=2",
                               "train.log_every=2", "train.warmup_steps=1", "model.layers=1",
                               "model.embed=32", "model.mlp=64", "model.heads=2",
                               "model.sample_tokens=0", "data.seq_len=32", "data.batch_size=8",
                               "data.max_bytes=200000", "data.vocab_size=300",
                               "checkpoint.every_steps=2"]),
    # The steps in whole executions: a steps_per_execution that does not divide them compiles
    # a second train program for the rest (ResNet-18: seconds). The clicks' epoch is 15 steps
    # (3,686 rows in batches of 256).
    "resnet": ("resnet_digits.toml", ["train.steps=4", "model.width=4",
                                      "train.steps_per_execution=4", "train.log_every=4"]),
    "dlrm": ("dlrm.toml", ["data.samples=4096", "data.table_rows=64", "data.batch_size=256",
                           "train.steps_per_execution=5", "train.log_every=5"]),
}


def cli(*args, cwd):
    (out,) = finish(start(*args, cwd=cwd))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One trained run of each factory model (2 CPU devices), by model name; the three
    trained at once."""
    base = tmp_path_factory.mktemp("runs")
    # The ResNet's initial parameters from the classic threefry: XLA:CPU compiles ResNet-18's
    # initialization in ~2 s with it and ~7 s with the partitionable one (JAX's default); no
    # test here depends on which random bits its training started from.
    threefry = {"resnet": {"JAX_THREEFRY_PARTITIONABLE": "0"}}
    # XLA:CPU's cheapest code generation for the trainings (helpers.FAST_XLA): no test here
    # depends on how XLA optimized the programs that trained the weights (everything after
    # reads the checkpoints, at XLA's defaults).
    xla = fast_xla_env()
    procs = {name: start("train", str(CONFIGS / config), "--cpu-devices", "2",
                         *[a for s in [*sets, f"run.dir={base}", f"run.name={name}"]
                           for a in ("--set", s)], cwd=base, **xla, **threefry.get(name, {}))
             for name, (config, sets) in TINY.items()}
    for out in finish(*procs.values()):
        assert out.returncode == 0, out.stderr[-3000:]
    return {name: base / name for name in TINY}


def test_a_text_run_keeps_its_tokenizer_and_what_sized_the_model(runs):
    info = json.loads((runs["gpt"] / "data_info.json").read_text())
    assert info["vocab_size"] == 300 and info["seq_len"] == 32
    tokenizer = pk.runs.load_tokenizer(runs["gpt"])
    assert tokenizer.decode(tokenizer.encode("def f(x): return x").ids) == "def f(x): return x"


@pytest.mark.parametrize("name", ["gpt", "resnet", "dlrm"])
def test_from_run_gives_the_checkpointed_weights_on_another_device_count(runs, name, tmp_path):
    # The run went to its end (for resnet_digits.toml, what tests/test_configs_launch.py
    # leaves to this test): a finite loss, a valid final checkpoint.
    assert np.isfinite(json.loads((runs[name] / "final.json").read_text())["loss"])
    manager = pk.checkpoint.CheckpointManager(runs[name] / "checkpoints")
    assert len(manager.digest()[1]) == 32
    model = pk.models.from_run(runs[name])  # 8 devices here; the run trained on 2
    step, _ = manager.meta()
    assert model.optimizer.iterations == step > 0  # compiled: the optimizer state too
    # The export is the weights by name.
    path = pk.runs.export(model, tmp_path / "w.safetensors")
    tensors = load_file(str(path))
    mine = pk.runs.named_weights(model)
    assert sorted(tensors) == sorted(mine) and len(tensors) > 2
    for key, value in mine.items():
        np.testing.assert_array_equal(tensors[key], value)
    assert all(k.startswith(("params/", "rest/")) for k in tensors)
    again = np.load(pk.runs.export(model, tmp_path / "w", format="npz"))
    for key, value in mine.items():
        np.testing.assert_array_equal(again[key], value)
    # compile=False builds the model with random weights, then reads the checkpoint's over
    # them: the classic threefry compiles that initialization faster (ResNet-18 on CPU: ~2 s,
    # not ~6 s), and a weight the checkpoint failed to replace differs all the same.
    with jax.threefry_partitionable(False):
        weights_only = pk.models.from_run(runs[name], compile=False)
    for key, value in pk.runs.named_weights(weights_only).items():
        np.testing.assert_array_equal(mine[key], value)


def test_podkit_export_on_the_runs_own_device_count_gives_the_same_tensors(runs, tmp_path):
    proc = start("export", str(runs["gpt"]), "--cpu-devices", "2", "--format", "safetensors",
                 "--out", str(tmp_path / "two.safetensors"), cwd=tmp_path)
    mine = pk.runs.named_weights(pk.models.from_run(runs["gpt"]))  # meanwhile
    (out,) = finish(proc)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"wrote {tmp_path / 'two.safetensors'}" in out.stdout
    two = load_file(str(tmp_path / "two.safetensors"))
    assert sorted(two) == sorted(mine)
    for key, value in mine.items():
        np.testing.assert_array_equal(two[key], value)


def test_load_weights_reads_back_what_export_wrote(runs, tmp_path):
    last = pk.models.from_run(runs["gpt"], compile=False)
    path = pk.runs.export(last, tmp_path / "w.safetensors")
    earlier = pk.models.from_run(runs["gpt"], step=2, compile=False)  # other weights
    assert any(not np.array_equal(a, b) for a, b in zip(
        pk.runs.named_weights(earlier).values(), pk.runs.named_weights(last).values(), strict=True))
    earlier.load_weights(path)
    for key, value in pk.runs.named_weights(last).items():
        np.testing.assert_array_equal(pk.runs.named_weights(earlier)[key], value)
    # A model of podkit layers by its layers' names; another model's file names both sides.
    model = pk.Sequential([pk.Input((3,)), pk.layers.Dense(2, name="out")])
    model.load_weights(pk.runs.export(model, tmp_path / "dense.safetensors"))
    with pytest.raises(pk.InputError, match=r"missing \['out/bias', 'out/kernel'\], not "
                                            r"the model's \['params/blocks"):
        model.load_weights(path)


def test_podkit_export_hf_gives_transformers_a_gpt2_with_the_runs_logits(runs, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    proc = start("export", str(runs["gpt"]), "--cpu-devices", "2", "--format", "hf",
                 "--out", str(tmp_path / "hf"), cwd=tmp_path)
    model = pk.models.from_run(runs["gpt"], compile=False)  # meanwhile
    tokens = np.random.default_rng(1).integers(0, 300, (2, 32)).astype(np.int32)
    ours = model.predict(tokens, verbose=0)
    (out,) = finish(proc)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "AutoModelForCausalLM.from_pretrained reads it" in out.stdout
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    # The run's tokenizer comes along, and the end-of-text id is in the configs.
    tokenizer = pk.runs.load_tokenizer(runs["gpt"])
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "def main():\n    return 0\n"
    assert theirs(text)["input_ids"] == tokenizer.encode(text).ids
    # The built-in corpus puts no end-of-text token between documents: none is named.
    assert tokenizer.token_to_id("<|endoftext|>") is None
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert "eos_token_id" not in generation and hf.config.eos_token_id is None


def test_podkit_eval_reports_loss_perplexity_and_the_runs_metrics(runs, tmp_path):
    procs = [start("eval", str(runs["gpt"]), "--json", "--cpu-devices", "2", cwd=tmp_path),
             start("eval", str(runs["dlrm"]), "--cpu-devices", "2", cwd=tmp_path)]
    # In Python, the same numbers (float tolerance: another device count), meanwhile.
    model = pk.models.from_run(runs["gpt"])
    data = pk.datasets.load(pk.runs.read_config(runs["gpt"]).data)
    here = model.evaluate(*data.validation, batch_size=8, verbose=0, return_dict=True)
    out, dlrm = finish(*procs)
    assert out.returncode == 0, out.stderr[-3000:]
    gpt = json.loads(out.stdout.strip().splitlines()[-1])
    assert gpt["perplexity"] == pytest.approx(math.exp(gpt["loss"]), rel=1e-6)
    assert 0 <= gpt["accuracy"] <= 1 and gpt["perplexity"] < 300  # better than uniform
    out = dlrm
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(validation, 410 rows): loss" in out.stdout and " auc 0." in out.stdout
    assert here["loss"] == pytest.approx(gpt["loss"], rel=1e-4)


def test_podkit_generate_continues_a_prompt_with_top_k(runs, tmp_path):
    proc = start("generate", str(runs["gpt"]), "--prompt", "def ", "--max-tokens", "12",
                 "--top-k", "5", "--cpu-devices", "2", cwd=tmp_path)
    from podkit.models.gpt import generate

    model = pk.models.from_run(runs["gpt"], compile=False)
    tokenizer = pk.runs.load_tokenizer(runs["gpt"])
    prompt = tokenizer.encode("def ").ids
    sample = generate(model, prompt, 12, top_k=5)  # seed 0, as the CLI's default
    (out,) = finish(proc)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout.strip()
    assert text.startswith("def ") and len(text) > len("def ")
    # the same sample on 8 devices (the CLI's line read stripped, as `text`)
    assert tokenizer.decode(prompt + sample).strip() == text
    # top_k=1 is greedy: the likeliest token each time, whatever the seed.
    assert generate(model, [5, 6], 6, top_k=1) == generate(model, [5, 6], 6, top_k=1, seed=9)
    with pytest.raises(pk.ConfigError, match=r"top_k=-1 must be an int >= 0"):
        generate(model, [5], 2, top_k=-1)


def test_run_errors_name_the_fix(runs, tmp_path):
    procs = [start("generate", str(runs["resnet"]), "--prompt", "hi", "--cpu-devices", "1",
                   cwd=tmp_path),
             start("export", str(runs["gpt"]), "--format", "onnx", cwd=tmp_path)]
    with pytest.raises(pk.ConfigError, match=r"not a run directory.*config\.toml"):
        pk.models.from_run(tmp_path)
    with pytest.raises(pk.ConfigError, match="pass the run directory above it"):
        pk.models.from_run(runs["gpt"] / "checkpoints")
    with pytest.raises(pk.ConfigError, match="export format 'onnx'"):
        pk.runs.export(pk.models.from_run(runs["dlrm"]), tmp_path / "x", format="onnx")
    with pytest.raises(pk.InputError, match="999"):
        pk.models.from_run(runs["gpt"], step=999)
    out, onnx = finish(*procs)
    assert out.returncode == 2 and "needs a language-model run" in out.stderr
    assert onnx.returncode == 2


def test_cli_arguments_are_checked_by_their_flags_before_the_model_loads(runs, tmp_path):
    """generate's flags are named as the user typed them; eval --batches beyond the split,
    export to a name of the other format, and prompt ids on a text run's sibling flag."""
    gpt = str(runs["gpt"])
    bad = [(["--max-tokens", "0"], "--max-tokens 0; give an int >= 1"),
           (["--top-k", "-1"], "--top-k -1; give an int >= 0"),
           (["--temperature", "-1"], r"--temperature -1.0; give a number >= 0 \(0: greedy"),
           (["--prompt-ids", "1,x"], "--prompt-ids '1,x'; give token ids")]
    procs = [start("generate", gpt, *([] if "--prompt-ids" in flags else ["--prompt", "def "]),
                   *flags, cwd=tmp_path) for flags, _ in bad]
    procs.append(start("generate", gpt, "--prompt-ids", "5,6", "--max-tokens", "3", "--top-k",
                       "1", "--cpu-devices", "1", cwd=tmp_path))
    procs.append(start("eval", gpt, "--batches", "100000", "--cpu-devices", "1", cwd=tmp_path))
    # In Python meanwhile: export to a name of the other format, and to a directory.
    with pytest.raises(pk.ConfigError, match=r"ends in \.npz but the format is 'safetensors'"):
        pk.runs.export(pk.models.from_run(runs["dlrm"]), tmp_path / "w.npz")
    written = pk.runs.export(pk.models.from_run(runs["dlrm"]), tmp_path)  # a directory
    assert written == tmp_path / "weights.safetensors"
    assert written.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as open() makes files
    *refused, ids, out = finish(*procs)
    for (_, said), out_ in zip(bad, refused, strict=True):
        assert out_.returncode == 2 and re.search(said, out_.stderr), out_.stderr[-2000:]
    assert ids.returncode == 0, ids.stderr[-2000:]
    assert re.fullmatch(r"5,6(,\d+){3}", ids.stdout.strip().splitlines()[-1])
    assert out.returncode == 2 and re.search(r"--batches 100000: the validation split holds "
                                             r"\d+ batches", out.stderr), out.stderr[-2000:]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
