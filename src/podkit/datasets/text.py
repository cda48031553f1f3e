"""Text every machine with Python has: the standard library's own source and docstrings.

`load_text(config)` reads the stdlib's `.py` files in sorted order (tests, idlelib, lib2to3 and
site-packages left out) up to `max_bytes`, trains a byte-level BPE on them with Hugging Face
`tokenizers` (`vocab_size` tokens; byte-level, so any text encodes), and cuts the token stream
into windows of `seq_len + 1`: inputs and next-token labels. A `validation_fraction` of the
windows, drawn at random (by the run's seed) from the whole text, is the validation set: the
stdlib's packages differ in style, so a tail cut would validate on one package only. Windows
share no tokens but their boundary one.

Tokenizing costs seconds, so the tokenizer and the token ids are cached under
`$PODKIT_CACHE` (default `~/.cache/podkit`), keyed by the files read (names, sizes), the
settings and the tokenizers version; files are written atomically, so processes of one job
that load at once never read half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from podkit.datasets.files import cache_dir
from podkit.errors import ConfigError

SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
             "__pycache__", "turtledemo", "ensurepip",
             "encodings"}  # generated codec tables: repetitive hex, not text


def stdlib_files(max_bytes: int) -> list[Path]:
    """The stdlib's .py files in sorted order, up to `max_bytes` in total."""
    root = Path(sysconfig.get_paths()["stdlib"])
    picked, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS.intersection(path.relative_to(root).parts[:-1]):
            continue
        size = path.stat().st_size
        if size == 0:
            continue
        picked.append(path)
        total += size
        if total >= max_bytes:
            break
    if not picked:
        raise ConfigError(f"no Python source found under {root} (sysconfig's stdlib path); "
                          "this machine's Python has no standard library sources.")
    return picked


def _write_atomic(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tokenize_stdlib(vocab_size: int, max_bytes: int) -> tuple[Any, np.ndarray]:
    """(tokenizer, token ids) of the stdlib text: from the cache, else trained and saved."""
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ConfigError(f"data.vocab_size = {vocab_size}; a byte-level BPE needs at least "
                          "257 tokens (256 bytes and one merge).")
    if vocab_size > 65535:
        raise ConfigError(f"data.vocab_size = {vocab_size}; at most 65535 (ids are stored as "
                          "uint16).")
    files = stdlib_files(max_bytes)
    key = hashlib.sha256(json.dumps({
        "files": [(str(p), p.stat().st_size) for p in files], "vocab_size": vocab_size,
        "max_bytes": max_bytes, "tokenizers": tokenizers.__version__, "format": 2,
    }).encode()).hexdigest()[:16]
    where = cache_dir() / key
    tok_path, ids_path = where / "tokenizer.json", where / "tokens.npy"
    if tok_path.is_file() and ids_path.is_file():
        return Tokenizer.from_file(str(tok_path)), np.load(ids_path)
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    encoded = tokenizer.encode_batch(texts)
    ids = np.concatenate([np.asarray(e.ids, np.uint16) for e in encoded])
    _write_atomic(tok_path, lambda f: f.write(tokenizer.to_str().encode()))
    _write_atomic(ids_path, lambda f: np.save(f, ids))
    return tokenizer, ids


def load_text(config: Any, seed: int = 0) -> Any:
    """`[data] name = "text"`: (x, y) int32 windows of `seq_len` tokens, y shifted by one."""
    from podkit.datasets.registry import Data

    if config.files:
        from podkit.datasets.files import load_files

        return load_files(config, seed)
    for key in ("validation_files",):
        if getattr(config, key):
            raise ConfigError(f"data.{key} is set but data.files is not; give data.files "
                              "(the training text) too.")
    tokenizer, ids = tokenize_stdlib(config.vocab_size, config.max_bytes)
    t = config.seq_len
    windows = (len(ids) - 1) // t
    n_val = int(round(windows * config.validation_fraction))
    if windows - n_val < config.batch_size:
        raise ConfigError(
            f"the text gives {windows} windows of data.seq_len = {t} tokens, "
            f"{windows - n_val} for training: fewer than one batch of "
            f"data.batch_size = {config.batch_size}. Raise data.max_bytes (now "
            f"{config.max_bytes}) or lower data.seq_len.")
    starts = np.arange(windows) * t
    rows = ids[starts[:, None] + np.arange(t + 1)[None]].astype(np.int32)
    x, y = rows[:, :-1], rows[:, 1:]
    order = np.random.default_rng(seed).permutation(windows)
    train, val = np.sort(order[n_val:]), np.sort(order[:n_val])
    info = {"vocab_size": tokenizer.get_vocab_size(), "seq_len": t, "tokenizer": tokenizer,
            "tokens": int(len(ids)), "prompt": tokenizer.encode("def ").ids,
            "encode": lambda s: tokenizer.encode(s).ids,
            "decode": lambda toks: tokenizer.decode(list(toks))}
    return Data((x[train], y[train]), (x[val], y[val]) if n_val else None, info)
