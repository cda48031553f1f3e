"""What a job runs when it is given a command (`-- python train.py ...`) instead of a config."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from podkit.errors import ConfigError

# Launchers in front of the script: the job is named after what they run, not after them.
LAUNCHERS = ("python", "python3", "env", "uv", "poetry", "run", "pipenv", "conda", "bash", "sh")


def script_name(command: Sequence[str]) -> str:
    """The name of the program a command runs: `python train.py`, `env python3 -u train.py`
    and `python -m pkg.train` give "train", `podkit train c.toml` gives "podkit"."""
    for i, word in enumerate(command):
        name = PurePath(word).name
        if word == "-m" and i + 1 < len(command):  # python -m pkg.train: "train"
            return command[i + 1].rpartition(".")[2]
        if word.startswith("-") or "=" in word:
            continue  # an interpreter's flag, or an env assignment
        if name.startswith("python") or name in LAUNCHERS:
            continue
        return PurePath(name).stem or name  # train.py, run.sh, torchrun
    words = [w for w in command if not w.startswith("-")]
    return PurePath(words[0]).stem if words else "job"


def check_counts(**flags: int | None) -> None:
    """Each given count (a flag's value, None when left out) is a whole number >= 1; the
    keyword is the flag's name with `_` for `-` (cpu_pods -> --cpu-pods)."""
    for name, value in flags.items():
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"--{name.replace('_', '-')} {value} must be a whole number >= 1.")
