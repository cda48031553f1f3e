"""The typed config tree of a training job: dataclasses, loaded from TOML, validated on load.

Unknown sections or keys, wrong types and values outside a field's choices are errors that name
the key and the allowed values. `--set section.key=value` overrides use the same checks.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from podkit.errors import ConfigError


def _choice(default: Any, choices: tuple) -> Any:
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {
        "default": default
    }
    return dataclasses.field(metadata={"choices": choices}, **kw)


@dataclasses.dataclass
class RunConfig:
    name: str = "run"
    dir: str = "runs"
    seed: int = 0


@dataclasses.dataclass
class DataConfig:
    name: str = _choice("digits", ("digits",))
    batch_size: int = 32
    validation_fraction: float = 0.2


@dataclasses.dataclass
class ModelConfig:
    name: str = _choice("mlp", ("mlp",))
    hidden: list[int] = dataclasses.field(default_factory=lambda: [128])
    activation: str = "relu"
    dropout: float = 0.0
    outputs: int = 10
    output_activation: str = "softmax"


@dataclasses.dataclass
class TrainConfig:
    epochs: int = 10
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    loss: str = "sparse_categorical_crossentropy"
    from_logits: bool = False  # the model's last layer gives logits (output_activation linear)
    metrics: list[str] = dataclasses.field(default_factory=lambda: ["accuracy"])
    steps_per_execution: int = 1
    log_every: int = 10
    verbose: int = 1


@dataclasses.dataclass
class StrategyConfig:
    mesh: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": -1})


@dataclasses.dataclass
class CheckpointConfig:
    """`[checkpoint]`: where and when the run saves. The run resumes from the newest valid
    checkpoint in `dir` (default RUN_DIR/checkpoints), else from --resume, else starts fresh.
    0 means "not by this criterion"; with neither every_* set, a save ends every epoch."""

    enabled: bool = True
    dir: str = ""
    every_steps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    keep_every: int = 0
    async_save: bool = True
    on_nan: str = _choice("stop", ("none", "stop", "rollback"))


@dataclasses.dataclass
class Config:
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    strategy: StrategyConfig = dataclasses.field(default_factory=StrategyConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)


def _check_value(where: str, value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ConfigError(
                f"{where} = {value!r} should be of type {hint.__name__}, not "
                f"{type(value).__name__}."
            )
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{where} = {value!r} should be a list of {item.__name__}.")
        return [_check_value(f"{where}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} = {value!r} should be a table of {item.__name__}.")
        return {k: _check_value(f"{where}.{k}", v, item) for k, v in value.items()}
    if origin in (types.UnionType, typing.Union):
        raise ConfigError(f"{where}: unsupported config type {hint}.")
    return value


def _build(cls: type, table: dict, where: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"[{where}] should be a table, got {table!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in table.items():
        if key not in fields:
            scope = f" in [{where}]" if where else ""
            raise ConfigError(
                f"unknown key {key!r}{scope}; allowed keys{scope}: {', '.join(fields)}."
            )
        hint = hints[key]
        name = f"{where}.{key}" if where else key
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, name)
            continue
        value = _check_value(name, value, hint)
        choices = fields[key].metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(f"{name} = {value!r}; allowed values: {', '.join(choices)}.")
        kwargs[key] = value
    return cls(**kwargs)


def from_dict(table: dict) -> Config:
    config = _build(Config, table, "")
    validate(config)
    return config


def validate(config: Config) -> None:
    """Checks that span fields or need ranges; types were checked on load."""
    positive = {
        "data.batch_size": config.data.batch_size,
        "model.outputs": config.model.outputs,
        "train.epochs": config.train.epochs,
        "train.steps_per_execution": config.train.steps_per_execution,
        "train.log_every": config.train.log_every,
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name} = {value}; it must be >= 1.")
    if not 0.0 <= config.data.validation_fraction < 1.0:
        raise ConfigError(
            f"data.validation_fraction = {config.data.validation_fraction}; use [0, 1)."
        )
    if not 0.0 <= config.model.dropout < 1.0:
        raise ConfigError(f"model.dropout = {config.model.dropout}; use [0, 1).")
    c = config.checkpoint
    for name, value in (("every_steps", c.every_steps), ("every_seconds", c.every_seconds),
                        ("keep_every", c.keep_every)):
        if value < 0:
            raise ConfigError(f"checkpoint.{name} = {value}; use 0 (off) or a positive value.")
    if c.keep < 1:
        raise ConfigError(f"checkpoint.keep = {c.keep}; keep at least 1 checkpoint.")
    if c.on_nan == "rollback" and not c.enabled:
        raise ConfigError("checkpoint.on_nan = 'rollback' needs checkpoint.enabled = true.")
    if config.train.learning_rate <= 0:
        raise ConfigError(f"train.learning_rate = {config.train.learning_rate}; must be > 0.")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'section.key=value' -> (['section', 'key'], value); value is read as TOML when it can be
    (numbers, booleans, lists, quoted strings), else as a bare string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r} is not section.key=value; e.g. --set train.epochs=3.")
    path, raw = text.split("=", 1)
    keys = [k.strip() for k in path.split(".")]
    if not all(keys):
        raise ConfigError(f"--set {text!r}: the key {path!r} has an empty part.")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return keys, value


def load(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read a TOML config, apply `section.key=value` overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass a TOML file path.")
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}.") from None
    for text in overrides:
        keys, value = parse_override(text)
        node = table
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {key!r} is a value, not a section.")
        node[keys[-1]] = value
    return from_dict(table)


def to_toml(config: Config) -> str:
    """The resolved config as TOML (what the run dir keeps)."""
    lines = []
    for section in dataclasses.fields(config):
        lines.append(f"[{section.name}]")
        for key, value in dataclasses.asdict(getattr(config, section.name)).items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"cannot write {value!r} as TOML.")
