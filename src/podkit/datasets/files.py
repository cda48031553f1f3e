"""Your own text for a language model: `[data] name = "text"` with `files = "glob"`.

The documents are read as a stream (a text file in blocks of about a MiB, cut at a line end,
or at a space in a file without line ends; JSONL line by line, so one record is the most held
at once; ArrayRecord record by record: no file is read whole, at construction or after), tokenized
in batches, and written once to a token file (`tokens.bin`, uint16 or uint32) in the cache
(`$PODKIT_CACHE/text/files-KEY`, keyed by the files' names, sizes and times and the
settings), as nanoGPT's and MaxText's preprocessing do. Training then reads windows of
`seq_len + 1` tokens from that file memory-mapped: a pk.data Dataset of random access, so
its order is a seeded permutation and a resume continues from the saved position at once,
on any number of devices.

Documents are packed back to back with the end-of-text token between them (GPT-2's and
nanoGPT's packing): a window may span a boundary, and the token after `eos_token` is the
next document's first. Attention is not masked at the boundary (see docs/runs.md).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from podkit import paths
from podkit.errors import ConfigError, InputError

BLOCK_CHARS = 1 << 20  # a text file is tokenized in blocks of about this many characters
ENCODE_BATCH = 16  # blocks per encode_batch call (the Rust tokenizer encodes them on threads)
ENDINGS = {".jsonl": "jsonl", ".json": "jsonl", ".array_record": "arrayrecord",
           ".arrayrecord": "arrayrecord"}


def cache_dir() -> Path:
    """Where tokenized text is kept: `$PODKIT_CACHE/text` (default ~/.cache/podkit/text)."""
    return paths.cache_root() / "text"


def file_format(path: str, fmt: str) -> str:
    """The format of one file: as configured, or by its ending ("text" otherwise)."""
    if fmt != "auto":
        return fmt
    name = os.path.basename(path).lower()  # a folder named x.jsonl/ says nothing of its files
    for ending, found in ENDINGS.items():
        if name.endswith(ending) or f"{ending}-" in name:  # shards: x.array_record-00000-of-4
            return found
    return "text"


def expand(pattern: str, key: str) -> list[str]:
    """`data.files` (a glob, or several separated by commas) -> the files, in order."""
    from podkit.data.sources import expand_files

    patterns = [p.strip() for p in pattern.split(",") if p.strip()]
    try:
        return expand_files(patterns, f"data.{key}")
    except InputError as e:
        raise ConfigError(f"{e} data.{key} = {pattern!r}.") from None


def blocks(files: list[str], fmt: str, field: str) -> Iterator[tuple[Any, bool]]:
    """(text or token ids, ends a document) for every block of every file, streamed."""
    for path in files:
        kind = file_format(path, fmt)
        if kind == "text":
            yield from _text_blocks(path)
        elif kind == "jsonl":
            yield from _jsonl_documents(path, field)
        else:
            yield from _array_record_documents(path)


def _text_blocks(path: str) -> Iterator[tuple[str, bool]]:
    """A text file is one document, read in blocks of at most about BLOCK_CHARS characters,
    each cut after its last line end (or, in a file without line ends, its last space), so a
    cut never splits a line the tokenizer would have kept whole."""
    with paths.open(path, "r", newline="") as f:  # local, gs:// or s3://
        carry = ""
        while chunk := _read_utf8(f, path):
            text = carry + chunk
            # (before the space: a byte-level BPE joins a space to the word after it)
            cut = text.rfind("\n") + 1 or max(text.rfind(" "), 0) or len(text)
            carry = text[cut:]
            if cut:
                yield text[:cut], False
        yield carry, True


def _read_utf8(f: Any, path: str) -> str:
    try:
        return f.read(BLOCK_CHARS)
    except UnicodeDecodeError as e:  # never replaced silently: the model would learn U+FFFD
        raise InputError(f"{path} is not UTF-8 ({e.reason}: byte "
                         f"{e.object[e.start:e.start + 1]!r}); re-encode it, e.g. "
                         f"`iconv -f latin1 -t utf-8 {path} > {path}.utf8`.") from None


def jsonl_records(path: str) -> Iterator[tuple[str, Any]]:
    """("FILE:LINE", record) for each non-empty line of a JSONL file; a line that is not
    UTF-8 or not JSON is an InputError naming it."""
    with paths.open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{number} is not UTF-8 ({e.reason} at byte "
                                 f"{e.start} of the line); JSON text is UTF-8.") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{number} is not JSON ({e.msg}); a JSONL file holds "
                                 "one JSON object per line.") from None
            yield f"{path}:{number}", record


def _jsonl_documents(path: str, field: str) -> Iterator[tuple[str, bool]]:
    for where, record in jsonl_records(path):
        if not isinstance(record, dict) or field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ConfigError(f"{where} has no field {field!r} (it has {keys}); set "
                              "data.field to the key that holds the text.")
        text = record[field]
        if not isinstance(text, str):
            raise InputError(f"{where}: field {field!r} is a {type(text).__name__}, not text.")
        yield text, True


def _array_record_documents(path: str) -> Iterator[tuple[np.ndarray, bool]]:
    from podkit.data.sources import ArrayRecords

    records = ArrayRecords([path])
    for i in range(len(records)):
        record = records[i]
        if len(record) % 4:
            raise InputError(f"{path}: record {i} has {len(record)} bytes, not a whole number "
                             "of int32 token ids; write each document's ids as "
                             "np.asarray(ids, np.int32).tobytes().")
        yield np.frombuffer(record, "<i4"), True


def _fingerprint(files: list[str]) -> list:
    out = []
    for path in files:
        if paths.is_url(path):  # its size and ETag or generation
            entry = paths.stat(path)
            out.append((path, entry.size, entry.version))
        else:
            st = os.stat(path)
            out.append((os.path.abspath(path), st.st_size, st.st_mtime_ns))
    return out


def _token_ids(config: Any, files: list[str]) -> bool:
    """True when the files hold token ids (ArrayRecord), False for text; never a mix (the
    training and validation files together)."""
    kinds = {file_format(p, config.format) == "arrayrecord" for p in files}
    if len(kinds) > 1:
        keys = "data.files and data.validation_files" if config.validation_files else \
            f"data.files = {config.files!r}"
        raise ConfigError(f"{keys} mix ArrayRecord token ids with text; use one kind per "
                          "run.")
    return kinds.pop()


def tokenizer_path(config: Any) -> str:
    """data.tokenizer, checked to be a file (local, gs:// or s3://)."""
    from podkit.datasets import tokenizer_files

    if not tokenizer_files.is_file(config.tokenizer):
        raise ConfigError(f"data.tokenizer = {config.tokenizer!r} is not a file; give a "
                          "Hugging Face tokenizer.json, or \"train\" to train a BPE on "
                          "data.files.")
    return config.tokenizer


def tokenizer_for(config: Any, files: list[str]) -> Any:
    """The run's tokenizer: a Hugging Face tokenizer.json, or a byte-level BPE trained on the
    files (streamed through the trainer), with `eos_token` among its special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if config.tokenizer != "train":
        from podkit.datasets import tokenizer_files

        return tokenizer_files.load(tokenizer_path(config))
    if not 257 <= config.vocab_size <= 1 << 20:
        raise ConfigError(f"data.vocab_size = {config.vocab_size}; a byte-level BPE needs at "
                          "least 257 tokens (256 bytes and one merge).")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = [config.eos_token] if config.eos_token else []
    trainer = trainers.BpeTrainer(vocab_size=config.vocab_size, show_progress=False,
                                  special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((text for text, _ in blocks(files, config.format,
                                                              config.field)), trainer=trainer)
    return tokenizer


def eos_id(config: Any, tokenizer: Any) -> int | None:
    """The id put between documents (None: `eos_token = ""`, documents simply follow)."""
    if not config.eos_token:
        return None
    found = tokenizer.token_to_id(config.eos_token)
    if found is None:
        specials = sorted(t for t in tokenizer.get_vocab()
                          if len(t) > 2 and t[0] + t[-1] in ("<>", "[]"))[:8]
        raise ConfigError(f"data.eos_token = {config.eos_token!r} is not in the tokenizer "
                          f"{config.tokenizer!r}; set it to its end-of-text token (it has "
                          f"e.g. {specials}), or to \"\" for no separator.")
    return found


def vocab_size(tokenizer: Any) -> int:
    """Ids the model's embedding must hold: the largest id the tokenizer can give, plus one
    (a tokenizer.json's ids may leave holes, so its vocabulary's length can be smaller)."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def write_tokens(path: Path, pieces: Iterator[np.ndarray], dtype: Any, vocab: int,
                 ) -> tuple[int, str]:
    """Append every piece of ids to `path` (written aside, renamed when whole); the count and
    a digest of the ids (what a resume compares: the same stream of tokens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    count, digest = 0, hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            for ids in pieces:
                if len(ids) and (ids.min() < 0 or ids.max() >= vocab):
                    raise ConfigError(f"a document holds token ids in [{int(ids.min())}, "
                                      f"{int(ids.max())}]: outside [0, data.vocab_size = "
                                      f"{vocab}); set data.vocab_size above the largest id.")
                raw = np.asarray(ids, dtype).tobytes()
                f.write(raw)
                digest.update(raw)
                count += len(ids)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return count, digest.hexdigest()[:32]


def _encoded(config: Any, files: list[str], tokenizer: Any, eos: int | None,
             ) -> Iterator[np.ndarray]:
    """The files' ids, block by block, `eos` after each document."""
    tail = np.asarray([] if eos is None else [eos], np.int64)
    pending: list[tuple[Any, bool]] = []

    def flush() -> Iterator[np.ndarray]:
        texts = [b for b, _ in pending]
        encoded = (tokenizer.encode_batch(texts, add_special_tokens=False) if tokenizer
                   else None)
        for i, (block, ends) in enumerate(pending):
            ids = (np.asarray(encoded[i].ids, np.int64) if encoded is not None
                   else block.astype(np.int64))
            yield np.concatenate([ids, tail]) if ends else ids
        pending.clear()

    for item in blocks(files, config.format, config.field):
        pending.append(item)
        if len(pending) >= ENCODE_BATCH:
            yield from flush()
    yield from flush()


def token_file(config: Any, files: list[str], tokenizer: Any = None,
               ) -> tuple[Path, Any, int]:
    """(tokens.bin, tokenizer or None, vocabulary size) of `files`: from the cache, or
    streamed through the tokenizer once and written there. `tokenizer` (a `tokenizers`
    Tokenizer): encode with it instead of the one `data.tokenizer` names or trains (the
    training files' tokenizer for the validation files)."""
    import tokenizers

    ids_only = _token_ids(config, files)
    if ids_only and config.tokenizer != "train":
        raise ConfigError(f"data.tokenizer = {config.tokenizer!r}, but data.files hold "
                          "ArrayRecord token ids, which are used as they are; drop "
                          "data.tokenizer (or give text files to tokenize).")
    if ids_only:
        tok_digest, tokenizer = None, None
    elif tokenizer is not None:
        tok_digest = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()
    elif config.tokenizer != "train":
        from podkit.datasets import tokenizer_files

        tok_digest = hashlib.sha256(tokenizer_files.read_bytes(
            tokenizer_path(config))).hexdigest()
    else:
        tok_digest = "train"  # trained on these very files: keyed by them
    settings = {"files": _fingerprint(files), "format": config.format, "field": config.field,
                "tokenizer": tok_digest, "eos": config.eos_token, "ids": ids_only,
                "vocab_size": config.vocab_size if ids_only or tok_digest == "train"
                else None, "tokenizers": tokenizers.__version__, "version": 2}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    where = cache_dir() / f"files-{key}"
    where.mkdir(parents=True, exist_ok=True)
    # One process builds the cache; the others of a job (and other jobs on these files)
    # wait on the lock and then read what it wrote.
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _build(config, files, where, settings, ids_only, tokenizer)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(config: Any, files: list[str], where: Path, settings: dict, ids_only: bool,
           tokenizer: Any) -> tuple[Path, Any, int]:
    import tokenizers

    meta_path, tok_path, ids_path = where / "meta.json", where / "tokenizer.json", \
        where / "tokens.bin"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        tokenizer = None if ids_only else tokenizers.Tokenizer.from_file(str(tok_path))
        return ids_path, tokenizer, meta["vocab_size"]
    if ids_only:
        vocab, eos = config.vocab_size, None
    else:
        tokenizer = tokenizer or tokenizer_for(config, files)
        vocab = vocab_size(tokenizer)
        eos = eos_id(config, tokenizer)
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32
    count, digest = write_tokens(ids_path, _encoded(config, files, tokenizer, eos), dtype, vocab)
    if tokenizer is not None:
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tokenizer.")
        os.close(fd)
        tokenizer.save(tmp)
        os.replace(tmp, tok_path)
    meta = {"tokens": count, "digest": digest, "vocab_size": vocab,
            "dtype": np.dtype(dtype).name, "settings": settings}
    fd, tmp = tempfile.mkstemp(dir=where, prefix=".meta.")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(meta, indent=2))
    os.replace(tmp, meta_path)  # written last: its presence says the rest is whole
    return ids_path, tokenizer, vocab


class Windows:
    """Windows of `seq_len + 1` tokens of a token file, memory-mapped on first use (so the
    source pickles as its path, for input workers): item i is (x, y), int32, y one ahead."""

    def __init__(self, path: Path, dtype: str, seq_len: int, starts: np.ndarray) -> None:
        self.path, self.dtype, self.seq_len, self.starts = str(path), dtype, seq_len, starts
        self._tokens: np.ndarray | None = None

    def _map(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s = int(self.starts[i])
        row = np.asarray(self._map()[s:s + self.seq_len + 1], np.int32)
        return row[:-1], row[1:]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}


def token_meta(path: Path) -> dict:
    """What the cache says of a token file: tokens, digest, vocab_size, dtype, settings."""
    return json.loads((path.parent / "meta.json").read_text())


def windows(path: Path, seq_len: int) -> tuple[Windows, int]:
    """Every window of a token file (they share only their boundary token), and the token
    count."""
    meta = token_meta(path)
    n = int(meta["tokens"])
    count = max((n - 1) // seq_len, 0)
    return Windows(path, meta["dtype"], seq_len, np.arange(count, dtype=np.int64) * seq_len), n


def load_files(config: Any, seed: int = 0) -> Any:
    """`[data] name = "text"` with `files`: a pk.data Dataset of batches of windows for
    training (shuffled by the seed, repeated: one stream the run's steps walk through) and
    one for validation (in order), with the tokenizer in `info`."""
    from podkit import data
    from podkit.datasets.registry import Data

    t, b = config.seq_len, config.batch_size
    files = expand(config.files, "files")
    val_files = expand(config.validation_files, "validation_files") \
        if config.validation_files else []
    _token_ids(config, files + val_files)  # one kind of file for both
    path, tokenizer, vocab = token_file(config, files)
    every, tokens = windows(path, t)
    if val_files:
        # Encoded by the training files' tokenizer (a trained one is not trained again on
        # the validation files); validation_fraction does not apply.
        val_path, _, _ = token_file(config, val_files, tokenizer)
        train, val = every, windows(val_path, t)[0]
        if len(val) == 0:
            raise ConfigError(
                f"data.validation_files = {config.validation_files!r} hold fewer than "
                f"data.seq_len + 1 = {t + 1} tokens: no validation window. Add text, or "
                "drop data.validation_files (data.validation_fraction then holds windows "
                "out of data.files).")
    else:
        if not 0.0 <= config.validation_fraction < 1.0:
            raise ConfigError(f"data.validation_fraction = {config.validation_fraction!r}; use "
                              "a number in [0, 1).")
        n_val = int(round(len(every) * config.validation_fraction))
        order = np.random.default_rng(seed).permutation(len(every))
        pick = lambda ids: Windows(path, every.dtype, t, every.starts[np.sort(ids)])
        train, val = pick(order[n_val:]), (pick(order[:n_val]) if n_val else None)
    if len(train) < b:
        raise ConfigError(
            f"data.files = {config.files!r} gives {tokens:,} tokens: {len(train)} training "
            f"windows of data.seq_len = {t}, fewer than one batch of data.batch_size = {b}. "
            "Add files, or lower data.seq_len or data.batch_size.")
    wanted = bool(val_files) or config.validation_fraction > 0
    if wanted and (val is None or len(val) < b):
        where = (f"data.validation_files = {config.validation_files!r}" if val_files else
                 f"data.validation_fraction = {config.validation_fraction} of {len(every)} "
                 "windows")
        raise ConfigError(
            f"{where} gives {0 if val is None else len(val)} validation windows of "
            f"data.seq_len = {t}: fewer than one batch of data.batch_size = {b}. Raise "
            "data.validation_fraction (or add validation text), or set data.validation_fraction "
            "= 0 for no validation.")
    train_ds = (data.Dataset.from_sequence(train).shuffle(len(train), seed=seed)
                .batch(b, drop_remainder=True).repeat())
    # Whole batches only (a last partial batch would not divide over the devices): the
    # validation set is its first len(val) // b * b windows.
    val_ds = (data.Dataset.from_sequence(val).batch(b, drop_remainder=True)
              if val is not None else None)
    # token_digest: a resume compares it with the run's, so the data position it restores
    # counts in the same tokens.
    info: dict[str, Any] = {"vocab_size": vocab, "seq_len": t, "tokens": tokens,
                            "files": len(files),
                            "validation_batches": len(val) // b if val is not None else 0,
                            "token_digest": token_meta(path)["digest"]}
    if tokenizer is not None:
        eos = eos_id(config, tokenizer)
        info.update(tokenizer=tokenizer, prompt=[eos] if eos is not None else None,
                    encode=lambda s: tokenizer.encode(s, add_special_tokens=False).ids,
                    decode=lambda toks: tokenizer.decode(list(toks)))
    return Data(train_ds, val_ds, info, rows=len(train))
