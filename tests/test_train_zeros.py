"""Every `[train]` number a user writes is the number used (issue 50: `weight_decay = 0.0`
trained with AdamW's 0.004 through an `or`). Each numeric field of TrainConfig is set to 0:
either the config refuses it naming the field, or the 0 survives config.toml and reaches what
uses it: the optimizer, the schedule, the run's length, fit()'s arguments, with the meaning
docs/runs.md gives 0. A field added without a row here fails the walk."""

import dataclasses
import json
import tomllib
import typing
from pathlib import Path

import pytest

import podkit as pk
from helpers import fast_xla_env, finish, start_cli
from podkit import config as config_lib
from podkit import runs
from podkit.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def _numeric(field: dataclasses.Field) -> bool:
    hint = typing.get_type_hints(TrainConfig)[field.name]
    kinds = set(typing.get_args(hint)) or {hint}
    return bool(kinds & {int, float}) and bool not in kinds


NUMERIC = [f.name for f in dataclasses.fields(TrainConfig) if _numeric(f)]

# 0 is not a value of these: the config says so, naming the field.
REFUSED = {"epochs", "steps_per_execution", "log_every", "microbatches", "adam_epsilon",
           "learning_rate"}


def _config(**train):
    base = {"optimizer": "adamw", "steps": 10, "schedule": "cosine"}
    return config_lib.from_dict({"train": {**base, **train}})


def _optimizer(config, total=10):
    return runs.optimizer_from_config(config.train, total)


def _rate(optimizer, step):
    lr = optimizer._learning_rate
    return float(lr(step)) if callable(lr) else float(lr)


# What uses each field, and what it must see when the field is 0.
def _alpha(c):
    assert _rate(_optimizer(c), 10) == 0.0  # decays to 0 x learning_rate
    assert _rate(_optimizer(c), 0) == pytest.approx(1e-3)


def _beta(name, attr):
    def check(c):
        assert getattr(_optimizer(c), attr) == 0.0
    return check


def _weight_decay(c):
    assert _optimizer(c).weight_decay == 0.0  # not AdamW's default 0.004


def _global_clipnorm(c):
    assert _optimizer(c).global_clipnorm == 0.0  # Keras: 0 is no clipping


def _warmup_steps(c):
    opt = _optimizer(c)
    assert _rate(opt, 0) == pytest.approx(1e-3)  # no warmup: the full rate at once


def _steps(c):
    length = runs.run_length(c.train, rows=100, batch_size=10)
    assert length.total == c.train.epochs * 10  # 0 steps: the run is `epochs` passes


def _eval_every(c):
    # 0: validate after each pass (10 steps of 100 rows in batches of 10), not every step
    length = runs.run_length(dataclasses.replace(c.train, steps=30), rows=100, batch_size=10)
    assert (length.epochs, length.steps_per_epoch) == (3, 10)


def _used_as_written(c):
    """Fields fit() takes as they are (eval_steps 0 = the whole split, verbose 0 = silent,
    watchdog_s 0 = off, recompile_warning_after 0 = never warn): checked by the run below."""


USES = {
    "alpha": _alpha,
    "adam_beta1": _beta("adam_beta1", "beta_1"), "adam_beta2": _beta("adam_beta2", "beta_2"),
    "weight_decay": _weight_decay, "global_clipnorm": _global_clipnorm,
    "warmup_steps": _warmup_steps, "steps": _steps, "eval_every": _eval_every,
    "eval_steps": _used_as_written, "verbose": _used_as_written,
    "watchdog_s": _used_as_written, "recompile_warning_after": _used_as_written,
}


def test_every_numeric_field_has_a_row():
    assert sorted(NUMERIC) == sorted(REFUSED | USES.keys())


@pytest.mark.parametrize("field", NUMERIC)
def test_zero_is_refused_by_name_or_used(field):
    extra = {"steps": 0, "epochs": 1} if field == "steps" else {}
    if field in REFUSED:
        with pytest.raises(pk.ConfigError, match=rf"train\.{field} = 0"):
            _config(**{field: 0, **extra})
        return
    config = _config(**{field: 0, **extra})
    assert getattr(config.train, field) == 0
    again = config_lib.from_dict(tomllib.loads(config_lib.to_toml(config)))
    assert getattr(again.train, field) == 0 and type(getattr(again.train, field)) is \
        type(getattr(config.train, field))
    USES[field](config)


def test_zeros_reach_run_json_and_the_run(tmp_path):
    """One `podkit train` with the zeros fit() takes as written: config.toml and run.json
    hold them, the optimizer's config in run.json holds the zeros it was given."""
    zeros = ["train.weight_decay=0.0", "train.global_clipnorm=0.0", "train.adam_beta1=0.0",
             "train.eval_steps=0", "train.verbose=0", "train.watchdog_s=0",
             "train.recompile_warning_after=0", "train.warmup_steps=0", "train.alpha=0.0",
             "train.eval_every=0"]
    args = [str(ROOT / "configs" / "seed_mlp.toml"), "--cpu-devices", "1",
            "--set", f"run.dir={tmp_path / 'runs'}", "--set", "train.optimizer=adamw",
            "--set", "train.schedule=cosine", "--set", "train.epochs=1",
            "--set", "train.steps_per_execution=1", "--set", "train.log_every=1"]
    for z in zeros:
        args += ["--set", z]
    (run,) = finish(start_cli("train", *args, cwd=tmp_path, **fast_xla_env()))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Epoch 1/1" not in run.stdout  # verbose = 0: no progress (the summary stays)
    run_dir = tmp_path / "runs" / "seed_mlp"
    saved = tomllib.loads((run_dir / "config.toml").read_text())["train"]
    for z in zeros:
        key, value = z.removeprefix("train.").split("=")
        assert saved[key] == float(value), key
    record = json.loads((run_dir / "run.json").read_text())
    optimizer = record["compile"]["optimizer"]["config"]
    assert optimizer["weight_decay"] == 0.0 and optimizer["global_clipnorm"] == 0.0
    assert optimizer["beta_1"] == 0.0
    schedule = optimizer["learning_rate"]["config"]
    assert schedule["alpha"] == 0.0 and "warmup_steps" not in schedule or \
        schedule.get("warmup_steps") == 0
    assert record["fit"]["epochs"] == 1
    validations = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
                   .splitlines() if "val_loss" in line]
    assert len(validations) == 1  # eval_every = 0: after the pass; eval_steps = 0: all of it
