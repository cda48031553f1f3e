"""Saving and loading models: JSON for what a model is, Orbax for its arrays. No pickle.

    model.save("runs/m")              runs/m/model.json   architecture, compile config, inputs
                                      runs/m/state/       the TrainState (Orbax)
    pk.models.load_model("runs/m")    the same model on the current strategy and devices
    model.save_weights("runs/w")      variables only (no optimizer state)
    model.load_weights("runs/w")      into a model built from the same code

The state is written as a flat dict of arrays keyed by path ("params.layers.0.kernel"), and
read back into the abstract state of the loading model — shapes, dtypes and *its* shardings —
so a model saved on 8 devices loads on 1 (or on another mesh) and Orbax reshards on the way
in. Reading never executes code from the files: the architecture is rebuilt from layer
configs by name, and a model made from Python code (an NNX module or factory) says so and
asks for its code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from podkit.cluster import is_lead_process
from podkit.errors import ConfigError, InputError
from podkit.train import state as state_lib

if TYPE_CHECKING:
    from podkit.model import Model

FORMAT = "podkit.model/1"
WEIGHTS_FORMAT = "podkit.weights/1"


# -- state <-> flat dict of arrays ----------------------------------------------------------------
def _key(path: tuple) -> str:
    return ".".join(part.replace(".", "%2E") for part in state_lib.path_parts(path))


def flatten(tree: Any) -> dict[str, Any]:
    """A pytree as {path: array}; typed PRNG keys as their raw uint32 data."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype,
                                                                 jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        out[_key(path)] = leaf
    return out


def abstract_targets(abstract: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(targets for Orbax, typed-key dtypes by path) from an abstract tree."""
    targets, keys = {}, {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        name = _key(path)
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            keys[name] = leaf.dtype
            data = jax.eval_shape(jax.random.key_data, leaf)
            leaf = jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding)
        targets[name] = leaf
    return targets, keys


def _key_impl(abstract_key: jax.ShapeDtypeStruct) -> Any:
    """The PRNG implementation of an abstract typed key (read while tracing it)."""
    found = []
    jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)), abstract_key)
    return found[0]


def unflatten(abstract: Any, flat: dict[str, Any]) -> Any:
    _, keys = abstract_targets(abstract)
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        name = _key(path)
        value = flat[name]
        if name in keys:
            value = jax.random.wrap_key_data(value, impl=_key_impl(leaf))
        leaves.append(value)
    return jax.tree.unflatten(jax.tree.structure(abstract), leaves)


def write_arrays(directory: Path, tree: Any) -> None:
    import orbax.checkpoint as ocp

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(directory.absolute(), flatten(tree), force=True)
    checkpointer.wait_until_finished()


def read_arrays(directory: Path, abstract: Any, partial: bool = False) -> Any:
    """Read into `abstract` (shapes, dtypes, shardings), checking shapes and dtypes first.
    `partial`: the files may hold more (e.g. optimizer state), which is left unread."""
    import orbax.checkpoint as ocp

    targets, _ = abstract_targets(abstract)
    check_saved(directory, targets, partial)
    flat = ocp.PyTreeCheckpointer().restore(directory.absolute(), args=ocp.args.PyTreeRestore(
        item=targets, restore_args=ocp.checkpoint_utils.construct_restore_args(targets),
        partial_restore=partial))
    return unflatten(abstract, flat)


def saved_arrays(directory: Path) -> dict[str, Any]:
    """{path: metadata (shape, dtype)} of the arrays Orbax wrote in `directory`."""
    import orbax.checkpoint as ocp

    try:
        saved = ocp.StandardCheckpointer().metadata(directory.absolute())
        saved = getattr(saved, "item_metadata", saved)
        return dict(saved.tree if hasattr(saved, "tree") else saved)
    except Exception as e:  # noqa: BLE001 - any unreadable metadata is the same error
        raise InputError(f"{directory} does not hold readable podkit arrays ({e}).") from None


def check_saved(directory: Path, targets: dict[str, Any], partial: bool = False) -> None:
    """The arrays in `directory` are the ones `targets` asks for, with the same shapes and
    dtypes (checked before Orbax reads a byte, so a mismatch names the array)."""
    saved = saved_arrays(directory)
    missing = sorted(set(targets) - set(saved))
    extra = [] if partial else sorted(set(saved) - set(targets))
    if missing or extra:
        raise InputError(
            f"the arrays in {directory} do not fit this model: missing {missing[:5]}, "
            f"unexpected {extra[:5]}. Save and load the same architecture.")
    for name, target in targets.items():
        meta = saved[name]
        shape = tuple(getattr(meta, "shape", ()))
        dtype = getattr(meta, "dtype", target.dtype)
        if shape != tuple(target.shape) or np.dtype(dtype) != np.dtype(target.dtype):
            raise InputError(f"{name} in {directory} has shape {shape} and dtype {dtype}; this "
                             f"model needs {tuple(target.shape)} {np.dtype(target.dtype)}.")


# -- models ---------------------------------------------------------------------------------------
def _inputs_record(model: Model) -> dict:
    spec = model.input_spec
    return {"names": list(spec.names), "shapes": [list(s) for s in spec.shapes],
            "dtypes": [np.dtype(d).name for d in spec.dtypes], "structure": spec.structure}


def save_model(model: Model, path: str | os.PathLike) -> None:
    import podkit

    _require_built(model, "save()")
    path = Path(path)
    record: dict[str, Any] = {"format": FORMAT, "podkit": podkit.__version__,
                              "class_name": model.kind, "name": model.name,
                              "inputs": _inputs_record(model)}
    try:
        record["config"] = model.get_config()
    except ConfigError:
        record["config"] = None
        import warnings

        warnings.warn(f"{model.name}: saving weights and optimizer state only; the "
                      "architecture is Python code (an NNX module or factory), so load it with "
                      "model.load_weights(path) into a model built from that code.",
                      UserWarning, stacklevel=3)
    try:
        record["compile"] = model.compile_config()
    except ConfigError as e:
        record["compile"] = None
        record["compile_note"] = str(e)
    write_arrays(path / "state", model.state)
    if is_lead_process():
        (path / "model.json").write_text(json.dumps(record, indent=2) + "\n")


def _read_record(path: Path) -> dict:
    for name in ("model.json", "weights.json"):
        f = path / name
        if f.is_file():
            try:
                record = json.loads(f.read_text())
            except json.JSONDecodeError as e:
                raise InputError(f"{f} is not valid JSON ({e}); the save is damaged.") from None
            if record.get("format") not in (FORMAT, WEIGHTS_FORMAT):
                raise InputError(f"{f} has format {record.get('format')!r}; this podkit reads "
                                 f"{FORMAT!r}.")
            return record
    raise InputError(f"{path} holds no saved podkit model (no model.json or weights.json); "
                     "pass a directory written by model.save() or model.save_weights().")


def _require_built(model: Model, what: str) -> None:
    if not model.built:
        raise ConfigError(f"{what} needs a built model: fit it once, or call "
                          "model.build(input_shape) after compile().")


def load_model(path: str | os.PathLike, compile: bool = True) -> Model:  # noqa: A002
    """The model saved at `path`, compiled and with its whole state, on the current strategy
    (any device count). `compile=False`: the architecture and its variables, ready for
    predict(); compile() it (with a fresh optimizer) to train."""
    from podkit.model import Model

    path = Path(path)
    record = _read_record(path)
    if record["format"] != FORMAT:
        raise InputError(f"{path} holds weights only (save_weights); build the model from code "
                         "and call model.load_weights(path).")
    if record.get("config") is None:
        raise ConfigError(f"{path}: this model was built from Python code (an NNX module or "
                          "factory), so its architecture was not saved. Build it from that "
                          "code, compile it, and call model.load_weights(path).")
    model = Model.from_config({"class_name": record["class_name"], "config": record["config"]})
    if not compile:
        load_weights(model, path)
        return model
    if record.get("compile") is None:
        raise ConfigError(f"{path}: the compile settings were not saved "
                          f"({record.get('compile_note', 'not compiled')}); load with "
                          "compile=False, compile the model, then call model.load_weights(path).")
    _compile_from(model, record["compile"])
    model.build_for(_input_spec(record),  # the state comes from the files, no fresh init
                    initial_state=lambda layout: read_arrays(path / "state", layout.abstract))
    return model


def _compile_from(model: Model, c: dict) -> None:
    from podkit import losses, metrics, optimizers

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
    from podkit.architectures import InputSpec

    inputs = record["inputs"]
    return InputSpec(tuple(inputs["names"]), tuple(tuple(s) for s in inputs["shapes"]),
                     tuple(np.dtype(d) for d in inputs["dtypes"]),
                     inputs.get("structure", "single" if len(inputs["names"]) == 1 else "list"))


def save_weights(model: Model, path: str | os.PathLike) -> None:
    import podkit

    _require_built(model, "save_weights()")
    path = Path(path)
    write_arrays(path / "state", {"params": model.state.params, "rest": model.state.rest})
    if is_lead_process():
        (path / "weights.json").write_text(json.dumps(
            {"format": WEIGHTS_FORMAT, "podkit": podkit.__version__, "name": model.name,
             "inputs": _inputs_record(model)}, indent=2) + "\n")


def load_weights(model: Model, path: str | os.PathLike) -> None:
    """The variables saved at `path` (by save() or save_weights()) into this model: its
    parameters and other variables; its optimizer state stays its own."""
    path = Path(path)
    record = _read_record(path)
    if not model.built:
        model.build_for(_input_spec(record))
    abstract = model.layout.abstract
    part = read_arrays(path / "state", {"params": abstract.params, "rest": abstract.rest},
                       partial=True)
    model.state = model.state.replace(params=part["params"], rest=part["rest"])
