"""Saving and loading models: JSON for what a model is, Orbax for its arrays. No pickle.

    model.save("runs/m")              runs/m/model.json   architecture, compile config, inputs
                                      runs/m/state/       the TrainState (Orbax)
    pk.models.load_model("runs/m")    the same model on the current strategy and devices
    model.save_weights("runs/w")      variables only (no optimizer state)
    model.load_weights("runs/w")      into a model built from the same code

The state is written as a flat dict of arrays keyed by path ("params.layers.0.kernel"; see
podkit.checkpoint.arrays, which checkpoints share), and read back into the abstract state of
the loading model — shapes, dtypes and *its* shardings — so a model saved on 8 devices loads on
1 (or on another mesh) and Orbax reshards on the way in. Reading never executes code from the
files: the architecture is rebuilt from layer configs by name, and a model made from Python
code (an NNX module or factory) says so and asks for its code.

Every path may be local, `gs://bucket/...` or `s3://bucket/...` (podkit.paths): a save to a URL
is written in a local staging directory and uploaded when whole (nothing is uploaded if the
save fails); a load reads model.json from the store and downloads the arrays once per process
(paths.local_copy). A malformed URL is a ConfigError naming it, never a local `gs:` folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from podkit import losses, metrics, optimizers, paths
from podkit._version import __version__
from podkit.architectures import InputSpec
from podkit.checkpoint.arrays import read_arrays, write_arrays
from podkit.cluster import is_lead_process
from podkit.errors import ConfigError, InputError

FORMAT = "podkit.model/1"
WEIGHTS_FORMAT = "podkit.weights/1"


class SavableModel(Protocol):
    """What the file format needs of a model: podkit.model.Model has it. (This module does not
    import model.py: Model.save and friends call down into it, and `pk.models.load_model`
    passes the class's `from_config` in.)"""

    name: str
    kind: str
    built: bool
    state: Any
    layout: Any
    input_spec: Any

    def get_config(self) -> dict: ...

    def compile_config(self) -> dict: ...

    def compile(self, **kwargs: Any) -> None: ...

    def build_for(self, spec: Any, initial_state: Callable[[Any], Any] | None = None) -> None: ...


# -- models ---------------------------------------------------------------------------------------
def _inputs_record(model: SavableModel) -> dict:
    spec = model.input_spec
    return {"names": list(spec.names), "shapes": [list(s) for s in spec.shapes],
            "dtypes": [np.dtype(d).name for d in spec.dtypes], "structure": spec.structure}


def model_record(model: SavableModel) -> dict[str, Any]:
    """What model.json holds: the architecture (None when it is Python code), the compile
    settings and the inputs. Checkpoints keep it in their meta record, so that load_model
    reads a checkpoint directory too."""
    record: dict[str, Any] = {"format": FORMAT, "podkit": __version__,
                              "class_name": model.kind, "name": model.name,
                              "inputs": _inputs_record(model)}
    try:
        record["config"] = model.get_config()
    except ConfigError:
        record["config"] = None
    try:
        record["compile"] = model.compile_config()
    except ConfigError as e:
        record["compile"] = None
        record["compile_note"] = str(e)
    return record


def _write_directory(path: str | os.PathLike, write: Callable[[Path], None],
                     what: str) -> None:
    """write(local directory) for `path`: the directory itself when local (every process
    writes its arrays there, as Orbax expects); for a URL a local staging directory, uploaded
    when `write` returns (one process: Orbax's multi-process writes need one directory that
    every process sees, which an object store is not)."""
    if not paths.is_url(path):
        write(Path(path))
        return
    import jax

    if jax.process_count() > 1:
        raise ConfigError(
            f"{what} to {os.fspath(path)!r} from {jax.process_count()} processes: podkit "
            "uploads a saved model from one process. Save to a shared file system path and "
            "copy it up, or checkpoint with fit(checkpoint=URL), whose CheckpointManager "
            "uploads every process's files.")
    with paths.staged(path) as local:
        write(Path(local))


def _write_json(path: Path, record: dict) -> None:
    with paths.open(path, "w") as f:  # written aside and renamed: never half a file
        f.write(json.dumps(record, indent=2) + "\n")


def save_model(model: SavableModel, path: str | os.PathLike) -> None:
    _require_built(model, "save()")
    record = model_record(model)
    if record["config"] is None:
        import warnings

        warnings.warn(f"{model.name}: saving weights and optimizer state only; the "
                      "architecture is Python code (an NNX module, a factory or a subclass), "
                      "so load it with model.load_weights(path) into a model built from that "
                      "code.", UserWarning, stacklevel=3)
    def write(local: Path) -> None:
        write_arrays(local / "state", model.state)
        if is_lead_process():
            _write_json(local / "model.json", record)

    _write_directory(path, write, "model.save()")


def _split(path: str) -> tuple[str, str]:
    """(parent, name) of a local path or a URL."""
    if paths.is_url(path):
        parent, _, name = path.rstrip("/").rpartition("/")
        return parent, name
    return os.path.dirname(os.path.abspath(path)), os.path.basename(os.path.abspath(path))


def _step_directory(path: str, step: int | None) -> tuple[str, int | None]:
    """A checkpoint's step directory (ck/step_0000000018, what ModelCheckpoint's log
    names) as (the checkpoint directory, that step)."""
    from podkit.checkpoint import format as fmt

    parent, name = _split(path)
    named = fmt.parse_step(name)
    if named is None or not paths.isdir(path) or paths.exists(paths.join(path, "model.json")):
        return path, step
    if step is not None and step != named:
        raise ConfigError(f"{path} is checkpoint step {named}, and step={step} asks for "
                          f"another; pass the checkpoint directory {parent} with "
                          "step=, or the step directory alone.")
    return parent, named


def _checkpoint(path: str, step: int | None = None) -> tuple[Any, int, dict] | None:
    """(manager, step, meta) when `path` is a checkpoint directory (what fit(checkpoint=)
    and ModelCheckpoint write): its newest valid step, or `step`; else None."""
    from podkit.checkpoint.manager import CheckpointManager

    if not paths.isdir(path) or paths.exists(paths.join(path, "model.json")) or \
            paths.exists(paths.join(path, "weights.json")) or \
            not any(n.startswith("step_") for n in paths.listdir(path)):
        return None
    manager = CheckpointManager(path)
    found = manager.meta(step)
    if found is None and step is not None:
        valid = [i.step for i in manager.steps(deep=False) if i.valid]
        raise InputError(f"{path} has no valid checkpoint step {step}; its valid steps: "
                         f"{valid or 'none'} (`podkit checkpoint ls {path}` says why).")
    if found is None:
        raise InputError(f"{path} holds no valid checkpoint step (`podkit checkpoint ls "
                         f"{path}` says why); nothing to load.")
    return manager, found[0], found[1]


def _checkpoint_record(path: str, meta: dict, step: int) -> dict:
    record = meta.get("saved_model")
    if record is None:
        raise InputError(f"checkpoint step {step} in {path} records no model (written by an "
                         "older podkit): build the model from its code, compile it, and call "
                         "model.load_weights(path) or fit(resume=path).")
    return record


def _read_record(path: str) -> dict:
    for name in ("model.json", "weights.json"):
        f = paths.join(path, name)
        if paths.exists(f) and not paths.isdir(f):
            with paths.open(f, "r") as file:
                text = file.read()
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputError(f"{f} is not valid JSON ({e}); the save is damaged.") from None
            if record.get("format") not in (FORMAT, WEIGHTS_FORMAT):
                raise InputError(f"{f} has format {record.get('format')!r}; this podkit reads "
                                 f"{FORMAT!r}.")
            return record
    raise InputError(f"{path} holds no saved podkit model (no model.json or weights.json, no "
                     "checkpoint steps); pass a directory written by model.save(), "
                     "model.save_weights(), ModelCheckpoint or fit(checkpoint=...).")


def _require_built(model: SavableModel, what: str) -> None:
    if not model.built:
        raise ConfigError(f"{what} needs a built model: fit it once, or call "
                          "model.build(input_shape).")


def load_model(path: str | os.PathLike, from_config: Callable[[dict], SavableModel],
               compile: bool = True) -> SavableModel:
    """The model saved at `path`, compiled and with its whole state, on the current strategy
    (any device count). `from_config` makes the (uncompiled) model from
    `{"class_name", "config"}` (`Model.from_config`). `compile=False`: the architecture and
    its variables, ready for predict(); compile() it (with a fresh optimizer) to train."""
    path, step = _step_directory(os.fspath(path), None)
    found = _checkpoint(path, step)
    if found is not None:
        return _load_from_checkpoint(path, *found, from_config=from_config, compile=compile)
    record = _read_record(path)
    if record["format"] != FORMAT:
        raise InputError(f"{path} holds weights only (save_weights); build the model from code "
                         "and call model.load_weights(path).")
    if record.get("config") is None:
        raise ConfigError(f"{path}: this model was built from Python code (an NNX module or "
                          "factory), so its architecture was not saved. Build it from that "
                          "code, compile it, and call model.load_weights(path).")
    model = from_config({"class_name": record["class_name"], "config": record["config"]})
    if not compile:
        load_weights(model, path)
        return model
    if record.get("compile") is None and "compile_note" not in record:
        # Saved before compile(): Keras returns such a model uncompiled; so does podkit.
        load_weights(model, path)
        return model
    if record.get("compile") is None:
        raise ConfigError(f"{path}: the compile settings were not saved "
                          f"({record.get('compile_note', 'not compiled')}); load with "
                          "compile=False, compile the model, then call model.load_weights(path).")
    _compile_from(model, record["compile"])
    with paths.local_copy(paths.join(path, "state")) as state:
        model.build_for(_input_spec(record),  # the state comes from the files, no fresh init
                        initial_state=lambda layout: read_arrays(Path(state), layout.abstract))
    return model


def _load_from_checkpoint(path: str, manager: Any, step: int, meta: dict, *,
                          from_config: Callable[[dict], SavableModel],
                          compile: bool) -> SavableModel:
    """load_model of a checkpoint directory: the model its meta records, with the step's
    state (compile=True: optimizer state included, ready to train on)."""
    record = _checkpoint_record(path, meta, step)
    if record.get("config") is None:
        raise ConfigError(f"{path}: this model was built from Python code (an NNX module, a "
                          "factory or a subclass), so its architecture was not recorded. Build "
                          "it from that code, compile it, and call model.load_weights(path).")
    model = from_config({"class_name": record["class_name"], "config": record["config"]})
    if compile and record.get("compile") is not None:
        _compile_from(model, record["compile"])
        model.build_for(_input_spec(record), initial_state=lambda layout: manager.restore(
            {"state": layout.abstract}, step=step, partial=True).tree["state"])
        return model
    model.build_for(_input_spec(record))
    _weights_from_checkpoint(model, manager, step)
    return model


def load_training_state(model: SavableModel, path: str | os.PathLike,
                        step: int | None = None) -> int:
    """A compiled, unbuilt model built with the whole state of a checkpoint directory's
    newest valid step (or `step`): weights, optimizer state and step count, as fit() would
    resume it (any device count). Returns the step."""
    found = _checkpoint(os.fspath(path), step)
    if found is None:
        raise InputError(f"{path} is not a checkpoint directory (no step_* in it).")
    manager, step, meta = found
    if model.built:
        raise ConfigError("load_training_state builds the model from the checkpoint; pass a "
                          "model that was compiled but not built.")
    model.build_for(_input_spec(_checkpoint_record(path, meta, step)),
                    initial_state=lambda layout: manager.restore(
                        {"state": layout.abstract}, step=step, partial=True).tree["state"])
    return step


def _weights_from_checkpoint(model: SavableModel, manager: Any, step: int) -> None:
    abstract = model.layout.abstract
    part = manager.restore({"state": {"params": abstract.params, "rest": abstract.rest}},
                           step=step, partial=True).tree["state"]
    model.state = model.state.replace(params=part["params"], rest=part["rest"])


def _compile_from(model: SavableModel, c: dict) -> None:
    def each(value: Any, fn: Any) -> Any:
        if isinstance(value, dict) and "class_name" not in value:
            return {k: None if v is None else fn(v) for k, v in value.items()}
        if isinstance(value, list):
            return [None if v is None else fn(v) for v in value]
        return None if value is None else fn(value)

    def metric_list(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, dict):
            return {k: [metrics.deserialize(m) for m in v] for k, v in value.items()}
        if value and isinstance(value[0], list):
            return [[metrics.deserialize(m) for m in v] for v in value]
        return [metrics.deserialize(m) for m in value]

    model.compile(optimizer=optimizers.deserialize(c["optimizer"]),
                  loss=each(c["loss"], losses.deserialize), loss_weights=c.get("loss_weights"),
                  metrics=metric_list(c.get("metrics")),
                  weighted_metrics=metric_list(c.get("weighted_metrics")),
                  steps_per_execution=c.get("steps_per_execution", 1), jit=c.get("jit", True),
                  microbatches=c.get("microbatches", 1))


def _input_spec(record: dict) -> Any:
    inputs = record["inputs"]
    return InputSpec(tuple(inputs["names"]), tuple(tuple(s) for s in inputs["shapes"]),
                     tuple(np.dtype(d) for d in inputs["dtypes"]),
                     inputs.get("structure", "single" if len(inputs["names"]) == 1 else "list"))


def save_weights(model: SavableModel, path: str | os.PathLike) -> None:
    _require_built(model, "save_weights()")
    record = {"format": WEIGHTS_FORMAT, "podkit": __version__, "name": model.name,
              "inputs": _inputs_record(model)}

    def write(local: Path) -> None:
        write_arrays(local / "state", {"params": model.state.params, "rest": model.state.rest})
        if is_lead_process():
            _write_json(local / "weights.json", record)

    _write_directory(path, write, "model.save_weights()")


def load_named_tensors(model: SavableModel, path: str | os.PathLike) -> None:
    """The tensors a `.safetensors` file holds by name (what `pk.runs.export` writes: a
    layer's "dense/kernel", a module's "params/blocks/attn/qkv", "rest/...") into this built
    model, each onto its variable's sharding. Every name of the model must be in the file
    with its shape; a missing or extra name is an InputError naming them."""
    import jax

    from podkit.interop.safetensors_files import SafetensorsFile

    with paths.local_copy(os.fspath(path)) as local:
        tensors = SafetensorsFile(local)
        names = set(tensors.names())
        weights = model.weights
        if weights and hasattr(weights[0], "path"):  # a model of podkit layers
            wanted = [v.path for v in weights]
        else:
            wanted = []
            for collection in ("params", "rest"):
                for key, _ in jax.tree_util.tree_flatten_with_path(
                        getattr(model.state, collection))[0]:
                    wanted.append(collection + "/" + "/".join(
                        str(getattr(k, "key", getattr(k, "idx", k))) for k in key))
        missing, extra = sorted(set(wanted) - names), sorted(names - set(wanted))
        if missing or extra:
            raise InputError(f"{path} does not hold this model's tensors: missing "
                             f"{missing[:4]}{' ...' if len(missing) > 4 else ''}, not the "
                             f"model's {extra[:4]}{' ...' if len(extra) > 4 else ''} (the "
                             "names are pk.runs.named_weights(model)'s).")
        if weights and hasattr(weights[0], "path"):
            model.set_weights([np.array(tensors.read(n)) for n in wanted])
            return
        values = iter([np.array(tensors.read(n)) for n in wanted])

        def put(leaf: Any) -> Any:
            value = next(values)
            if value.shape != leaf.shape:
                raise InputError(f"{path}: a tensor is {value.shape}, the model's variable "
                                 f"{leaf.shape}.")
            return jax.device_put(value.astype(leaf.dtype), leaf.sharding)

        state = model.state
        params = jax.tree.map(put, state.params)
        rest = jax.tree.map(put, state.rest)
        model.state = state.replace(params=params, rest=rest)


def load_weights(model: SavableModel, path: str | os.PathLike, step: int | None = None
                 ) -> None:
    """The variables saved at `path` (by save(), save_weights(), or a checkpoint directory:
    its newest valid step, or `step`; or a `.safetensors` file of named tensors, as
    `pk.runs.export` writes) into this model: its parameters and other variables; its
    optimizer state stays its own."""
    if os.fspath(path).rstrip("/").endswith(".safetensors"):
        if not model.built:
            raise ConfigError(f"load_weights({os.fspath(path)!r}): a safetensors file names "
                              "tensors, not the inputs: build the model first "
                              "(model.build(input_shape), or fit/predict once).")
        load_named_tensors(model, path)
        return
    path, step = _step_directory(os.fspath(path), step)
    found = _checkpoint(path, step)
    if found is not None:
        manager, step, meta = found
        if not model.built:
            model.build_for(_input_spec(_checkpoint_record(path, meta, step)))
        _weights_from_checkpoint(model, manager, step)
        return
    if step is not None:
        raise ConfigError(f"load_weights(step={step}) applies to a checkpoint directory; {path} "
                          "is a saved model.")
    record = _read_record(path)
    if not model.built:
        model.build_for(_input_spec(record))
    abstract = model.layout.abstract
    with paths.local_copy(paths.join(path, "state")) as state:
        part = read_arrays(Path(state), {"params": abstract.params, "rest": abstract.rest},
                           partial=True)
    model.state = model.state.replace(params=part["params"], rest=part["rest"])
