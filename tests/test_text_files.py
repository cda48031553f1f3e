"""Your own text from the CLI: `[data] name = "text"` with `files` (plain text, JSONL, ArrayRecord
token ids), a trained or given tokenizer, documents packed with end-of-text between them, read
as a stream, and a run that resumes exactly and keeps its tokenizer (real files, real CLI)."""

import json
import re
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from helpers import fast_xla_env, finish, start_cli
from podkit import config as config_lib
from podkit import datasets
from podkit.datasets import files as text_files

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six text files and a JSONL file of six documents: stdlib modules, copied."""
    where = tmp_path_factory.mktemp("corpus")
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    sources = [p for p in sources if 2_000 < p.stat().st_size < 40_000][:12]
    docs = [p.read_text() for p in sources]
    for i, text in enumerate(docs[:6]):
        (where / f"doc{i}.txt").write_text(text)
    with open(where / "more.jsonl", "w") as f:
        for text in docs[6:]:
            f.write(json.dumps({"id": 1, "text": text}) + "\n")
    return where, docs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def canonical(tokenizer_json: str) -> str:
    """A tokenizer's JSON without its layout (saved files are indented, to_str is not)."""
    return json.dumps(json.loads(tokenizer_json), sort_keys=True)


def text_config(**sets):
    overrides = [f"data.{k}={json.dumps(v)}" for k, v in sets.items()]
    return config_lib.load(ROOT / "configs" / "gpt_small.toml", overrides).data


def test_documents_are_packed_with_end_of_text_between_them(corpus, cache):
    where, docs = corpus
    cfg = text_config(files=f"{where}/*.txt, {where}/*.jsonl", vocab_size=400, seq_len=32,
                      validation_fraction=0.0, batch_size=4)
    data = datasets.load(cfg, seed=0)
    tokenizer = data.info["tokenizer"]
    eos = tokenizer.token_to_id("<|endoftext|>")
    expected = np.concatenate([np.asarray(tokenizer.encode(d, add_special_tokens=False).ids
                                          + [eos]) for d in docs])
    assert data.info["tokens"] == len(expected) and data.info["vocab_size"] == 400
    assert data.rows == (len(expected) - 1) // 32
    # Every window of the stream is the packed text, y one token ahead of x.
    x, y = data.first(data.rows)
    windows = {tuple(expected[i * 32:i * 32 + 33]) for i in range(data.rows)}
    got = {tuple(np.append(a, b[-1])) for a, b in zip(x, y, strict=True)}
    assert got <= windows and len(got) >= data.rows - 4  # one pass, whole batches only
    assert (x[:, 1:] == y[:, :-1]).all()
    # The document boundaries are there: one end-of-text per document.
    assert int((expected == eos).sum()) == len(docs)


def test_a_text_file_is_read_in_blocks_not_whole(tmp_path, monkeypatch):
    """Streamed: a 3 MB file arrives in blocks of at most BLOCK_CHARS, cut at line ends; a
    file without line ends is cut before a space, never read whole."""
    big = tmp_path / "big.txt"
    line = "the quick brown fox jumps over the lazy dog\n"
    big.write_text(line * (3_000_000 // len(line)))
    monkeypatch.setattr(text_files, "BLOCK_CHARS", 1 << 20)
    blocks = list(text_files.blocks([str(big)], "auto", "text"))
    assert len(blocks) >= 3 and [ends for _, ends in blocks] == [False] * (len(blocks) - 1) + [True]
    assert all(b.endswith("\n") and len(b) <= 1 << 20 for b, _ in blocks[:-1])
    assert "".join(b for b, _ in blocks) == big.read_text()
    one_line = tmp_path / "one_line.txt"
    one_line.write_text(line.strip() * 1000 + " " + "word " * 50_000)
    monkeypatch.setattr(text_files, "BLOCK_CHARS", 10_000)
    blocks = [b for b, _ in text_files.blocks([str(one_line)], "auto", "text")]
    assert len(blocks) > 20 and max(map(len, blocks)) <= 2 * 10_000
    assert all(b.startswith(" ") for b in blocks[2:])  # the space starts the next word's block
    assert "".join(blocks) == one_line.read_text()


def test_a_file_format_is_read_from_the_file_name_not_its_folder():
    assert text_files.file_format("/data/set.jsonl/part-0.txt", "auto") == "text"
    assert text_files.file_format("/data/x/ids.array_record-00001-of-00004", "auto") \
        == "arrayrecord"
    assert text_files.file_format("/data/x/DOCS.JSONL", "auto") == "jsonl"
    assert text_files.file_format("/data/x/docs.jsonl", "text") == "text"  # as configured


def test_validation_files_are_encoded_by_the_training_tokenizer(corpus, cache, tmp_path):
    """tokenizer = "train" trains once, on data.files: the validation files' windows are
    their documents in that tokenizer's ids (a second BPE trained on them would differ)."""
    where, docs = corpus
    data = datasets.load(text_config(files=f"{where}/*.txt", validation_files=f"{where}/*.jsonl",
                                     vocab_size=300, seq_len=16, batch_size=4), seed=0)
    tokenizer = data.info["tokenizer"]
    eos = tokenizer.token_to_id("<|endoftext|>")
    stream = np.concatenate([tokenizer.encode(d, add_special_tokens=False).ids + [eos]
                             for d in docs[6:]])
    rows = [np.append(x, y[:, -1:], axis=1) for x, y in data.validation]
    got = np.concatenate(rows)
    assert len(got) == (len(stream) - 1) // 16 // 4 * 4  # whole batches of 4
    for i, row in enumerate(got):
        assert (row == stream[i * 16:i * 16 + 17]).all()
    trained = {canonical(p.read_text()) for p in cache.glob("text/files-*/tokenizer.json")}
    assert trained == {canonical(tokenizer.to_str())}  # one tokenizer, kept with both token files
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("too short")
    with pytest.raises(pk.ConfigError, match=r"validation_files = '.*tiny.txt' hold fewer "
                                             r"than data.seq_len \+ 1 = 17 tokens"):
        datasets.load(text_config(files=f"{where}/*.txt", validation_files=str(tiny),
                                  vocab_size=300, seq_len=16), seed=0)
    pk.data.write_array_record(pk.data.Dataset.from_sequence(
        [np.arange(40, dtype=np.int32).tobytes()]), tmp_path / "ids", num_shards=1)
    with pytest.raises(pk.ConfigError, match=r"data.files and data.validation_files mix "
                                             r"ArrayRecord token ids with text"):
        datasets.load(text_config(files=f"{where}/*.txt", validation_files=f"{tmp_path}/ids*",
                                  vocab_size=300, seq_len=16), seed=0)


def test_the_vocabulary_holds_a_tokenizer_files_largest_id():
    """A tokenizer.json's ids may leave holes: the embedding must reach the largest."""
    from tokenizers import Tokenizer, models

    holes = Tokenizer(models.WordLevel({"a": 0, "b": 5, "<unk>": 9}, unk_token="<unk>"))
    assert holes.get_vocab_size() == 3 and text_files.vocab_size(holes) == 10


def test_array_record_token_ids_train_as_they_are(tmp_path, cache):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 300, size=int(rng.integers(50, 200))).astype(np.int32)
            for _ in range(60)]
    pk.data.write_array_record(pk.data.Dataset.from_sequence([d.tobytes() for d in docs]),
                               tmp_path / "ids", num_shards=2)
    cfg = text_config(files=f"{tmp_path}/ids*", vocab_size=300, seq_len=16, batch_size=4,
                      validation_fraction=0.1)
    data = datasets.load(cfg, seed=0)
    assert data.info["tokens"] == sum(len(d) for d in docs) and "tokenizer" not in data.info
    x, y = data.first(8)
    stream = np.concatenate(docs)
    windows = {tuple(stream[i * 16:i * 16 + 17]) for i in range(len(stream) // 16)}
    for row in np.concatenate([x, y[:, -1:]], axis=1):
        assert tuple(row) in windows  # a window of the documents' ids, nothing added
    assert data.validation is not None
    with pytest.raises(pk.ConfigError, match=r"data.tokenizer = '/x/tok.json', but data.files "
                                             r"hold ArrayRecord token ids"):
        datasets.load(text_config(files=f"{tmp_path}/ids*", vocab_size=300,
                                  tokenizer="/x/tok.json"), seed=0)
    with pytest.raises(pk.ConfigError, match=r"outside \[0, data.vocab_size = 200\)"):
        datasets.load(text_config(files=f"{tmp_path}/ids*", vocab_size=200), seed=0)


def test_a_given_tokenizer_file_is_used_and_cached(corpus, cache, tmp_path):
    where, _ = corpus
    first = datasets.load(text_config(files=f"{where}/*.txt", vocab_size=300, seq_len=16),
                          seed=0)
    path = tmp_path / "tok.json"
    first.info["tokenizer"].save(str(path))
    again = datasets.load(text_config(files=f"{where}/*.txt", tokenizer=str(path),
                                      seq_len=16), seed=0)
    assert again.info["tokens"] == first.info["tokens"]
    assert again.info["tokenizer"].to_str() == first.info["tokenizer"].to_str()
    assert len(list(cache.glob("text/files-*/tokens.bin"))) == 2  # keyed by the tokenizer


@pytest.mark.parametrize(("sets", "pattern"), [
    (dict(files="/nonexistent/*.txt"), r"data.files: no file matches '/nonexistent/\*.txt'"),
    (dict(files="{where}/*.jsonl", field="body"), r"has no field 'body' \(it has \['id', "
                                                  r"'text'\]\); set data.field"),
    (dict(files="{where}/*.txt", tokenizer="/nonexistent.json"),
     r"data.tokenizer = '/nonexistent.json' is not a file"),
    (dict(files="{where}/*.txt", format="csv"), r"data.format = 'csv'; valid: auto, text"),
    (dict(files="{where}/*.txt", seq_len=100_000), r"fewer than one batch"),
    (dict(validation_files="{where}/*.txt"), r"data.validation_files is set but data.files"),
    (dict(files="{where}/*.txt", validation_fraction=0.0005, batch_size=16, seq_len=16),
     r"data.validation_fraction = 0.0005 of \d+ windows gives \d validation windows of "
     r"data.seq_len = 16: fewer than one batch of data.batch_size = 16"),
])
def test_bad_text_settings_are_config_errors_naming_the_key(corpus, cache, sets, pattern):
    where, _ = corpus
    sets = {k: v.format(where=where) if isinstance(v, str) else v for k, v in sets.items()}
    with pytest.raises(pk.ConfigError, match=pattern):
        datasets.load(text_config(vocab_size=300, **sets), seed=0)


def test_bad_json_and_a_missing_end_of_text_token_name_the_fix(corpus, cache, tmp_path):
    where, _ = corpus
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(pk.InputError, match=r"bad.jsonl:2 is not JSON"):
        datasets.load(text_config(files=str(bad), vocab_size=300), seed=0)
    plain = tmp_path / "latin.txt"
    plain.write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(pk.InputError, match=r"latin.txt is not UTF-8 .*iconv"):
        datasets.load(text_config(files=str(plain), vocab_size=300), seed=0)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(pk.InputError, match=r"latin.jsonl:2 is not UTF-8 .*byte 13"):
        datasets.load(text_config(files=str(latin), vocab_size=300), seed=0)
    data = datasets.load(text_config(files=f"{where}/*.txt", vocab_size=300, seq_len=16),
                         seed=0)
    path = tmp_path / "tok.json"
    data.info["tokenizer"].save(str(path))
    with pytest.raises(pk.ConfigError, match=r"data.eos_token = '</s>' is not in the "
                                             r"tokenizer.*'<\|endoftext\|>'"):
        datasets.load(text_config(files=f"{where}/*.txt", tokenizer=str(path),
                                  eos_token="</s>"), seed=0)


def start(*args, cwd, cache_dir):
    # XLA's cheapest code generation (helpers.FAST_XLA): the runs compared compile alike.
    return start_cli(*args, cwd=cwd, PODKIT_CACHE=str(cache_dir), **fast_xla_env())


def cli(*args, cwd, cache_dir):
    (out,) = finish(start(*args, cwd=cwd, cache_dir=cache_dir))
    return out


def test_a_run_on_your_files_resumes_exactly_and_keeps_its_tokenizer(corpus, tmp_path):
    """8 steps straight, and 4 steps then a resume to 8 (a constant rate: a cosine would be
    sized by each run's train.steps): the same parameters bit for bit
    (the stream's position is restored, not replayed); eval reads the run."""
    where, docs = corpus
    sets = [f'data.files="{where}/*.txt,{where}/*.jsonl"', "data.vocab_size=300",
            "data.seq_len=16", "data.batch_size=8", "model.layers=1", "model.embed=32",
            "model.mlp=64", "model.heads=2", "model.sample_tokens=0",
            "train.steps_per_execution=2", "train.log_every=2", "train.eval_every=4",
            "train.eval_steps=2", "train.warmup_steps=0", "checkpoint.every_steps=4",
            f"run.dir={tmp_path}"]
    flags = lambda *more: [a for s in [*sets, *more] for a in ("--set", s)]
    config = str(ROOT / "configs" / "gpt_small.toml")
    cache_dir = tmp_path / "cache"
    out = cli("train", config, "--cpu-devices", "2", *flags("train.steps=4", "run.name=cut"),
              cwd=tmp_path, cache_dir=cache_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    # The straight run and the resume at once: compiled already (XLA's cache), they overlap.
    straight, out = finish(
        start("train", config, "--cpu-devices", "2", *flags("train.steps=8",
                                                            "run.name=straight"),
              cwd=tmp_path, cache_dir=cache_dir),
        start("train", config, "--cpu-devices", "2", *flags("train.steps=8", "run.name=cut"),
              cwd=tmp_path, cache_dir=cache_dir))
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resuming from checkpoint step 4" in out.stdout
    digest = lambda name: pk.checkpoint.CheckpointManager(tmp_path / name / "checkpoints"
                                                         ).digest()
    assert digest("straight") == digest("cut")
    cached = next(cache_dir.glob("text/files-*/tokenizer.json"))
    assert (tmp_path / "cut" / "tokenizer.json").read_text() == cached.read_text()
    lines = [json.loads(s) for s in
             (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if "loss" in r and "val_loss" not in r]
    assert steps == sorted(set(steps)) and steps[-1] == 8
    ev = cli("eval", str(tmp_path / "cut"), "--json", "--cpu-devices", "2", cwd=tmp_path,
             cache_dir=cache_dir)
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert json.loads(ev.stdout.strip().splitlines()[-1])["perplexity"] > 1
    # The files change: eval reads them with the run's tokenizer (no BPE trained again), and
    # a resume refuses, since its saved position counts in the old tokens.
    with open(where / "doc0.txt", "a") as f:
        f.write("\n# one more line\n")
    try:
        ev = cli("eval", str(tmp_path / "cut"), "--json", "--cpu-devices", "2", cwd=tmp_path,
                 cache_dir=cache_dir)
        assert ev.returncode == 0, ev.stderr[-2000:]
        assert {canonical(p.read_text()) for p in cache_dir.glob("text/files-*/tokenizer.json")
                } == {canonical((tmp_path / "cut" / "tokenizer.json").read_text())}
        more = cli("train", config, "--cpu-devices", "2", *flags("train.steps=12",
                                                                  "run.name=cut"),
                   cwd=tmp_path, cache_dir=cache_dir)
    finally:
        (where / "doc0.txt").write_text(docs[0])
    assert more.returncode != 0
    assert re.search(r"the data changed since step 8 was saved .*--init-from", more.stderr)
    # A new run from these weights reads the text with their tokenizer, not a new BPE; an
    # eval_steps beyond the validation batches is refused before training.
    tuned, many = finish(
        start("train", config, "--cpu-devices", "2", "--init-from", str(tmp_path / "cut"),
              *flags("train.steps=2", "run.name=tuned", "train.eval_every=2"), cwd=tmp_path,
              cache_dir=cache_dir),
        start("train", config, "--cpu-devices", "2",
              *flags("train.steps=4", "run.name=many", "train.eval_steps=100000"),
              cwd=tmp_path, cache_dir=cache_dir))
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "is read with its tokenizer" in tuned.stdout
    assert canonical((tmp_path / "tuned" / "tokenizer.json").read_text()) == canonical(
        (tmp_path / "cut" / "tokenizer.json").read_text())
    assert many.returncode == 2
    assert re.search(r"train.eval_steps = 100000, but the validation split holds \d+ batches",
                     many.stderr), many.stderr[-2000:]


def test_two_processes_train_on_your_files_as_one_does(corpus, tmp_path):
    """`podkit launch` of 2 processes x 1 device on the files, from an empty cache: one
    process builds the token file (the other waits on its lock and reads it), both train on
    the same windows, and the run ends with the parameters of 1 process x 2 devices."""
    where, _ = corpus
    sets = [f'data.files="{where}/*.txt"', "data.vocab_size=300", "data.seq_len=16",
            "data.batch_size=8", "model.layers=1", "model.embed=32", "model.mlp=64",
            "model.heads=2", "model.sample_tokens=0", "train.steps=4",
            "train.steps_per_execution=2", "train.warmup_steps=0", f"run.dir={tmp_path}"]
    flags = lambda *more: [a for s in [*sets, *more] for a in ("--set", s)]
    config = str(ROOT / "configs" / "gpt_small.toml")
    one, two = finish(  # at once: their own caches, their own runs
        start("train", config, "--cpu-devices", "2", *flags("run.name=one"), cwd=tmp_path,
              cache_dir=tmp_path / "cache_one"),
        start("launch", "--processes", "2", "--cpu-devices-per-process", "1", "--",
              sys.executable, "-m", "podkit.cli", "train", config, *flags("run.name=two"),
              cwd=tmp_path, cache_dir=tmp_path / "cache_two"))
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
    assert len(list((tmp_path / "cache_two").glob("text/files-*/tokens.bin"))) == 1
    # The same windows in the same order (the losses are equal), and the same parameters to
    # float tolerance (gloo sums across processes in another order than one process does).
    losses = lambda name: [(r["step"], r["loss"]) for r in map(json.loads, (
        tmp_path / name / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert losses("two") == losses("one") and losses("one")[-1][0] == 4
    weights = {name: pk.runs.named_weights(pk.models.from_run(tmp_path / name))
               for name in ("one", "two")}
    assert weights["one"].keys() == weights["two"].keys()
    # Adam divides each gradient by its own running RMS: where a gradient is near zero the
    # processes' other summation order moves its 4 updates by a few 1e-6 (seen: 3.6e-6).
    for key, value in weights["one"].items():
        np.testing.assert_allclose(weights["two"][key], value, rtol=1e-5, atol=1e-5)
    assert canonical((tmp_path / "two" / "tokenizer.json").read_text()) == canonical(
        (tmp_path / "one" / "tokenizer.json").read_text())
