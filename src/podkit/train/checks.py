"""Checks that run on the host before XLA sees a batch: the data against what the model and
its losses and metrics can take. Each failure names the shapes, dtypes or values and the fix.

`DataCheck(model_io)(x, y)` checks features against the model's inputs and labels against
each output's loss and metrics. `check_outputs` checks the model's first outputs against what a
probability loss expects — a model that emits logits to a loss that wants probabilities trains
to chance silently in Keras; here it is an error on the first batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from podkit.errors import InputError
from podkit.layers import ACTIVATIONS
from podkit.train.state import resolved
from podkit.train.step import OutputSpec, StepSpec, forward

Shape = tuple[int, ...]


def _shape(shape: Shape) -> str:
    return "(batch" + "".join(f", {d}" for d in shape) + ")"


@dataclasses.dataclass(frozen=True)
class ModelIO:
    """What a built model takes and gives: per input its name, shape and dtype; per output
    its spec (loss, metrics) and shape. Shapes exclude the batch dim."""

    input_names: tuple[str, ...]
    input_shapes: tuple[Shape, ...]
    outputs: tuple[OutputSpec, ...]
    output_names: tuple[str, ...]
    output_shapes: tuple[Shape, ...]
    #: the output shapes for other input shapes (one per input), or an InputError saying why
    #: the network cannot take them (a Flatten before a Dense needs one length): variable
    #: sequence lengths (padded_batch, bucketing) are served by this
    outputs_for: Any = None
    #: per input, (layer name, low, high) of the ids its reading layer takes (Embedding,
    #: CategoryEncoding) or None
    input_ranges: tuple[tuple[str, int, int] | None, ...] = ()


class DataCheck:
    """Refuses (x, y) that the model cannot take, naming the fix."""

    def __init__(self, io: ModelIO) -> None:
        self.io = io

    def __call__(self, x: Any, y: Any) -> None:
        output_shapes = self.features(x)
        self.ids(x)
        if y is not None:
            self.labels(y, output_shapes)

    def ids(self, x: Any) -> None:
        """Ids in the range of the layer that reads them: an id past an Embedding's rows
        reads NaN (or another row) on an accelerator, with no error."""
        io = self.io
        if not any(io.input_ranges):
            return
        xs = self._leaves(x)
        for name, a, span in zip(io.input_names, xs, io.input_ranges, strict=True):
            if span is None:
                continue
            layer, low, high = span
            a = np.asarray(a)
            where = "" if len(io.input_names) == 1 else f" (input {name!r})"
            if a.size == 0:
                continue
            if a.dtype.kind == "f" and not np.all(np.mod(a, 1) == 0):
                raise InputError(f"features{where} of dtype {a.dtype} feed layer {layer!r}, "
                                 "which takes integer ids, and hold fractions: pass ids "
                                 "(x.astype('int32')), or put a Dense layer first for "
                                 "real-valued features.")
            lo, hi = a.min(), a.max()
            if lo < low or hi >= high:
                fix = (f"make its size the vocabulary's (largest id + 1 = {int(hi) + 1}), "
                       "or map unknown ids to a reserved one" if hi >= high else
                       "ids count rows from 0: map the negative ones to a reserved id")
                raise InputError(
                    f"id {lo if lo < low else hi:g}{where} is out of range for layer "
                    f"{layer!r}, which takes ids in [{low}, {high}); XLA would read NaN or "
                    f"another row for it, silently: {fix}.")

    # -- features -----------------------------------------------------------------------------
    def features(self, x: Any) -> tuple[Shape, ...]:
        """Check x; the output shapes the model gives for it."""
        io = self.io
        got, kinds = self._shapes(x)
        if got == tuple(tuple(s) for s in io.input_shapes):
            return io.output_shapes
        if io.outputs_for is not None and all(
                _another_length(g, w, k)
                for g, w, k in zip(got, io.input_shapes, kinds, strict=True)):
            return io.outputs_for(got)  # the network says if it can take it
        for name, g, w in zip(io.input_names, got, io.input_shapes, strict=True):
            _match("features" if len(io.input_names) == 1 else f"input {name!r}", g, w)
        return io.output_shapes

    def _leaves(self, x: Any) -> list[Any]:
        """x's array for each of the model's inputs, checking x's structure."""
        io = self.io
        if len(io.input_names) == 1:
            if isinstance(x, dict | list | tuple):
                leaves = list(x.values()) if isinstance(x, dict) else list(x)
                if len(leaves) != 1:
                    raise InputError(f"x holds {len(leaves)} arrays but the model has one "
                                     "input; pass one array.")
                return leaves
            return [x]
        if isinstance(x, dict):
            missing = [n for n in io.input_names if n not in x]
            if missing:
                raise InputError(f"x lacks inputs {missing}: the model's inputs are "
                                 f"{list(io.input_names)} (x has {sorted(x)}).")
            return [x[n] for n in io.input_names]
        if isinstance(x, list | tuple) and len(x) == len(io.input_names):
            return list(x)
        raise InputError(f"the model has {len(io.input_names)} inputs "
                         f"{list(io.input_names)}; pass x as a list of that many arrays "
                         "or a dict by input name.")

    def _shapes(self, x: Any) -> tuple[tuple[Shape, ...], tuple[str, ...]]:
        """The shape (batch excluded) and dtype kind of each of the model's inputs in x,
        checking its structure."""
        xs = self._leaves(x)
        return (tuple(tuple(np.shape(a)[1:]) for a in xs),
                tuple(np.asarray(a).dtype.kind for a in xs))

    # -- labels -----------------------------------------------------------------------------
    def labels(self, y: Any, output_shapes: tuple[Shape, ...] | None = None) -> None:
        io = self.io
        ys = _per_output(y, io.output_names)
        for o, yo, shape in zip(io.outputs, ys, output_shapes or io.output_shapes,
                                strict=True):
            # Labels equal to the loss's ignore_class are left out of the loss and metrics.
            ignore = getattr(o.loss, "ignore_class", None)
            if o.loss is not None:
                check_labels(yo, shape, o.loss.labels, _loss_kind(o.loss), o.loss.name,
                             o.name, ignore)
            for m in (*o.metrics, *o.weighted_metrics):
                check_labels(yo, shape, m.labels, "metric", m.name, o.name, ignore)


def _another_length(got: Shape, want: Shape, kind: str) -> bool:
    """Whether `got` differs from `want` only in sequence lengths: any dim of integer ids,
    the dims before the features (the last) of float inputs."""
    if len(got) != len(want):
        return False
    varying = [d for d, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    return all(kind in "iu" or d < len(want) - 1 for d in varying)


def _match(what: str, got: Shape, want: Shape) -> None:
    if tuple(got) != tuple(want):
        raise InputError(f"{what} of shape {_shape(got)} do not match the model, built for "
                         f"{_shape(want)}; reshape the data or build a new model for it.")


def _per_output(y: Any, names: tuple[str, ...]) -> list[Any]:
    if len(names) == 1:
        if isinstance(y, dict) and len(y) == 1:
            return list(y.values())
        return [y]
    if isinstance(y, dict):
        missing = [n for n in names if n not in y]
        if missing:
            raise InputError(f"y lacks labels for outputs {missing}; the model's outputs are "
                             f"{list(names)} (y has {sorted(y)}).")
        return [y[n] for n in names]
    if isinstance(y, list | tuple) and len(y) == len(names):
        return list(y)
    raise InputError(f"the model has {len(names)} outputs {list(names)}; pass y as a list of "
                     "that many arrays or a dict by output name.")


def _loss_kind(loss: Any) -> str:
    if loss.expects == "softmax":
        return "categorical"
    if loss.expects == "sigmoid":
        return "binary"
    return "regression"


def check_labels(y: Any, out: Shape, labels: str, kind: str, name: str, output: str,
                 ignore: int | None = None) -> None:
    """Labels `y` (batch first) against an output of shape `out` for a loss or metric; labels
    equal to `ignore` (the loss's ignore_class) are not class ids."""
    if labels == "any":
        return
    y = np.asarray(y)
    where = f" for output {output!r}" if output else ""
    if labels == "two_class_or_dense":  # AUC: class ids against two columns, or 0/1 labels
        if out and out[-1] == 2 and y.shape[1:] in (out[:-1], (*out[:-1], 1)):
            if y.size and (y.min() < 0 or y.max() > 1):
                raise InputError(f"labels{where} range over [{y.min():g}, {y.max():g}] but "
                                 f"{name} scores two classes: labels must be 0 or 1.")
            return
        labels = "dense"
    per = y.shape[1:]
    classes = out[-1] if out else 1
    if labels == "sparse":
        if per not in (out[:-1], (*out[:-1], 1)):
            if per == out and classes > 1:
                raise InputError(
                    f"labels{where} have shape {_shape(per)}, one-hot rows, but {name} takes "
                    f"class ids of shape {_shape(out[:-1])}: use categorical_crossentropy for "
                    "one-hot labels, or pass np.argmax(y, axis=-1).")
            raise InputError(
                f"labels{where} of shape {_shape(per)} do not fit outputs of shape "
                f"{_shape(out)}: {name} needs one class id per {_shape(out[:-1])}."
                + (" The model gives one prediction per position of its input (Dense acts on "
                   "the last dim only): add pk.layers.Flatten() before the Dense layers, or "
                   f"give labels of shape {_shape(out[:-1])}." if len(out) > 1 else ""))
        ids = y if ignore is None else y[y != ignore]
        if ids.size and not np.issubdtype(y.dtype, np.integer) and \
                not np.all(np.mod(ids, 1) == 0):
            raise InputError(f"labels{where} of dtype {y.dtype} are not class ids; {name} "
                             f"needs integer labels in [0, {classes}).")
        if ids.size and (ids.min() < 0 or ids.max() >= classes):
            bad = ids.min() if ids.min() < 0 else ids.max()
            also = "" if ignore is None else f" (or {ignore}, the loss's ignore_class)"
            raise InputError(
                f"label {bad:g}{where} is out of range for {classes} classes; {name} needs "
                f"labels in [0, {classes}){also} - check the data or the size of the last "
                "layer.")
        return
    # dense: one label value per output value
    size, want = int(np.prod(per)), int(np.prod(out))
    if kind == "categorical" and per != out:
        if per in (out[:-1], (*out[:-1], 1)) and classes > 1:
            raise InputError(
                f"labels{where} have shape {_shape(per)}, class ids, but {name} takes one-hot "
                f"rows of shape {_shape(out)}: use sparse_categorical_crossentropy for class "
                "ids (as Keras), or one-hot the labels (np.eye(classes)[y]).")
        raise InputError(f"labels{where} of shape {_shape(per)} do not fit outputs of shape "
                         f"{_shape(out)}; {name} needs labels of the outputs' shape.")
    if size != want:
        if kind == "binary":
            raise InputError(
                f"{name}{where} compares each output with a 0/1 label, but the model gives "
                f"{want} outputs per example and the labels have shape {_shape(per)}: for one "
                "yes/no answer use Dense(1, activation='sigmoid'); for classes use "
                f"sparse_categorical_crossentropy with Dense({want}, activation='softmax').")
        fix = ("for a classifier, use 'accuracy' or 'sparse_categorical_accuracy'"
               if kind == "metric" and size == 1 else "make the last layer's units match "
               "the labels")
        raise InputError(f"{name}{where} compares outputs of shape {_shape(out)} with labels of "
                         f"shape {_shape(per)} ({want} values against {size}); {fix}.")
    if kind == "binary" and y.size and (y.min() < 0 or y.max() > 1):
        raise InputError(f"labels{where} range over [{y.min():g}, {y.max():g}] but {name} "
                         "needs values in [0, 1].")


def check_outputs(outputs: tuple[OutputSpec, ...], preds: tuple[np.ndarray, ...]) -> None:
    """The model's outputs on real data against what each probability loss expects."""
    for o, p in zip(outputs, preds, strict=True):
        loss = o.loss
        if loss is None or loss.expects is None or loss.from_logits or o.fused:
            continue
        # Rounding allowance of the output's own dtype (a bf16 softmax sums to 1 +- 0.005).
        dtype = np.asarray(p).dtype
        tol = max(1e-3, 4 * float(jnp.finfo(dtype).eps)) if jnp.issubdtype(
            dtype, jnp.floating) else 1e-3
        p = np.asarray(p, np.float64)
        where = f" of output {o.name!r}" if o.name else ""
        lo, hi = float(p.min()), float(p.max())
        ok = lo >= -tol and hi <= 1 + tol
        sums = p.sum(axis=-1) if loss.expects == "softmax" else None
        if sums is not None and ok and p.shape[-1] > 1:
            ok = bool(np.all(np.abs(sums - 1) < tol * p.shape[-1] ** 0.5))
        if ok:
            continue
        cls = type(loss).__name__
        what = (f"values in [{lo:.5g}, {hi:.5g}]" if sums is None else
                f"values in [{lo:.5g}, {hi:.5g}], rows summing to [{sums.min():.5g}, "
                f"{sums.max():.5g}]")
        act = loss.expects
        raise InputError(
            f"the model's outputs{where} on the first batch are not probabilities ({what}), "
            f"but {loss.name} expects probabilities. If the model emits logits (no final "
            f"{act}), pass loss=pk.losses.{cls}(from_logits=True); or end the model with "
            f"activation='{act}'.")


def host_preds(preds: Any) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(jax.device_get(p)) for p in preds)


def check_probabilities(spec: StepSpec, state: Any, x: Any, replicated: Any) -> None:
    """A probability loss on outputs that are not probabilities is an error on the first
    batch: one small forward pass over this process's first rows `x` (with several
    processes, everyone's rows: the same value on every process, never one process's array
    put onto the whole mesh)."""
    outputs = spec.outputs
    if not any(o.loss is not None and o.loss.expects and not o.loss.from_logits
               and not o.fused for o in outputs):
        return
    state = resolved(state)  # a PendingState is waited for only when there is a check
    x = jax.tree.map(np.asarray, x)
    if jax.process_count() > 1:
        rows = min(multihost_utils.process_allgather(
            np.asarray([len(jax.tree.leaves(x)[0])])).ravel())
        x = jax.tree.map(lambda a: np.asarray(multihost_utils.process_allgather(
            a[:rows], tiled=True)), x)
    preds = jax.jit(lambda s, xb: forward(spec, s, xb, False)[0])(
        state, jax.device_put(x, replicated))
    preds = tuple(ACTIVATIONS[o.fused](p) if o.fused else p
                  for o, p in zip(outputs, preds, strict=True))
    check_outputs(outputs, host_preds(preds))
