"""`podkit train` started from a Hugging Face directory (`[model] init_from = DIR`, or
--init-from DIR): the architecture from config.json, the text read with its tokenizer, the
weights its own; the run resumes, and exports back to transformers (real CLI processes)."""

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from helpers import fast_xla_env, finish, start_cli
from podkit import config as config_lib

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = Path(sys.modules["textwrap"].__file__).read_text()


def cli(*args, cwd):
    (out,) = finish(start_cli(*args, cwd=cwd, PODKIT_CACHE=str(cwd / "cache"),
                              **fast_xla_env()))
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random Llama (GQA) with a byte-level BPE of 300 ids in an embedding of 320 rows, and
    four text files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    where = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    ).save_pretrained(where / "tiny-llama")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(), decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(where / "tiny-llama" / "tokenizer.json"))
    (where / "docs").mkdir()
    for i in range(4):
        (where / "docs" / f"d{i}.txt").write_text(TEXT[i * 4000:(i + 1) * 4000])
    return where


CONFIG = textwrap.dedent("""
    [model]
    init_from = "{source}"
    sample_tokens = 0

    [data]
    name = "text"
    files = "{docs}/*.txt"
    seq_len = 32
    batch_size = 8
    validation_fraction = 0.25

    [train]
    steps = {steps}
    steps_per_execution = 2
    warmup_steps = 1
    learning_rate = 0.003

    [run]
    name = "ft"
""")


def test_a_run_starts_from_a_hugging_face_directory_resumes_and_goes_back(hf_dir, tmp_path):
    source = hf_dir / "tiny-llama"
    config = tmp_path / "ft.toml"
    config.write_text(CONFIG.format(source=source, docs=hf_dir / "docs", steps=2))
    out = cli("train", str(config), "--cpu-devices", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "initialized from" in out.stdout and "Hugging Face llama model's weights" in out.stdout
    run = tmp_path / "runs" / "ft"
    saved = config_lib.load(run / "config.toml")
    assert (saved.model.name, saved.model.kv_heads, saved.model.embed) == ("llama", 2, 64)
    assert saved.train.from_logits  # the loss takes the model's logits
    # The run reads its text with the model's tokenizer and keeps it.
    assert json.loads((run / "tokenizer.json").read_text()) == json.loads(
        (source / "tokenizer.json").read_text())
    assert json.loads((run / "data_info.json").read_text())["vocab_size"] == 320
    # Its resumes resume ([model] init_from started it; it is part of the config now).
    config.write_text(CONFIG.format(source=source, docs=hf_dir / "docs", steps=4))
    out = cli("train", str(config), "--cpu-devices", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from checkpoint step 2" in out.stdout
    # ... and it goes back to transformers with podkit's logits.
    out = cli("export", str(run), "--format", "hf", "--cpu-devices", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    back = transformers.AutoModelForCausalLM.from_pretrained(run / "hf").eval()
    tokens = np.random.default_rng(0).integers(0, 300, (2, 32)).astype(np.int32)
    with torch.no_grad():
        theirs = back(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    ours = pk.models.from_run(run, compile=False).predict(tokens, verbose=0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    # podkit generate stops at the end-of-text token of the files' text, prints it unless
    # told to skip special tokens, and goes on past it with --no-stop.
    from podkit.cli import _printable
    from podkit.models.gpt import generate

    model = pk.models.from_run(run, compile=False)
    tokenizer = pk.runs.load_tokenizer(run)
    eos = tokenizer.token_to_id("<|endoftext|>")
    prompt = tokenizer.encode("def ", add_special_tokens=False).ids
    ours = generate(model, prompt, 40, top_k=1, stop=eos)
    args = ("generate", str(run), "--prompt", "def ", "--max-tokens", "40", "--top-k", "1",
            "--cpu-devices", "1")
    for extra, stops, shown in (((), True, True), (("--skip-special-tokens",), True, False),
                                (("--no-stop",), False, True)):
        out = cli(*args, *extra, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        tokens = ours if stops else generate(model, prompt, 40, top_k=1)
        text = _printable(tokenizer.decode(prompt + tokens, skip_special_tokens=not shown))
        assert out.stdout.endswith(text + "\n")
    # Trained from the checkpoint's weights, not from scratch: nearer them than a fresh init.
    start = transformers.AutoModelForCausalLM.from_pretrained(source).state_dict()
    tuned = back.state_dict()
    moved = max(float((tuned[k] - start[k]).abs().max()) for k in start)
    assert 0 < moved < 0.05


def test_what_a_hugging_face_start_needs_is_named(hf_dir, tmp_path):
    source = hf_dir / "tiny-llama"
    config = tmp_path / "bad.toml"
    config.write_text(f'[model]\ninit_from = "{source}"\n[data]\nname = "text"\n')
    out = cli("train", str(config), "--cpu-devices", "1", cwd=tmp_path)
    assert out.returncode == 2
    assert 'trains on your text: [data] name = "text" (documents) or "instructions"' in out.stderr
    config.write_text(CONFIG.format(source=source, docs=hf_dir / "docs", steps=2)
                      .replace("seq_len = 32", "seq_len = 128"))
    out = cli("train", str(config), "--cpu-devices", "1", cwd=tmp_path)
    assert out.returncode == 2
    assert "data.seq_len = 128 is past the model's context of 64" in out.stderr
    config.write_text(CONFIG.format(source="tiyn", docs=hf_dir / "docs", steps=2))
    out = cli("train", str(config), "--cpu-devices", "1", cwd=tmp_path)
    assert out.returncode == 2
    assert "[model] init_from = 'tiyn': no such directory (relative paths are from" \
        in out.stderr
