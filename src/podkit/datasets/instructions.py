"""`[data] name = "instructions"`: supervised fine-tuning data, JSONL files of conversations
or prompt/completion pairs, with the loss on the replies only.

Each line of `files` is one example:

    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}
    {"prompt": "...", "completion": "..."}

`messages` are rendered by the tokenizer's chat template (tokenizer_config.json's
`chat_template` beside `tokenizer`, or `chat_template` = a .jinja file), and every assistant
reply's tokens (its end-of-turn marker included) are the ones learned; `prompt` and
`completion` are encoded as they are (the prompt with the tokenizer's special tokens, e.g.
its BOS), the completion followed by the end-of-text token, which is learned too.

The next-token labels of the other tokens are -100, the loss's `ignore_class` (Hugging Face's
convention): the run's loss is SparseCategoricalCrossentropy(ignore_class=-100), the mean over
the reply tokens of the batch. With `packing` (the default) examples are packed in order into
sequences of `seq_len` tokens: the model gets {"tokens", "positions", "segment_ids"}, each
example's positions restart at 0 and no token attends to another example's (splash
attention's segment ids on a TPU, a mask in XLA's attention). Without packing each example is
a sequence of its own, padded. An example longer than `seq_len + 1` tokens is cut (counted in
`info["truncated"]`); one left with no reply token is dropped (`info["dropped"]`).

The examples are read into memory (fine-tuning sets are thousands to a few hundred thousand
examples); `validation_files` are the validation set, else a `validation_fraction` of the
packed sequences drawn by the run's seed.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from podkit.datasets.chat import ChatTemplate, check_messages
from podkit.datasets.files import expand, jsonl_records, vocab_size
from podkit.errors import ConfigError, InputError

IGNORE = -100  # the label of a token that is not learned (the loss's ignore_class)


class Encoder:
    """Examples -> (token ids, learned) pairs with a tokenizer and its chat template."""

    def __init__(self, config: Any) -> None:
        from podkit.datasets import tokenizer_files

        if not config.tokenizer:
            raise ConfigError("[data] name = \"instructions\" needs data.tokenizer (the model's "
                              "tokenizer.json), or [model] init_from = a Hugging Face "
                              "directory, whose tokenizer it takes.")
        if not tokenizer_files.is_file(config.tokenizer):
            raise ConfigError(f"data.tokenizer = {config.tokenizer!r}: no such file (give the "
                              "model's tokenizer.json).")
        self.tokenizer = tokenizer_files.load(config.tokenizer)
        self.template = ChatTemplate.beside(config.tokenizer, config.chat_template)
        eos = config.eos_token or (self.template.eos_token if self.template else None)
        self.eos_token = eos or None
        self.eos_id = self.tokenizer.token_to_id(eos) if eos else None
        if eos and self.eos_id is None:
            raise ConfigError(f"the end-of-text token {eos!r} (data.eos_token, or "
                              "tokenizer_config.json's eos_token) is not in the tokenizer; set "
                              "data.eos_token to its end-of-text token.")

    def encode(self, record: Any, where: str) -> tuple[list[int], list[bool]]:
        if not isinstance(record, dict):
            raise InputError(f"{where} is a {type(record).__name__}; each line is an object "
                             "with 'messages', or 'prompt' and 'completion'.")
        if "messages" in record:
            return self._conversation(check_messages(record["messages"], where), where)
        if "prompt" in record and "completion" in record:
            return self._completion(record["prompt"], record["completion"], where)
        raise ConfigError(f"{where} has the keys {sorted(record)}; an example has 'messages' "
                          "(a conversation) or 'prompt' and 'completion'.")

    def _conversation(self, messages: list[dict], where: str) -> tuple[list[int], list[bool]]:
        if self.template is None:
            raise ConfigError(f"{where} is a conversation ('messages') but the tokenizer has "
                              "no chat template (no chat_template in the tokenizer_config.json "
                              "beside data.tokenizer): set data.chat_template to a .jinja "
                              "file, or give prompt/completion records.")
        text, spans = self.template.assistant_spans(messages)
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        learned = [any(a <= start < b for a, b in spans) and end > start
                   for start, end in encoding.offsets]
        return encoding.ids, learned

    def _completion(self, prompt: Any, completion: Any, where: str
                    ) -> tuple[list[int], list[bool]]:
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise InputError(f"{where}: 'prompt' and 'completion' must be text.")
        head = self.tokenizer.encode(prompt).ids  # with the tokenizer's BOS, if it adds one
        tail = self.tokenizer.encode(completion, add_special_tokens=False).ids
        if self.eos_id is not None:
            tail = tail + [self.eos_id]
        return head + tail, [False] * len(head) + [True] * len(tail)


def sequences(examples: list[tuple[list[int], list[bool]]], seq_len: int, packing: bool,
              pad_id: int) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """(x, labels, examples cut): the examples as rows of `seq_len` inputs and next-token
    labels, packed in order (or one per row), with positions and segment ids (0: padding)."""
    rows: list[list[tuple[np.ndarray, np.ndarray]]] = [[]]
    used, cut = 0, 0
    for ids, learned in examples:
        if len(ids) > seq_len + 1:
            ids, learned, cut = ids[:seq_len + 1], learned[:seq_len + 1], cut + 1
        tokens = np.asarray(ids, np.int32)
        labels = np.where(np.asarray(learned[1:], bool), tokens[1:], IGNORE).astype(np.int32)
        length = len(tokens) - 1
        if rows[-1] and (not packing or used + length > seq_len):
            rows.append([])
            used = 0
        rows[-1].append((tokens[:-1], labels))
        used += length
    n = len(rows)
    x = {"tokens": np.full((n, seq_len), pad_id, np.int32),
         "positions": np.zeros((n, seq_len), np.int32),
         "segment_ids": np.zeros((n, seq_len), np.int32)}
    y = np.full((n, seq_len), IGNORE, np.int32)
    for r, row in enumerate(rows):
        at = 0
        for segment, (tokens, labels) in enumerate(row, 1):
            span = slice(at, at + len(tokens))
            x["tokens"][r, span], y[r, span] = tokens, labels
            x["positions"][r, span] = np.arange(len(tokens))
            x["segment_ids"][r, span] = segment
            at += len(tokens)
    return x, y, cut


def _read(encoder: Encoder, files: list[str]) -> tuple[list, int]:
    """The examples of `files` that keep a learned token once cut, and how many did not."""
    examples, dropped = [], 0
    for path in files:
        for where, record in jsonl_records(path):
            ids, learned = encoder.encode(record, where)
            if len(ids) < 2 or not any(learned[1:]):
                dropped += 1
                continue
            examples.append((ids, learned))
    return examples, dropped


def load_instructions(config: Any, seed: int = 0) -> Any:
    """The Data of an `[data] name = "instructions"` section (the module docstring)."""
    from podkit.datasets.registry import Data, check_ints

    check_ints(config, {"batch_size": 1, "seq_len": 2})
    if not config.files:
        raise ConfigError("[data] name = \"instructions\" needs data.files: JSONL files of "
                          "{\"messages\": [...]} or {\"prompt\": ..., \"completion\": ...} lines.")
    encoder = Encoder(config)
    files = expand(config.files, "files")
    examples, dropped = _read(encoder, files)
    # Long examples: cut to the context; one whose replies all lie past it teaches nothing.
    kept = [(ids, learned) for ids, learned in examples if any(learned[1:config.seq_len + 1])]
    dropped += len(examples) - len(kept)
    if not kept:
        raise ConfigError(f"data.files = {config.files!r} hold no example with a reply token "
                          f"in its first data.seq_len + 1 = {config.seq_len + 1} tokens.")
    pad = encoder.eos_id if encoder.eos_id is not None else 0
    x, y, cut = sequences(kept, config.seq_len, config.packing, pad)
    if config.validation_files:
        val_examples, _ = _read(encoder, expand(config.validation_files, "validation_files"))
        if not val_examples:
            raise ConfigError(f"data.validation_files = {config.validation_files!r} hold no "
                              "example with a reply token.")
        vx, vy, _ = sequences(val_examples, config.seq_len, config.packing, pad)
        train, val = (x, y), (vx, vy)
    else:
        if not 0.0 <= config.validation_fraction < 1.0:
            raise ConfigError(f"data.validation_fraction = {config.validation_fraction!r}; use "
                              "a number in [0, 1).")
        rows = len(y)
        n_val = int(round(rows * config.validation_fraction))
        order = np.random.default_rng(seed).permutation(rows)
        take = lambda ids: ({k: v[np.sort(ids)] for k, v in x.items()}, y[np.sort(ids)])
        train, val = take(order[n_val:]), (take(order[:n_val]) if n_val else None)
    if len(train[1]) < config.batch_size:
        raise ConfigError(
            f"data.files = {config.files!r} give {len(kept)} examples in {len(train[1])} "
            f"training sequences of data.seq_len = {config.seq_len}, fewer than one batch of "
            f"data.batch_size = {config.batch_size}. Add examples, or lower data.batch_size.")
    if val is not None and len(val[1]) < config.batch_size:
        raise ConfigError(
            f"the validation set holds {len(val[1])} sequences, fewer than one batch of "
            f"data.batch_size = {config.batch_size}: raise data.validation_fraction, add "
            "validation examples, or set data.validation_fraction = 0.")
    if not config.packing:
        train = (train[0]["tokens"], train[1])
        val = (val[0]["tokens"], val[1]) if val is not None else None
    if cut or dropped:
        warnings.warn(f"podkit: of {len(kept) + dropped} instruction examples, {cut} are "
                      f"longer than data.seq_len + 1 = {config.seq_len + 1} tokens and were "
                      f"cut, and {dropped} had no reply token within them and were left out.",
                      stacklevel=3)
    tokenizer = encoder.tokenizer
    learned = int((train[1] != IGNORE).sum())
    info: dict[str, Any] = {
        "vocab_size": vocab_size(tokenizer), "seq_len": config.seq_len,
        "ignore_class": IGNORE, "packed": bool(config.packing), "examples": len(kept),
        "dropped": dropped, "truncated": cut,
        "learned_tokens": learned, "tokenizer": tokenizer, "prompt": None,
        "encode": lambda s: tokenizer.encode(s, add_special_tokens=False).ids,
        "decode": lambda toks: tokenizer.decode(list(toks))}
    if encoder.template is not None:
        info["chat_template"] = encoder.template.source
    if encoder.eos_token:
        info["eos_token"] = encoder.eos_token
    for key in ("bos_token",):
        value = getattr(encoder.template, key, None) if encoder.template else None
        if value:
            info[key] = value
    return Data(train, val, info)
