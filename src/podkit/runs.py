"""A run directory, used after its run: the model with a step's weights, its tensors by name.

What `podkit train` leaves in RUN_DIR (besides the records podkit.monitor reads):

    config.toml      the typed config: how to build the model, its data and its compile()
    data_info.json   what sized the model from the data (vocabulary and context length,
                     classes and image shape, feature counts and table rows)
    tokenizer.json   a text run's tokenizer (Hugging Face `tokenizers` format)
    checkpoints/     the committed steps

`pk.models.from_run(RUN_DIR[, step=])` builds the model the config describes (a factory
model such as the GPT, ResNet or DLRM included: the config says how), compiles it as [train]
does, and loads the step's parameters and other variables on the current devices (any device
count). `named_weights(model)` gives every variable by a stable name and `export` writes them as
safetensors or npz. The CLI's `podkit eval`, `generate` and `export` are these functions.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from podkit import paths
from podkit.errors import ConfigError, InputError
from podkit.train.hooks import Callback

DATA_INFO = "data_info.json"
TOKENIZER = "tokenizer.json"
EXPORT_FORMATS = ("safetensors", "npz")


def strategy_from_config(s: Any) -> Any:
    """The strategy a `[strategy]` section describes (kind, mesh, rules)."""
    from podkit import strategy as strategy_lib

    mesh = dict(s.mesh)
    slices = s.slices
    if s.kind == "custom":
        return strategy_lib.Strategy(mesh=mesh or None, rules=[tuple(r) for r in s.rules],
                                     slices=slices)
    allowed = {"data_parallel": {"data"}, "fsdp": {"data", "fsdp"},
               "tensor_parallel": {"data", "model"}}[s.kind]
    extra = set(mesh) - allowed
    if extra:
        raise ConfigError(f"strategy.mesh = {mesh} has axes {sorted(extra)} that kind = "
                          f"{s.kind!r} does not use (it uses {sorted(allowed)}); use kind = "
                          '"custom" with rules for other layouts.')
    if s.kind == "data_parallel":
        return strategy_lib.Strategy(mesh=mesh or {"data": -1}, slices=slices)
    if s.kind == "fsdp":
        if mesh.get("data") == -1:
            raise ConfigError(
                f"strategy.kind = \"fsdp\" with strategy.mesh = {mesh}: under FSDP the fsdp "
                "axis takes the devices the data axis leaves, so data needs a size (data = 2 "
                "keeps two replicas) or no entry: --set 'strategy.mesh={ fsdp = -1 }'.")
        return strategy_lib.FSDP(data=mesh.get("data", 1), fsdp=mesh.get("fsdp", -1),
                                 slices=slices)
    return strategy_lib.TensorParallel(model=mesh.get("model", 2), data=mesh.get("data", -1),
                                       slices=slices)


# -- compile() as [train] says ---------------------------------------------------------------
def schedule_from_config(t: Any, total_steps: int | None = None) -> Any:
    """The learning rate `[train]` describes: a float, or a schedule sized by the run's real
    length (`train.steps`, else `total_steps`: epochs x steps per epoch)."""
    from podkit.optimizers import schedules

    kind = t.schedule
    if kind == "auto":
        kind = "cosine" if t.warmup_steps else "constant"
    if kind == "constant" and not t.warmup_steps:
        return t.learning_rate
    total = t.steps or total_steps
    if not total:
        raise ConfigError(f"train.schedule = {kind!r} needs the run's length: set train.steps "
                          "(or pass the number of steps the run takes).")
    decay = max(total - t.warmup_steps, 1)
    warm = {"warmup_target": t.learning_rate, "warmup_steps": t.warmup_steps} \
        if t.warmup_steps else {}
    start = 0.0 if t.warmup_steps else t.learning_rate
    if kind == "linear":
        return schedules.PolynomialDecay(start, decay_steps=decay, power=1.0,
                                         end_learning_rate=t.learning_rate * t.alpha, **warm)
    alpha = 1.0 if kind == "constant" else t.alpha  # constant after its warmup
    return schedules.CosineDecay(start, decay_steps=decay, alpha=alpha, **warm)


ADAM_FAMILY = ("adam", "adamw", "nadam", "adamax", "lamb")
EPSILON_PLACEMENT = ("adam", "adamw")  # Keras adds the others' epsilon after correcting


def optimizer_from_config(t: Any, total_steps: int | None = None) -> Any:
    """The optimizer `[train]` names, with its learning rate (schedule_from_config), Adam's
    betas, epsilon and its placement, and the weight decay and global gradient clipping the
    config writes (a key left out: the optimizer's own default, e.g. AdamW's decay 0.004)."""
    from podkit import optimizers

    cls = type(optimizers.get(t.optimizer))  # the name checked, with the valid ones listed
    extra: dict[str, Any] = {"weight_decay": t.weight_decay,
                             "global_clipnorm": t.global_clipnorm}
    adam = {"beta_1": t.adam_beta1, "beta_2": t.adam_beta2, "epsilon": t.adam_epsilon}
    name = t.optimizer.lower()
    if name in ADAM_FAMILY:
        extra.update(adam)
    elif adam != {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7}:
        raise ConfigError(f"train.adam_beta1/adam_beta2/adam_epsilon apply to "
                          f"{', '.join(ADAM_FAMILY)}; train.optimizer = {t.optimizer!r} "
                          "does not use them. Leave them out.")
    if name in EPSILON_PLACEMENT:
        extra["epsilon_placement"] = t.adam_epsilon_placement
    elif t.adam_epsilon_placement != "keras":
        raise ConfigError(f"train.adam_epsilon_placement = {t.adam_epsilon_placement!r} applies "
                          f"to {' and '.join(EPSILON_PLACEMENT)}; train.optimizer = "
                          f"{t.optimizer!r} has one form only (Keras's, which for nadam and "
                          "lamb adds epsilon after the bias correction already). Leave it out.")
    return cls(learning_rate=schedule_from_config(t, total_steps),
               **{k: v for k, v in extra.items() if v is not None})


def loss_from_config(t: Any, ignore_class: int | None = None) -> Any:
    """The loss `[train]` names, taking logits when train.from_logits is set; `ignore_class`:
    the label the data marks tokens not learned with (instruction data's -100)."""
    from podkit import losses

    loss = losses.get(t.loss)
    if ignore_class is not None:
        if not isinstance(loss, losses.SparseCategoricalCrossentropy):
            raise ConfigError(f"this data leaves tokens out of the loss (label {ignore_class}), "
                              "which needs train.loss = \"sparse_categorical_crossentropy\", not "
                              f"{t.loss!r}.")
        # Instruction data feeds a language model, which ends in logits.
        return losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=ignore_class)
    if not t.from_logits:
        return loss
    if loss.expects is None:
        raise ConfigError(f"train.from_logits = true applies to cross-entropy losses, not "
                          f"{t.loss!r}.")
    return type(loss)(from_logits=True)


def compile_from_config(model: Any, t: Any, total_steps: int | None = None,
                        ignore_class: int | None = None) -> None:
    """model.compile(...) with what `[train]` says (`ignore_class`: the data's, see
    loss_from_config)."""
    model.compile(optimizer=optimizer_from_config(t, total_steps),
                  loss=loss_from_config(t, ignore_class),
                  metrics=t.metrics, steps_per_execution=t.steps_per_execution,
                  microbatches=t.microbatches,
                  recompile_warning_after=t.recompile_warning_after or None,
                  strict_recompiles=t.strict_recompiles)


# -- a run's length as fit() epochs ----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RunLength:
    """How `podkit train` lays a run out as fit() epochs. The data is one stream (fit's
    steps_per_epoch continues it across epochs, reshuffling when a pass ends), so an "epoch"
    here is only the interval between validations: `train.eval_every` steps, or one pass over
    the data. `total` optimizer steps in all; the last interval ends early when it does not
    divide them."""

    total: int
    epochs: int
    steps_per_epoch: int | None  # None: whole passes (fit's own epochs)
    steps_per_execution: int

    def callbacks(self) -> list[Any]:
        """What ends the run at `total` steps when the last interval is cut short."""
        if self.steps_per_epoch is None or self.total % self.steps_per_epoch == 0:
            return []
        return [StopAtStep(self.total, self.steps_per_epoch, self.steps_per_execution)]


def run_length(t: Any, rows: int, batch_size: int, endless: bool = False) -> RunLength:
    """`train.steps` (or `epochs` passes of `rows` rows) in intervals of `train.eval_every`
    steps (or one pass). `endless`: the data is a Dataset that repeats (whole batches only),
    so every interval is counted in steps."""
    k = t.steps_per_execution
    per_pass = (max(rows // batch_size, 1) if endless  # drop_remainder
                else max(-(-rows // batch_size), 1))  # fit's batches per pass: the last padded
    if not t.steps and not t.eval_every and not endless:
        return RunLength(t.epochs * per_pass, t.epochs, None, k)  # fit's own epochs
    total = t.steps or -(-t.epochs * per_pass // k) * k
    # Not sized by the total: a resume with more steps keeps the data position's meaning
    # (epoch x interval + steps into it is the step in the stream).
    interval = t.eval_every or -(-per_pass // k) * k
    return RunLength(total, -(-total // interval), interval, k)


class StopAtStep(Callback):
    """Stops fit() after step `total`: set before the execution that reaches it starts
    (no device fetch: the batch index is all it reads)."""

    def __init__(self, total: int, steps_per_epoch: int, steps_per_execution: int) -> None:
        super().__init__()
        self.total, self.per_epoch, self.k = total, steps_per_epoch, steps_per_execution
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.epoch * self.per_epoch + batch + self.k >= self.total:
            self.model.stop_training = True


# -- resuming with a changed config ----------------------------------------------------------
# What a resumed run may change, and what it applies: the rest would break the weights (the
# model), the optimizer state (its kind, the metrics' running sums) or the data position
# (counted in steps of the data as it was: its batch size, files, seed). The learning rate is
# not in that list: a constant rate and every schedule keep one optimizer-state tree, and a
# schedule is evaluated from the restored step count (podkit.optimizers.inject_learning_rate),
# so a new schedule, warmup or length continues from the checkpoint's step.
APPLIED = {
    "train": {"epochs", "steps", "learning_rate", "schedule", "alpha", "warmup_steps",
              "adam_beta1", "adam_beta2", "adam_epsilon", "adam_epsilon_placement",
              "weight_decay", "global_clipnorm",
              "eval_steps", "log_every", "verbose", "watchdog_s", "microbatches",
              "recompile_warning_after", "strict_recompiles"},
    "strategy": {"kind", "mesh", "rules"},  # a checkpoint restores onto any mesh
    "checkpoint": {"dir", "every_steps", "every_seconds", "keep", "keep_every", "async_save",
                   "on_nan", "enabled", "local_every_steps", "local_dir", "local_keep"},
    "run": {"name", "dir", "compile_cache"},  # where compiled programs are kept
}
WHY = {
    "model": "the checkpoint's weights are the old model's",
    "data": "the data position is counted in steps of the old data (its batch size, "
            "length and files)",
    "run": "the data order is drawn from the seed",
    "train": "the optimizer state, the metrics' running sums or the data position (counted "
             "in validation intervals and executions) are the old settings'",
}


def resume_changes(saved_toml: str, config: Any, step: int,
                   total_of: Callable[[Any], int]) -> list[str]:
    """What changed since the checkpoint at `step` (its config.toml text): the changes a
    resume applies, as lines to log (a changed learning-rate schedule, which continues from
    `step`, gets one more); a ConfigError naming the first that it cannot, with the fix.
    `total_of(train)`: the run's length in steps under a `[train]` section (what sizes its
    schedule)."""
    import tomllib

    from podkit import config as config_lib

    saved = config_lib.from_dict(tomllib.loads(saved_toml))
    old, new = dataclasses.asdict(saved), dataclasses.asdict(config)
    notes = []
    for section, values in new.items():
        for key, value in values.items():
            before = old.get(section, {}).get(key)
            if before == value:
                continue
            if key in APPLIED.get(section, ()):
                notes.append(f"{section}.{key}: {before!r} -> {value!r} (applied from step "
                             f"{step})")
                continue
            raise ConfigError(
                f"{section}.{key} changed from {before!r} to {value!r} since checkpoint step "
                f"{step}, and a resume cannot apply it: {WHY.get(section, 'it is fixed')}. "
                f"Resume with {section}.{key} = {config_lib.toml_value(before)}, or start a "
                "new run (another run.name) from these weights with --init-from "
                "RUN_DIR.")
    if _optimizer_state_names(saved.train) != _optimizer_state_names(config.train):
        # No [train] key changes the Keras optimizers' state today (clipping, decay and
        # the rate add none); this guards any that would.
        keys = [k for k in new["train"] if old["train"][k] != new["train"][k]]
        was = ", ".join(f"train.{k} = {_written(old['train'][k])}" for k in keys)
        raise ConfigError(
            f"{', '.join(f'train.{k}' for k in keys)} changed since checkpoint step {step} "
            "and that changes the optimizer's state, so the checkpoint's does not fit it. "
            f"Resume with {was}, or start a new run from these weights with --init-from "
            "RUN_DIR.")
    change = schedule_change(saved.train, total_of(saved.train), config.train,
                             total_of(config.train), step)
    return notes + ([change] if change else [])


def _written(value: Any) -> str:
    """A config value as TOML writes it; None (a key left out) as that."""
    from podkit import config as config_lib

    return "(left out)" if value is None else config_lib.toml_value(value)


def _optimizer_state_names(t: Any) -> list[str]:
    """The names of the optimizer state `[train]` makes (for a stand-in parameter): what a
    checkpoint's optimizer state must match. No schedule changes them."""
    import jax

    tx = optimizer_from_config(t, 1).transform()
    shapes = jax.eval_shape(tx.init, {"w": jax.ShapeDtypeStruct((2, 2), np.float32)})
    return [jax.tree_util.keystr(path) for path, _ in
            jax.tree_util.tree_flatten_with_path(shapes)[0]]


def schedule_change(was: Any, was_total: int, now: Any, now_total: int,
                    step: int) -> str | None:
    """The log line of a resume at `step` whose learning rate changes and follows a schedule
    (before or after): the schedules and the next step's rate under each; None when the rate
    is the same, or a constant either way (the train.learning_rate line says it)."""
    before, after = schedule_from_config(was, was_total), schedule_from_config(now, now_total)
    if isinstance(before, float) and isinstance(after, float):
        return None
    if describe_schedule(was, was_total) == describe_schedule(now, now_total):
        return None

    def rate(schedule: Any) -> str:
        return f"{float(schedule(step) if callable(schedule) else schedule):.4g}"

    return (f"learning rate: {describe_schedule(now, now_total)} (was: "
            f"{describe_schedule(was, was_total)}), continued from the optimizer's step "
            f"{step}: the next step's rate is {rate(after)} ({rate(before)} before)")


def describe_schedule(t: Any, total: int) -> str:
    """The learning rate `[train]` gives a run of `total` steps, in words."""
    kind = t.schedule
    if kind == "auto":
        kind = "cosine" if t.warmup_steps else "constant"
    warmup = f"warmup {t.warmup_steps} steps, then " if t.warmup_steps else ""
    if kind == "constant":
        return f"{warmup}constant {t.learning_rate:g}"
    return (f"{warmup}{kind} decay from {t.learning_rate:g} to {t.learning_rate * t.alpha:g} "
            f"at step {total}")


class SetLearningRate(Callback):
    """Sets a constant learning rate once training begins (after a resume restored the old
    one with the optimizer state)."""

    def __init__(self, learning_rate: float) -> None:
        super().__init__()
        self.learning_rate = learning_rate

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.model.optimizer.learning_rate = self.learning_rate


# -- what a run keeps besides its checkpoints ------------------------------------------------
def write_data_info(run_dir: str | os.PathLike, info: dict, total_steps: int) -> None:
    """RUN_DIR/data_info.json (the plain values of `info`, and the run's length in steps,
    which sizes its schedule) and, for text, tokenizer.json: what from_run needs to build
    and compile the model without reading the data again."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = {k: list(v) if isinstance(v, tuple) else v for k, v in info.items()
             if isinstance(v, int | float | str | bool | tuple | list) and k != "bayes_auc"}
    plain["total_steps"] = int(total_steps)
    (run_dir / DATA_INFO).write_text(json.dumps(plain, indent=2) + "\n")
    tokenizer = info.get("tokenizer")
    if tokenizer is not None and hasattr(tokenizer, "save"):
        tokenizer.save(str(run_dir / TOKENIZER))


def check_same_data(run_dir: str | os.PathLike, info: dict, step: int) -> None:
    """A resume of a run whose data was read into tokens: the token stream must be the one
    the checkpoint's data position counts in (the same files, tokenizer and settings), or the
    resume would continue on other windows, silently."""
    path = Path(run_dir) / DATA_INFO
    if not path.is_file() or "token_digest" not in info:
        return
    saved = json.loads(path.read_text())
    if saved.get("token_digest", info["token_digest"]) == info["token_digest"]:
        return
    raise ConfigError(
        f"{run_dir}: the data changed since step {step} was saved ({saved.get('tokens')}"
        f" tokens then, {info['tokens']:,} now, or other ids: edited files, another tokenizer "
        "or eos_token), so the saved data position would point at other windows. Restore "
        "the files, or start a new run from these weights on the new data: podkit train "
        f"CONFIG --set run.name=NEW --init-from {run_dir}.")


_copies: dict[str, Any] = {}  # a run directory's URL -> its Mirror, pulled once per process


def local_dir(where: str | os.PathLike, must_exist: bool = True) -> Path:
    """A run directory to read as a local path: itself, or for a gs:// or s3:// URL a copy
    of it pulled once per process into a directory of this process's own (never the copy a
    run on this machine is writing; checkpoints stay at the URL, read there by
    checkpoint_dir's manager). `must_exist`: a URL with nothing under it is an error."""
    if not paths.is_url(where):
        return Path(where)
    from podkit.monitor.run_dir import snapshot_of

    url = os.fspath(where).rstrip("/")
    if url not in _copies:
        mirror = snapshot_of(url)
        if not mirror.pull() and must_exist:
            raise ConfigError(f"{url!r} holds no run directory (nothing is stored under it); "
                              "pass the run.dir/run.name a run of `podkit train` wrote, or "
                              "the run_dir fit() was given.")
        _copies[url] = mirror
    return _copies[url].local


def push_copy(where: str | os.PathLike) -> None:
    """Send what a command wrote into a URL run directory's local copy (report.html) to
    the URL; nothing for a local one."""
    if paths.is_url(where):
        local_dir(where)
        _copies[os.fspath(where).rstrip("/")].push()


def _run_dir(where: str | os.PathLike) -> Path:
    path = local_dir(where)
    if not (path / "config.toml").is_file():
        hint = (" It is a checkpoint directory: pass the run directory above it."
                if path.name == "checkpoints" else "")
        raise ConfigError(f"{str(where)!r} is not a run directory of `podkit train` (it has no "
                          f"config.toml).{hint} A model saved with model.save() loads with "
                          "pk.models.load_model(path).")
    return path


def read_config(run_dir: str | os.PathLike) -> Any:
    """The run's resolved config (RUN_DIR/config.toml)."""
    from podkit import config as config_lib

    return config_lib.load(_run_dir(run_dir) / "config.toml")


def data_info(run_dir: str | os.PathLike, config: Any | None = None) -> dict:
    """What sized the run's model: RUN_DIR/data_info.json, or (a run from before it was
    written) the data loaded again as the config says."""
    run_dir = _run_dir(run_dir)
    path = run_dir / DATA_INFO
    if path.is_file():
        info = json.loads(path.read_text())
        if (run_dir / TOKENIZER).is_file():
            info["tokenizer"] = load_tokenizer(run_dir)
        return info
    from podkit import datasets

    config = config or read_config(run_dir)
    return datasets.load(config.data, seed=config.run.seed).info


def load_tokenizer(run_dir: str | os.PathLike) -> Any:
    """The run's tokenizer (a `tokenizers.Tokenizer`), from RUN_DIR/tokenizer.json."""
    path = _run_dir(run_dir) / TOKENIZER
    if not path.is_file():
        raise ConfigError(f"{path.parent} keeps no tokenizer.json: it is not a text run, or "
                          "it was trained before podkit kept the tokenizer in the run "
                          "directory (train it again).")
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def checkpoint_dir(run_dir: str | os.PathLike) -> Path | str:
    """Where the run's checkpoints are (checkpoint.dir, or RUN_DIR/checkpoints); an error
    when it holds none."""
    local = _run_dir(run_dir)
    where = read_config(local).checkpoint.dir  # a local path, gs:// or s3://
    if where and paths.is_url(where):
        checkpoints: Path | str = where
    elif paths.is_url(run_dir):  # the copy holds no checkpoints: they are at the URL
        checkpoints = where or paths.join(run_dir, "checkpoints")
    else:
        checkpoints = Path(where or local / "checkpoints")
    if not paths.isdir(checkpoints) or not any(n.startswith("step_")
                                               for n in paths.listdir(checkpoints)):
        raise InputError(f"{run_dir} has no checkpoints ({checkpoints}): the run ended before "
                         "its first save, or ran with checkpoint.enabled = false.")
    return checkpoints


def default_scope(config: Any) -> Any:
    """The run's own [strategy] on the devices there are now."""
    return strategy_from_config(config.strategy).scope()


# -- tensors by name --------------------------------------------------------------------------
def named_weights(model: Any) -> dict[str, np.ndarray]:
    """Every variable of a built model as numpy, by name: a model of podkit layers by its
    layers' paths ("dense/kernel"), an NNX module (GPT, ResNet, DLRM) by its state's paths
    ("params/blocks/attn/qkv/kernel", "rest/..." for batch statistics)."""
    from podkit import agree

    weights = model.weights
    if weights and hasattr(weights[0], "path"):
        return {v.path: v.numpy() for v in weights}
    import jax

    out = {}
    for collection in ("params", "rest"):
        tree = getattr(model.state, collection)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
            out[f"{collection}/{name}"] = np.array(agree.gather(leaf))
    return out


def export(model: Any, path: str | os.PathLike, format: str = "safetensors") -> Path | str:
    """Write `named_weights(model)` to `path` (local, gs:// or s3://; a directory gets
    weights.FORMAT in it) as safetensors or npz; returns the path written (a str for a URL).
    Every process calls it (the weights are gathered from all); the lead process writes, all
    at once (staged, then renamed or uploaded)."""
    from podkit.cluster import is_lead_process

    if format not in EXPORT_FORMATS:
        raise ConfigError(f"export format {format!r}; use one of {', '.join(EXPORT_FORMATS)}.")
    remote = paths.is_url(path)  # a malformed URL is a ConfigError here, before any work
    name = os.fspath(path)
    if paths.isdir(name):
        name = paths.join(name, f"weights.{format}")
    suffix = os.path.splitext(name.rstrip("/"))[1]
    other = {f".{f}" for f in EXPORT_FORMATS} - {f".{format}"}
    if suffix in other:
        raise ConfigError(f"{name!r} ends in {suffix} but the format is {format!r}; "
                          f"name the file .{format}, or pass the format its name says.")
    tensors = {k: np.ascontiguousarray(v) for k, v in named_weights(model).items()}
    if format == "npz" and suffix != ".npz":
        name += ".npz"  # what np.savez would write
    written = name if remote else Path(name)
    if not is_lead_process():
        return written
    with paths.staged(name) as local:
        if format == "npz":
            np.savez(local, **tensors)
        else:
            from safetensors.numpy import save_file

            save_file(tensors, local, metadata={"format": "np", "model": str(model.name)})
    return written
