"""`podkit train` started from a Hugging Face directory (`[model] init_from = DIR`, or
--init-from DIR): the architecture from config.json, the text read with its tokenizer, the
weights its own; the run resumes, and exports back to transformers (real CLI processes)."""

import json
import shutil
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from helpers import fast_xla_env, finish, start_cli
from podkit import config as config_lib
from podkit import paths
from storage_servers import BUCKET

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = Path(sys.modules["textwrap"].__file__).read_text()


def cli(*args, cwd):
    (out,) = finish(start_cli(*args, cwd=cwd, PODKIT_CACHE=str(cwd / "cache"),
                              **fast_xla_env()))
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random Llama (GQA, a context of 64) with a byte-level BPE of 300 ids in an
    embedding of 320 rows, and four text files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    where = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    with torch.no_grad():  # sharp enough that greedy decoding has no near-ties (test_hf_in)
        for p in llama.parameters():
            p.mul_(8.0 if p.ndim > 1 else 1.0)
    llama.save_pretrained(where / "tiny-llama")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(), decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(where / "tiny-llama" / "tokenizer.json"))
    # A pad token and no bos token, as many base models' tokenizers have.
    (where / "tiny-llama" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
         "eos_token": "<|endoftext|>", "model_max_length": 64}))
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


def test_a_run_starts_from_a_hugging_face_directory_resumes_and_goes_back(hf_dir, tmp_path,
                                                                         s3):
    # The source on S3 (moto's), as `init_from = "s3://..."`; the export goes there too.
    root = f"s3://{BUCKET}/hf-run-{uuid.uuid4().hex[:10]}"
    with paths.staged(f"{root}/tiny-llama") as there:
        shutil.copytree(hf_dir / "tiny-llama", there)
    local_source, source = hf_dir / "tiny-llama", f"{root}/tiny-llama"
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
        (local_source / "tokenizer.json").read_text())
    assert json.loads((run / "data_info.json").read_text())["vocab_size"] == 320
    # Its resumes resume ([model] init_from started it; it is part of the config now).
    config.write_text(CONFIG.format(source=source, docs=hf_dir / "docs", steps=4))
    out = cli("train", str(config), "--cpu-devices", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from checkpoint step 2" in out.stdout
    # ... and it goes back to transformers with podkit's logits, ready to serve: the
    # source's pad token (a batch pads), no bos made up, its context of 64 (not the 32
    # trained on), written to S3 in the dtype asked for.
    out = cli("export", str(run), "--format", "hf", "--out", f"{root}/hf", "--dtype",
              "float32", "--cpu-devices", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    with paths.local_copy(f"{root}/hf") as exported:
        back = transformers.AutoModelForCausalLM.from_pretrained(exported).eval()
        hf_tok = transformers.AutoTokenizer.from_pretrained(exported)
    assert back.config.max_position_embeddings == 64
    assert hf_tok.pad_token == "<pad>" and hf_tok.bos_token is None
    assert hf_tok.eos_token == "<|endoftext|>"
    batch = hf_tok(["a", "longer text"], padding=True)["input_ids"]
    assert len(batch[0]) == len(batch[1]) and batch[0][-1] == hf_tok.pad_token_id
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
    ours = generate(model, prompt, 40, temperature=0, stop=eos)
    # transformers' greedy decoding of the export, token for token
    with torch.no_grad():
        greedy = back.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                               eos_token_id=eos, pad_token_id=hf_tok.pad_token_id)
    assert greedy[0, len(prompt):].tolist() == ours
    args = ("generate", str(run), "--prompt", "def ", "--max-tokens", "40", "--temperature",
            "0", "--cpu-devices", "1")
    for extra, stops, shown in (((), True, True), (("--skip-special-tokens",), True, False),
                                (("--no-stop",), False, True)):
        out = cli(*args, *extra, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        tokens = ours if stops else generate(model, prompt, 40, temperature=0)
        text = _printable(tokenizer.decode(prompt + tokens, skip_special_tokens=not shown))
        assert out.stdout.endswith(text + "\n")
    # Trained from the checkpoint's weights, not from scratch: nearer them than a fresh init.
    start = transformers.AutoModelForCausalLM.from_pretrained(local_source).state_dict()
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
