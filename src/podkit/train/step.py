"""Pure step builders over a TrainState, compiled once per input spec.

    train:    (state, sums, inputs) -> (state, sums)     k optimizer steps (lax.scan)
    evaluate: (state, sums, inputs) -> sums

`sums` cross the call packed (podkit.train.sums: one vector per dtype); inside, a tree.
    predict:  (state, inputs) -> outputs (k, B, ...)

k is the leading dim of the inputs. Inputs come in two types, chosen by the feed and invisible
to the step's maths (podkit.train.feeds.inputs):
  * BatchInputs(x, y, sw, mask):  fed batches, x and y (k, B, ...), sw and mask (k, B)
  * StagedInputs(data, idx):  the whole dataset ({"x", "y"[, "sw"]}) lives on the devices and
    each step gathers its rows there by (k, B) row ids; a negative id -(r + 1) is padding that
    repeats real row r.
`mask` is 1 for real examples and 0 for padding, so a padded batch keeps its shape (no
recompiles) and contributes nothing; `sw` is the sample weight (sample_weight x class_weight).

Losses reduce as Keras's "sum_over_batch_size": sum(loss * sw) / (real examples). An output
that carries a timestep mask (Embedding(mask_zero=True) or Masking through per-step layers)
is weighted per step as Keras weights it: its loss is sum(loss * mask * sw) / (real steps),
its metrics count real steps only. `sums` are additive device totals (podkit.metrics):
nothing is fetched per step.

The train step asks every module that has a `lazy_logits` attribute for lazy logits
(`module.train(lazy_logits=True)`; evaluate and predict set it False): a language model then
returns LMLogits(hidden, head) and its loss and accuracy read the vocabulary a chunk at a time
(podkit.kernels.cross_entropy); a loss or metric that cannot gets them materialized.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from podkit import optimizers as optimizers_lib
from podkit.errors import ConfigError
from podkit.kernels.cross_entropy import LMLogits
from podkit.layers import ACTIVATIONS
from podkit.layers.lookup import Tape, recording
from podkit.losses import Loss
from podkit.metrics import LossMean, Metric
from podkit.train import sparse
from podkit.train import state as state_lib
from podkit.train.feeds.inputs import StagedInputs, StepInputs
from podkit.train.state import TrainState
from podkit.train.sums import SumsLayout

Sums = dict[str, dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output of the model: its loss, metrics, and whether its final activation is folded
    into the loss (the module is then asked for logits)."""

    name: str  # "" for a single-output model: keys are then "loss", "accuracy"
    loss: Loss | None
    loss_weight: float = 1.0
    metrics: tuple[Metric, ...] = ()
    weighted_metrics: tuple[Metric, ...] = ()
    fused: str | None = None  # "softmax" | "sigmoid" applied here, not in the module

    def key(self, what: str) -> str:
        return f"{self.name}_{what}" if self.name else what

    def for_metrics(self, out: jax.Array) -> jax.Array:
        """What the metrics see: probabilities. A fused activation is applied here; so is
        the activation a from_logits loss implies (Keras would hand the metrics logits, and
        accuracy, AUC, precision and recall would compare them with 0.5). LMLogits stay lazy,
        the activation recorded for when they are materialized."""
        act = self.fused
        if act is None and self.loss is not None and self.loss.from_logits:
            act = self.loss.expects
        if act is None:
            return out
        if isinstance(out, LMLogits):
            return out.with_activation(ACTIVATIONS[act])
        return ACTIVATIONS[act](out)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything a step needs that is not an array."""

    graphdef: Any
    outputs: tuple[OutputSpec, ...]
    output_names: tuple[str, ...]  # how y arrives when it is a dict
    tx: optax.GradientTransformation
    batch_sharding: NamedSharding  # of one step's batch dim
    logits_arg: bool  # the module takes `logits=` (podkit-built modules)
    microbatches: int = 1  # each batch in this many sequential parts, gradients summed
    # Parameters on the logical axis `table`, by name, and where their rows live: read through
    # pk.layers.lookup, they are updated row-sparsely (podkit.train.sparse).
    tables: Mapping[str, sparse.TableLayout] = dataclasses.field(default_factory=dict)
    # The global gradient norm of each execution's last step, in the sums (GRAD_NORM_PARAMS).
    grad_norm: bool = True
    # True per frozen parameter (a layer with trainable=False, a base weight under LoRA), or
    # None: their gradients are never computed (stop_gradient), not merely not applied.
    frozen: Any = None

    def entries(self) -> dict[str, Metric]:
        """Every logged value by its key, in Keras's order: loss, output losses, metrics."""
        out: dict[str, Metric] = {"loss": LossMean("loss")}
        if len(self.outputs) > 1:
            for o in self.outputs:
                if o.loss is not None:
                    out[o.key("loss")] = LossMean(o.key("loss"))
        for o in self.outputs:
            for m in (*o.metrics, *o.weighted_metrics):
                out[o.key(m.name)] = m
        return out


GRAD_NORM_PARAMS = 1_000_000
"""compile(grad_norm=None) measures the gradient norm for models of at least this many
parameters: below, the conditional it needs in every step costs a few percent of a tiny
model's step time on CPU (measured on the seed MLP, 9.6k parameters)."""

STEP_SUMS = "_steps"
"""The sums' entry the train step adds: per execution, the global gradient norm of its last
step and the learning rate after it (times its steps); window means at log points, not a
metric, so not in `results`. One norm per execution: on a model of a few thousand
parameters the extra reductions on every step cost ~10% of its time."""


def zero_tree(spec: StepSpec) -> Sums:
    """Every logged value's sums before the first batch, as a tree of numpy zeros (the
    layout checkpoints keep; the steps take and return them packed, podkit.train.sums)."""
    sums = {key: m.zeros() for key, m in spec.entries().items()}
    sums[STEP_SUMS] = {"count": np.zeros((), np.float32),
                       "grad_norm": np.zeros((), np.float32),
                       "norms": np.zeros((), np.float32),
                       "learning_rate": np.zeros((), np.float32)}
    return sums


def sums_layout(spec: StepSpec) -> SumsLayout:
    return SumsLayout.of(zero_tree(spec))


def step_results(sums: dict) -> dict[str, float]:
    """Host values of the train step's own sums (zeros before any step): grad_norm (a mean)
    and learning_rate (the rate the latest step used)."""
    steps = sums.get(STEP_SUMS)
    if steps is None:
        return {}
    n, norms = float(steps["count"]), float(steps.get("norms", steps["count"]))
    if n <= 0:
        return {}
    out = {"learning_rate": float(steps["learning_rate"]) / n}
    if norms > 0:
        out["grad_norm"] = float(steps["grad_norm"]) / norms
    return out


def results(spec: StepSpec, sums: dict) -> dict[str, float]:
    """Host values from (fetched) sums."""
    return {key: m.result(sums[key]) for key, m in spec.entries().items()}


def _gather(inputs: StepInputs, i: jax.Array, spec: StepSpec
            ) -> tuple[Any, Any, jax.Array, jax.Array]:
    """The batch of step i of this execution: x, y, sample weights, mask."""
    constrain = lambda a: jax.lax.with_sharding_constraint(a, spec.batch_sharding)
    if isinstance(inputs, StagedInputs):
        ids = inputs.idx[i]
        mask = (ids >= 0).astype(jnp.float32)
        rows = jnp.where(ids >= 0, ids, -ids - 1)  # padding: -(row + 1), a real row repeated
        data = inputs.data
        x, y = jax.tree.map(lambda a: constrain(a[rows]), (data["x"], data["y"]))
        # The staged arrays hold "sw" only when there are weights (no ones array on device).
        sw = data["sw"][rows] if "sw" in data else None
        sw = mask if sw is None else sw * mask.reshape(mask.shape + (1,) * (sw.ndim - 1))
        return x, y, sw, mask
    x, y = jax.tree.map(lambda a: a[i], (inputs.x, inputs.y))
    return x, y, inputs.sw[i], inputs.mask[i]


def _real_counts(inputs: StepInputs) -> jax.Array:
    """(k,) float32: the real (unpadded) examples of each step's batch."""
    if isinstance(inputs, StagedInputs):
        return (inputs.idx >= 0).sum(axis=1).astype(jnp.float32)
    return inputs.mask.sum(axis=1).astype(jnp.float32)


def _as_tuple(value: Any, names: tuple[str, ...]) -> tuple:
    """A model's outputs (or labels) as a tuple in output order."""
    if isinstance(value, dict):
        if len(names) == 1 and len(value) == 1:  # one output, keyed by its layer's name
            return tuple(value.values())
        return tuple(value[n] for n in names)
    if isinstance(value, tuple | list) and len(names) > 1:
        return tuple(value)
    return (value,)


def forward(spec: StepSpec, state: TrainState, x: Any, training: bool, params: Any = None,
            mask: jax.Array | None = None) -> tuple[tuple, dict, dict, jax.Array, tuple]:
    """(outputs as a tuple, new rest, new rng, regularization penalty, each output's
    timestep mask or None). Fused outputs come as logits. podkit's own modules also take the
    padding mask (batch statistics leave padding out), report their layers' regularization
    penalty and the masks of their outputs."""
    return _apply(spec, _module(spec, state, training, params), x, mask)


def _module(spec: StepSpec, state: TrainState, training: bool, params: Any = None
            ) -> nnx.Module:
    module = state_lib.merge(spec.graphdef, state.params if params is None else params,
                             state.rest, state.rng)
    # Only the train step takes lazy logits: predict and evaluate give what they always gave.
    module.train(lazy_logits=True) if training else module.eval(lazy_logits=False)
    return module


def _apply(spec: StepSpec, module: nnx.Module, x: Any, mask: jax.Array | None
           ) -> tuple[tuple, dict, dict, jax.Array, tuple]:
    step_masks = None
    if spec.logits_arg:
        out, step_masks = module(x, logits=tuple(o.fused is not None for o in spec.outputs),
                                 mask=mask, with_masks=True)
        penalty = module.penalty()
    else:
        out = module(x)
        penalty = jnp.zeros((), jnp.float32)
    rest, rng = state_lib.variables_of(module)
    # Losses and metrics in float32 whatever the compute precision (mixed_bfloat16 models
    # give bfloat16 logits; a bf16 log-softmax over a vocabulary loses the loss's digits).
    # LMLogits are float32 by construction.
    outs = tuple(o.astype(jnp.float32) if not isinstance(o, LMLogits)
                 and jnp.issubdtype(o.dtype, jnp.floating) else o
                 for o in _as_tuple(out, spec.output_names))
    return outs, rest, rng, penalty, step_masks or (None,) * len(outs)


def _taped(spec: StepSpec, state: TrainState, x: Any, params: Any, mask: jax.Array,
           deltas: dict | None) -> tuple[tuple, Tape]:
    """The training forward pass with the tables' lookups recorded (see lookup.Tape)."""
    module = _module(spec, state, True, params)
    with recording(Tape(sparse.variable_names(module, spec.tables), deltas)) as tape:
        result = _apply(spec, module, x, mask)
    return result, tape


def _lookup_shapes(spec: StepSpec, state: TrainState, x: Any, mask: jax.Array) -> dict:
    """The rows each table lookup of a forward pass reads (shapes only: traced, not run)."""
    found: dict = {}

    def trace(params: Any) -> jax.Array:
        found.update(_taped(spec, state, x, params, mask, None)[1].rows)
        return jnp.zeros(())

    jax.eval_shape(trace, state.params)
    return found


def _losses(spec: StepSpec, outs: tuple, ys: tuple, sw: jax.Array, step_masks: tuple,
            mask: jax.Array, scales: tuple) -> tuple[jax.Array, list[jax.Array | None]]:
    """The total weighted per-example loss (B,) and each output's (None without a loss).
    `sw`: a weight per example (B,), or per timestep (B, T). `scales`: each output's
    reduction over the whole batch (_loss_scales)."""
    total = jnp.zeros(mask.shape, jnp.float32)
    each = []
    for o, out, y, steps, scale in zip(spec.outputs, outs, ys, step_masks, scales,
                                       strict=True):
        if o.loss is None:
            each.append(None)
            continue
        from_logits = True if o.fused else None
        if steps is not None and sw.ndim == 2:
            per = _masked_loss(o, out, y, steps, mask, from_logits, sw)
        elif steps is not None:
            per = _masked_loss(o, out, y, steps, mask, from_logits) * sw
        else:
            if isinstance(out, LMLogits) and not o.loss.lazy_logits:
                out = out.materialize()
            per = o.loss.per_example(y, out, from_logits=from_logits) * sw
        if scale is not None:
            per = per * scale.of(o.loss.values_per_example(y, out) if steps is None else 1)
        each.append(per)
        total = total + o.loss_weight * per
    return total, each


@dataclasses.dataclass(frozen=True)
class LossScale:
    """What turns an output's weighted per-example losses, summed and divided by the whole
    batch's real examples (the train step's loss), into Keras's reduction of them:
    `real / divisor`, times the values each example holds when `by_values` (Keras's "sum"
    adds up the values that podkit's per-example losses average). Computed over the whole
    batch, so that microbatches add up to it."""

    real: jax.Array
    divisor: jax.Array
    by_values: bool = False

    def of(self, values: float) -> jax.Array:
        n = float(values) if self.by_values else 1.0
        ok = self.divisor != 0
        return jnp.where(ok, self.real * n / jnp.where(ok, self.divisor, 1.0), 0.0)


def _loss_scales(spec: StepSpec, sw: jax.Array, step_masks: tuple, mask: jax.Array,
                 real: jax.Array) -> tuple:
    """Each output's LossScale over a whole batch (None: the sum over the batch's real
    examples is already the reduction: the mean reductions on an output without a timestep
    mask). `step_masks` after _ignored and _per_step_weighted.

    "mean_with_sample_weight" divides by the sum of the weights of the values: with no
    weights given (ones) that is the mean, as Keras's. Keras refuses weights of one per
    example when an example holds several values (an output (batch, 4, 3) under MSE);
    podkit weighs each of its values by it."""
    out = []
    for o, steps in zip(spec.outputs, step_masks, strict=True):
        reduction = None if o.loss is None else o.loss.reduction
        if reduction is None or reduction == "none":
            out.append(None)  # no loss, or refused at compile()
            continue
        if steps is None:  # one loss value per example (the mean of its values)
            if reduction == "sum":
                out.append(LossScale(real, jnp.ones((), jnp.float32), by_values=True))
            elif reduction == "mean_with_sample_weight":
                out.append(LossScale(real, (sw * mask).sum()))
            else:
                out.append(None)
            continue
        keep = _step_weights(steps, mask > 0)  # the real steps (batch, time)
        if reduction == "sum":
            divisor = jnp.ones((), jnp.float32)
        elif reduction == "mean_with_sample_weight":
            divisor = (keep * (sw if sw.ndim == 2 else sw[:, None])).sum()
        else:
            divisor = keep.sum()  # Keras's apply_mask: sum(loss * weight) / real steps
        out.append(LossScale(real, divisor))
    return tuple(out)


def _by_step(o: OutputSpec, what: str, a: jax.Array, steps: jax.Array) -> jax.Array:
    """`a` (batch, time, ...) as (batch * time, ...): one row per step of a masked output.
    `time` may also be several dims of `a` (labels (batch, h, w) left out by an ignore_class
    mask of (batch, h * w)) or none (labels (batch,): a mask of (batch, 1))."""
    batch, time = steps.shape
    for k in range(a.ndim):
        if a.shape[0] == batch and math.prod(a.shape[1:1 + k]) == time and (
                k or a.ndim < 2 or a.shape[1] != time):
            return a.reshape(batch * time, *a.shape[1 + k:])
    name = f" {o.name!r}" if o.name else ""
    raise ConfigError(f"the model's output{name} carries a timestep mask over (batch, "
                      f"time) = {(batch, time)} (Embedding(mask_zero=True) or Masking "
                      f"through per-step layers), and its {what} have shape {a.shape}: "
                      "give per-step labels (batch, time[, ...]), or pool the steps "
                      "(GlobalAveragePooling1D, or an RNN without return_sequences).")


def _ignored(spec: StepSpec, ys: tuple, steps: tuple) -> tuple[tuple, tuple]:
    """(labels, timestep masks): where an output's loss has an `ignore_class`, the labels of
    that value become 0 (so that no gather reads past the classes) and leave the output's
    timestep mask, which then holds them out of its loss (Keras's masked mean) and its
    metrics."""
    new_ys, new_steps = [], []
    for o, y, s in zip(spec.outputs, ys, steps, strict=True):
        ignore = getattr(o.loss, "ignore_class", None)
        if ignore is None:
            new_ys.append(y)
            new_steps.append(s)
            continue
        keep = y != ignore
        flat = keep.reshape(keep.shape[0], -1)
        if s is not None:
            if s.shape != flat.shape:
                name = f" {o.name!r}" if o.name else ""
                raise ConfigError(
                    f"the output{name}'s labels {y.shape} and its timestep mask {s.shape} "
                    "(Embedding(mask_zero=True)) do not line up, so ignore_class cannot "
                    "join the mask: give one label per step, (batch, time).")
            flat = jnp.logical_and(flat, s.astype(bool))
        new_ys.append(jnp.where(keep, y, jnp.zeros((), y.dtype)))
        new_steps.append(flat)
    return tuple(new_ys), tuple(new_steps)


def _step_weights(steps: jax.Array, rows: jax.Array) -> jax.Array:
    """(batch, time) weights: the timestep mask times each row's weight `rows` (batch,), or
    times per-step weights (batch, time)."""
    rows = rows.astype(jnp.float32)
    return steps.astype(jnp.float32) * (rows if rows.ndim == 2 else rows[:, None])


def _per_step_weighted(sw: jax.Array, steps: tuple) -> tuple:
    """Timestep masks for per-step sample weights (batch, time): an output without a mask
    of its own gets one of ones, so that its loss and metrics weigh each step (Keras's
    sum(loss * sample_weight) / (batch * time))."""
    if sw.ndim != 2:
        return steps
    return tuple(jnp.ones(sw.shape, bool) if s is None else s for s in steps)


def _masked_loss(o: OutputSpec, out: Any, y: jax.Array, steps: jax.Array, mask: jax.Array,
                 from_logits: bool | None, weights: jax.Array | None = None) -> jax.Array:
    """Per example (batch,): the weighted sum of the loss of its real steps (Keras's
    `apply_mask`; the division by the whole batch's real steps is its LossScale).
    `weights`: per-step sample weights."""
    batch, time = steps.shape
    if isinstance(out, LMLogits) and o.loss.lazy_logits and hasattr(o.loss, "values"):
        # A language model's per-token loss, its vocabulary a chunk at a time.
        per_step = o.loss.values(y, out, from_logits=from_logits).reshape(batch, time)
    else:
        out = out.materialize() if isinstance(out, LMLogits) else out
        per_step = o.loss.per_example(_by_step(o, "labels", y, steps),
                                      _by_step(o, "outputs", out, steps),
                                      from_logits=from_logits).reshape(batch, time)
    keep = _step_weights(steps, mask > 0)
    if weights is not None:
        if weights.shape != steps.shape:
            name = f" {o.name!r}" if o.name else ""
            raise ConfigError(f"per-step sample weights of shape {weights.shape} for the "
                              f"output{name}, whose steps are {steps.shape}: give one weight "
                              "per label, (batch, time).")
        keep = keep * weights.astype(jnp.float32)
    return (per_step * keep).sum(axis=1)


def _accumulate(spec: StepSpec, sums: Sums, total: jax.Array, each: list, outs: tuple,
                ys: tuple, sw: jax.Array, mask: jax.Array, penalty: jax.Array,
                step_masks: tuple, count: jax.Array | None = None) -> Sums:
    """`sums` plus one batch's; `count`: its real examples (mask.sum()), when known."""
    new = dict(sums)
    count = mask.sum() if count is None else count

    def add(key: str, parts: dict) -> None:
        new[key] = {p: sums[key][p] + v for p, v in parts.items()}

    # The logged loss includes the regularization penalty, once per batch (as Keras).
    add("loss", {"total": total.sum() + penalty * count, "count": count})
    for o, per, out, y, steps in zip(spec.outputs, each, outs, ys, step_masks, strict=True):
        if per is not None and len(spec.outputs) > 1:
            add(o.key("loss"), {"total": per.sum(), "count": count})
        rows, weighted = mask, sw
        if steps is not None and (o.metrics or o.weighted_metrics):
            # Metrics count real steps, as Keras's take the mask as sample weights.
            out = out.materialize() if isinstance(out, LMLogits) else out
            y, out = _by_step(o, "labels", y, steps), _by_step(o, "outputs", out, steps)
            rows = _step_weights(steps, mask).reshape(-1)
            weighted = _step_weights(steps, sw).reshape(-1)
        pred = o.for_metrics(out)
        whole: dict = {}  # LMLogits materialized once, for the metrics that need every logit
        for m in o.metrics:
            seen = _metric_input(_seen(m, o, out, pred), m, whole)
            add(o.key(m.name), m.update(y, seen, rows))
        for m in o.weighted_metrics:
            add(o.key(m.name), m.update(y, _metric_input(_seen(m, o, out, pred), m, whole),
                                        weighted))
    return new


def _seen(metric: Any, o: OutputSpec, out: Any, probabilities: Any) -> Any:
    """What `metric` reads: the probabilities (OutputSpec.for_metrics); the raw outputs for
    a metric built with `from_logits=True` (AUC), which applies its activation itself, as
    Keras's does; what the model outputs (predict's values: logits under a from_logits
    loss) for a user's function, as Keras hands it."""
    if getattr(metric, "from_logits", False):
        return out
    if getattr(metric, "model_outputs", False):
        return probabilities if o.fused else out
    return probabilities


def _grad_norm_if(grads: Any, rows: Any, last: Any) -> jax.Array:
    """The global gradient norm (dense parameters and looked-up table rows) on an
    execution's `last` step, zero on the others (one reduction per execution)."""
    def norm(tree: Any) -> jax.Array:
        squares = [jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(tree)
                   if jnp.issubdtype(g.dtype, jnp.floating)]
        return jnp.sqrt(sum(squares, jnp.zeros((), jnp.float32)))

    if last is True:
        return norm((grads, rows))
    return jax.lax.cond(last, norm, lambda tree: jnp.zeros((), jnp.float32), (grads, rows))


def _execution_sums(own: dict, norm: jax.Array, opt_state: Any, k: int, measured: bool
                    ) -> dict:
    """The train step's own sums after an execution of k steps: its last step's gradient
    norm, added once, and the learning rate its last step used times the steps counted so
    far (not a sum: divided by the count it is that rate, which is what a log line at this
    step says, not a mean over the window). Outside the steps' loop: on a model of a few thousand
    parameters every scalar carried through the k steps costs."""
    lr = optimizers_lib.learning_rate_in(opt_state)
    return {"count": own["count"] + float(k), "grad_norm": own["grad_norm"] + norm,
            "norms": own["norms"] + (1.0 if measured else 0.0),
            "learning_rate": (own["count"] + float(k)) * (
                0.0 if lr is None else jnp.asarray(lr, jnp.float32))}


def _metric_input(pred: Any, metric: Metric, whole: dict) -> Any:
    """What `metric` sees of an output: LMLogits themselves if it takes them, else their
    materialized logits (computed once per output, kept in `whole`)."""
    if not isinstance(pred, LMLogits) or metric.lazy_logits:
        return pred
    if "logits" not in whole:
        whole["logits"] = pred.materialize()
    return whole["logits"]


def _run_with_outputs(body: Callable, carry: Any, k: int, unroll: bool) -> tuple[Any, Any]:
    """`_run` for a body that also emits a scalar per step: (carry, the k scalars)."""
    if k == 1 or unroll:
        outs = []
        for i in range(k):
            carry, out = body(carry, jnp.int32(i))
            outs.append(out)
        return carry, jnp.stack(outs)
    return jax.lax.scan(body, carry, jnp.arange(k, dtype=jnp.int32))


def _run(body: Callable, carry: Any, k: int, unroll: bool) -> Any:
    if k == 1 or unroll:  # eager (jit=False) runs the steps as a plain loop
        for i in range(k):
            carry, _ = body(carry, jnp.int32(i))
        return carry
    carry, _ = jax.lax.scan(body, carry, jnp.arange(k, dtype=jnp.int32))
    return carry


def _split_micro(tree: Any, m: int, spec: StepSpec) -> Any:
    """(B, ...) -> (m, B/m, ...) where part j holds rows j, j+m, j+2m, ...: each device keeps
    its share of every part (a contiguous split would give part 0 to the first devices)."""
    def split(a: jax.Array) -> jax.Array:
        parts = a.reshape(a.shape[0] // m, m, *a.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(parts, _leading(spec.batch_sharding))
    return jax.tree.map(split, tree)


def _leading(sharding: NamedSharding) -> NamedSharding:
    return NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(None, *sharding.spec))


def _check_microbatches(batch: int, spec: StepSpec) -> None:
    from podkit.errors import ConfigError
    from podkit.sharding import parts_of

    mesh = spec.batch_sharding.mesh
    dp = math.prod(parts_of(entry, mesh) for entry in spec.batch_sharding.spec)
    if batch % (spec.microbatches * dp):
        raise ConfigError(
            f"a batch of {batch} examples does not split into microbatches={spec.microbatches} "
            f"parts of a multiple of the data-parallel size {dp}; use a batch size divisible by "
            f"{spec.microbatches * dp}.")


def _whole_batch_scales(spec: StepSpec, state: TrainState, x: Any, ys: tuple, sw: jax.Array,
                        mask: jax.Array, real: jax.Array) -> tuple:
    """The losses' LossScales over a whole batch before it is cut into microbatches. An
    output's timestep mask comes from the model (Embedding(mask_zero=True), Masking): a
    forward pass of the whole batch gives it, whose outputs nothing reads, so XLA keeps only
    the masks' few ops of it."""
    steps: tuple = (None,) * len(spec.outputs)
    if spec.logits_arg and any(o.loss is not None for o in spec.outputs):
        steps = _apply(spec, _module(spec, state, False), x, mask)[4]
    steps = _ignored(spec, ys, steps)[1]
    return _loss_scales(spec, sw, _per_step_weighted(sw, steps), mask, real)


def make_train_step(spec: StepSpec, unroll: bool = False):
    """The pure train step: k optimizer updates, one per batch of `inputs`. With
    `spec.microbatches = m` each update sums the gradients of m parts of its batch, computed
    one after another (the loss of a part is divided by the whole batch's example count, so
    the sum is the whole batch's gradient)."""
    m = spec.microbatches

    def grads_of(state: TrainState, x: Any, ys: tuple, sw: jax.Array, mask: jax.Array,
                 real: jax.Array, penalty_share: float, lookups: dict,
                 scales: tuple | None):
        """(dense gradients, the tables' looked-up rows and their gradients, aux). `lookups`:
        the shapes of the rows each table lookup reads (_lookup_shapes); `scales`: the
        losses' reductions over the whole batch when this is a part of it (None: this is
        the whole batch)."""
        deltas = sparse.zero_deltas(lookups)

        def loss_of(params, deltas):
            if spec.frozen is not None:  # no backward pass through a frozen weight's grad
                params = jax.tree.map(lambda p, f: jax.lax.stop_gradient(p) if f else p,
                                      params, spec.frozen)
            (outs, rest, rng, penalty, steps), tape = _taped(spec, state, x, params, mask,
                                                             deltas)
            labels, steps = _ignored(spec, ys, steps)
            steps = _per_step_weighted(sw, steps)
            own = _loss_scales(spec, sw, steps, mask, real) if scales is None else scales
            total, each = _losses(spec, outs, labels, sw, steps, mask, own)
            return (total.sum() / real + penalty * penalty_share,
                    ((outs, rest, rng, total, each, penalty, steps, labels), tape.ids))

        (grads, row_grads), (aux, ids) = jax.grad(loss_of, argnums=(0, 1), has_aux=True)(
            state.params, deltas)
        rows = sparse.flatten(ids, row_grads)
        return sparse.without_tables(grads, rows), rows, aux

    layout = sums_layout(spec)

    def train_step(state: TrainState, packed: tuple, inputs: StepInputs):
        sums = layout.unpack(packed)
        # Each step's real examples, counted for all k at once: counted inside the steps'
        # loop it was two reductions per step, a visible share of a small model's step on
        # XLA:CPU (each op there costs its dispatch).
        counts = _real_counts(inputs)

        def body(carry, i):
            state, sums = carry
            x, y, sw, mask = _gather(inputs, i, spec)
            ys = _as_tuple(y, spec.output_names)
            count = counts[i]
            real = jnp.maximum(count, 1.0)
            if m == 1:
                lookups = _lookup_shapes(spec, state, x, mask) if spec.tables else {}
                grads, rows, (outs, rest, rng, total, each, penalty, steps, labels) = \
                    grads_of(state, x, ys, sw, mask, real, 1.0, lookups, None)
                sums = _accumulate(spec, sums, total, each, outs, labels, sw, mask, penalty,
                                   steps, count)
            else:
                _check_microbatches(mask.shape[0], spec)
                # The losses' divisors (real steps, weights) over the whole batch, not per
                # part: a part's own mean would weigh its tokens by its share of them (the
                # gradient-accumulation error transformers fixed in 2024).
                scales = _whole_batch_scales(spec, state, x, ys, sw, mask, real)
                parts = _split_micro((x, ys, sw, mask), m, spec)
                first = jax.tree.map(lambda a: a[0], parts)  # every part has its shapes
                lookups = (_lookup_shapes(spec, state, first[0], first[3]) if spec.tables
                           else {})

                def micro(carry, part):
                    acc, rest, rng, sums = carry
                    px, pys, psw, pmask = part
                    sub = state.replace(rest=rest, rng=rng)
                    g, rows, (outs, rest, rng, total, each, penalty, steps, labels) = \
                        grads_of(sub, px, pys, psw, pmask, real, 1.0 / m, lookups, scales)
                    sums = _accumulate(spec, sums, total, each, outs, labels, psw, pmask,
                                       penalty, steps)
                    return (jax.tree.map(jnp.add, acc, g), rest, rng, sums), rows

                # The tables' gradients are rows, stacked by the scan (not summed): their
                # dense slots in `acc` are scalars.
                zeros = sparse.without_tables(jax.tree.map(jnp.zeros_like, state.params),
                                              lookups)
                (grads, rest, rng, sums), rows = jax.lax.scan(
                    micro, (zeros, state.rest, state.rng, sums), parts)
                rows = sparse.merge_parts(rows)
            params, opt_state = sparse.apply(spec.tx, state.params, state.opt_state, grads, rows,
                                             spec.tables, spec.batch_sharding.mesh)
            last = True if inputs.steps == 1 else i == inputs.steps - 1
            new_state = TrainState(step=state.step + 1, params=params,
                                   opt_state=opt_state, rest=rest, rng=rng)
            if not spec.grad_norm:
                return (new_state, sums), None
            return (new_state, sums), _grad_norm_if(grads, rows, last)

        # The train step's own sums stay out of the steps' loop (see _execution_sums).
        own, sums = sums[STEP_SUMS], {k: v for k, v in sums.items() if k != STEP_SUMS}
        if spec.grad_norm:
            (state, sums), norms = _run_with_outputs(body, (state, sums), inputs.steps, unroll)
            norm = norms[-1]
        else:  # no per-step output at all (its write into the stacked outputs is an op)
            state, sums = _run(body, (state, sums), inputs.steps, unroll)
            norm = jnp.zeros((), jnp.float32)
        return state, layout.pack({**sums, STEP_SUMS: _execution_sums(
            own, norm, state.opt_state, inputs.steps, spec.grad_norm)})

    return train_step


def make_eval_step(spec: StepSpec, unroll: bool = False):
    """The pure eval step: loss and metric sums over k batches; the state is only read."""

    layout = sums_layout(spec)

    def eval_step(state: TrainState, packed: tuple, inputs: StepInputs) -> tuple:
        def body(sums, i):
            x, y, sw, mask = _gather(inputs, i, spec)
            ys = _as_tuple(y, spec.output_names)
            outs, _, _, penalty, steps = forward(spec, state, x, False, mask=mask)
            labels, steps = _ignored(spec, ys, steps)
            steps = _per_step_weighted(sw, steps)
            scales = _loss_scales(spec, sw, steps, mask, jnp.maximum(mask.sum(), 1.0))
            total, each = _losses(spec, outs, labels, sw, steps, mask, scales)
            return _accumulate(spec, sums, total, each, outs, labels, sw, mask, penalty,
                               steps), None

        return layout.pack(_run(body, layout.unpack(packed), inputs.steps, unroll))

    return eval_step


def make_predict_step(spec: StepSpec, unroll: bool = False):
    """The pure predict step: (outputs with final activations applied, each (k, B, ...), and
    the (k, B) mask of real examples)."""

    def predict_step(state: TrainState, inputs: StepInputs) -> tuple[tuple, jax.Array]:
        def one(i):
            x, _, _, mask = _gather(inputs, i, spec)
            outs = forward(spec, state, x, False, mask=mask)[0]
            return tuple(ACTIVATIONS[o.fused](out) if o.fused else out
                         for o, out in zip(spec.outputs, outs, strict=True)), mask

        k = inputs.steps
        if k == 1 or unroll:
            per = [one(jnp.int32(i)) for i in range(k)]
            outs = tuple(jnp.stack([p[0][j] for p in per]) for j in range(len(spec.outputs)))
            return outs, jnp.stack([p[1] for p in per])
        return jax.lax.map(one, jnp.arange(k, dtype=jnp.int32))

    return predict_step
