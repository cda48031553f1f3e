"""A tokenizer's files (tokenizer.json, tokenizer_config.json, chat_template.jinja) wherever
they are: a local path, gs:// or s3://, read through podkit.paths.

A Hugging Face directory on object storage keeps them beside its weights; the readers here
take the path as the user wrote it (a URL stays a URL in the run's config, so a resume reads
the same place), read the bytes through the path layer and hand `tokenizers` the text
(`Tokenizer.from_str`): nothing is downloaded to a temporary file that a config could name.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any

from podkit import paths
from podkit.errors import ConfigError, StorageError


def beside(path: str | os.PathLike, name: str) -> str:
    """The file `name` in the directory holding `path` (a URL's parent by '/')."""
    path = os.fspath(path)
    if paths.is_url(path):
        return posixpath.join(path.rstrip("/").rpartition("/")[0], name)
    return str(Path(path).parent / name)


def is_file(path: str | os.PathLike) -> bool:
    """Whether a file is there (a storage failure other than nothing there is raised)."""
    if not paths.is_url(path):
        return os.path.isfile(os.fspath(path))
    try:
        paths.stat(path)
        return True
    except StorageError as e:
        if e.missing:
            return False
        raise


def read_bytes(path: str | os.PathLike) -> bytes:
    with paths.open(path, "rb") as f:
        return f.read()


def read_text(path: str | os.PathLike) -> str:
    """The file's text as it is (UTF-8; no newline translation)."""
    return read_bytes(path).decode("utf-8")


def load(path: str | os.PathLike, what: str = "data.tokenizer") -> Any:
    """The `tokenizers.Tokenizer` of a tokenizer.json; one that is not a tokenizer.json is a
    ConfigError naming `what` and the path (the Rust error names neither)."""
    from tokenizers import Tokenizer

    text = read_text(path)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:
        raise ConfigError(f"{what} = {os.fspath(path)!r} is not a Hugging Face tokenizer.json "
                          f"({e}).") from None
