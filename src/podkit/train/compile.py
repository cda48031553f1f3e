"""compile()'s arguments resolved per output, as Keras's `compile_utils`: which loss, weight,
metrics and weighted metrics each output gets, the checks on them, and their serialization.

    config = resolve(optimizer="adam", loss="mse", ...)      # CompileConfig, arguments checked
    outputs = output_specs(config, names, activations, logits_arg)   # one OutputSpec each
    saved = serialize(config, outputs)                       # model.json's "compile"

Nothing here knows the model: the network is described by its output names, final activations
and whether it produces logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from podkit import losses as losses_lib
from podkit import metrics as metrics_lib
from podkit import optimizers as optimizers_lib
from podkit.errors import ConfigError
from podkit.train.auto_steps import AUTO
from podkit.train.step import OutputSpec

_PROBABILITY_ACTIVATIONS = frozenset({"softmax", "sigmoid"})


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    """What compile() was given, resolved (objects) and as spelled (for saving)."""

    optimizer: optimizers_lib.Optimizer
    loss: Any  # as given: name, object, callable, list or dict
    loss_weights: Any
    metrics: Any
    weighted_metrics: Any
    steps_per_execution: int | str  # or "auto" (podkit.train.auto_steps)
    jit: bool
    microbatches: int = 1
    grad_norm: bool | None = None  # None: by the model's size (train.step.GRAD_NORM_PARAMS)


def resolve(optimizer: Any, loss: Any, loss_weights: Any, metrics: Any, weighted_metrics: Any,
            run_eagerly: bool, steps_per_execution: int | str, jit_compile: bool | str, jit: bool,
            learning_rate: Any, microbatches: int, unknown: Mapping[str, Any],
            grad_norm: bool | None = None) -> CompileConfig:
    """compile()'s arguments checked and resolved (the optimizer becomes an object)."""
    if unknown:
        hint = (" from_logits belongs to the loss: loss=pk.losses."
                "SparseCategoricalCrossentropy(from_logits=True)."
                if "from_logits" in unknown else "")
        raise ConfigError(f"compile() got unexpected arguments {sorted(unknown)}.{hint}")
    if loss is None:
        raise ConfigError(
            f"compile() needs a loss; valid names: {', '.join(sorted(losses_lib.LOSSES))}, "
            "a pk.losses object, or a callable (y_true, y_pred) -> per-example losses.")
    if steps_per_execution != AUTO and (
            isinstance(steps_per_execution, bool) or not isinstance(steps_per_execution, int)
            or steps_per_execution < 1):
        raise ConfigError(f"steps_per_execution={steps_per_execution!r} must be a positive "
                          "int, or 'auto' (the default: podkit chooses, see docs/keras.md).")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) \
            or microbatches < 1:
        raise ConfigError(f"microbatches={microbatches!r} must be a positive int (1: no "
                          "gradient accumulation).")
    if grad_norm not in (None, True, False):
        raise ConfigError(f"grad_norm={grad_norm!r}: pass True, False or None (measured for "
                          "models of a million parameters or more).")
    return CompileConfig(optimizers_lib.get(optimizer, learning_rate), loss, loss_weights,
                         metrics, weighted_metrics, steps_per_execution,
                         jit and not run_eagerly and jit_compile is not False, microbatches,
                         grad_norm)


def output_specs(c: CompileConfig, names: tuple[str, ...], activations: tuple[Any, ...],
                 logits_arg: bool) -> tuple[OutputSpec, ...]:
    """One OutputSpec per output of a network with these output `names` and final
    `activations` (`logits_arg`: the network can give logits instead, so a loss that takes
    probabilities is fused with the activation)."""
    losses = per_output(c.loss, names, "loss", allow_single=True)
    weights = per_output(c.loss_weights, names, "loss_weights", allow_single=False)
    metrics = per_output(c.metrics, names, "metrics", allow_single=False, listy=True)
    weighted = per_output(c.weighted_metrics, names, "weighted_metrics",
                          allow_single=False, listy=True)
    out = []
    for i, name in enumerate(names):
        loss = None if losses[i] is None else losses_lib.get(losses[i])
        act = activations[i] if logits_arg else None
        if loss is not None and loss.from_logits and act in _PROBABILITY_ACTIVATIONS:
            raise ConfigError(
                f"the model's output{f' {name!r}' if name else ''} ends in a {act}, but "
                f"{loss!r} takes logits: remove the final activation (Dense(..., "
                "activation=None)) or pass from_logits=False.")
        if loss is not None and loss.reduction in (None, "none"):
            raise ConfigError(
                f"{loss!r} has reduction={loss.reduction!r}: training needs one loss value "
                "per batch (Keras on JAX fails here too, taking the gradient of a vector). "
                "Use reduction=\"sum_over_batch_size\" (the default), \"sum\", \"mean\" "
                "or \"mean_with_sample_weight\".")
        fused = act if (loss is not None and not loss.from_logits
                        and act == loss.expects) else None
        w = 1.0 if weights[i] is None else weights[i]
        if not isinstance(w, int | float):
            raise ConfigError(f"loss_weights={c.loss_weights!r}: weights are numbers.")
        out.append(OutputSpec(
            name=name, loss=loss, loss_weight=float(w),
            metrics=metrics_lib.get_all(metrics[i]),
            weighted_metrics=metrics_lib.get_all(weighted[i]), fused=fused))
    if all(o.loss is None for o in out):
        raise ConfigError("compile(loss=...) gives no output a loss; nothing to train.")
    keys = [o.key(m.name) for o in out for m in (*o.metrics, *o.weighted_metrics)]
    if len(set(keys)) < len(keys) or {"loss"} & set(keys):
        raise ConfigError(f"metric names {keys} repeat (or clash with 'loss'); give each "
                          "metric object a distinct name=.")
    return tuple(out)


def serialize(c: CompileConfig, outputs: tuple[OutputSpec, ...]) -> dict:
    """The compile config as model.json records it (names and configs, no objects)."""
    return {"optimizer": optimizers_lib.serialize(c.optimizer),
            "loss": _serialize_per_output(c.loss, losses_lib.get, losses_lib.serialize),
            "loss_weights": c.loss_weights,
            "metrics": _serialize_metrics(c.metrics, outputs, "metrics"),
            "weighted_metrics": _serialize_metrics(c.weighted_metrics, outputs,
                                                   "weighted_metrics"),
            "steps_per_execution": c.steps_per_execution, "jit": c.jit,
            "microbatches": c.microbatches}


def per_output(value: Any, names: tuple[str, ...], what: str, allow_single: bool,
               listy: bool = False) -> list[Any]:
    """compile()'s per-output arguments: one value for all (losses), a list in output order,
    or a dict by output name."""
    n = len(names)
    if value is None:
        return [None] * n
    if isinstance(value, Mapping):
        if n == 1 and len(value) == 1:  # one output: its one entry, whatever its key
            value = next(iter(value.values()))
            return [[value] if listy and isinstance(value, str | metrics_lib.Metric) else value]
        unknown = [k for k in value if k not in names]
        if unknown or n == 1:
            raise ConfigError(f"{what} names outputs {unknown or list(value)}; the model's "
                              f"outputs are {[nm for nm in names if nm] or ['(one, unnamed)']}.")
        return [[v] if listy and isinstance(v, str | metrics_lib.Metric) else v
                for v in (value.get(nm) for nm in names)]
    if n == 1:
        return [value]
    if isinstance(value, list | tuple):
        if listy and all(not isinstance(v, list | tuple) for v in value):
            raise ConfigError(f"{what}={value!r} for a model with {n} outputs: pass a list of "
                              f"{n} lists (one per output) or a dict by output name {list(names)}.")
        if len(value) != n:
            raise ConfigError(f"{what} has {len(value)} entries for {n} outputs {list(names)}.")
        return list(value)
    if allow_single:
        return [value] * n
    raise ConfigError(f"{what}={value!r} for a model with {n} outputs: pass a list or a dict by "
                      f"output name {list(names)}.")


def _serialize_per_output(value: Any, get: Callable, serialize_one: Callable) -> Any:
    if isinstance(value, Mapping):
        return {k: None if v is None else serialize_one(get(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [None if v is None else serialize_one(get(v)) for v in value]
    return serialize_one(get(value))


def _serialize_metrics(value: Any, outputs: tuple[OutputSpec, ...], what: str) -> Any:
    if value is None:
        return None

    def one(spelled: Any, output: OutputSpec) -> Any:
        objs = getattr(output, what)
        if not isinstance(spelled, list | tuple):  # metrics={"out": "accuracy"}: one metric
            spelled = [spelled]
        return [metrics_lib.serialize(m, s) for m, s in zip(objs, spelled, strict=True)]

    if isinstance(value, Mapping):
        by = {o.name: o for o in outputs}
        return {k: one(v, by[k]) for k, v in value.items()}
    if len(outputs) > 1:
        return [one(v, o) for v, o in zip(value, outputs, strict=True)]
    return one(value, outputs[0])
