"""Why a step compiled again: every trace of a model's steps counted and, after the first of a
kind, explained against the one before it.

    tracker = Recompiles()                       # one per model, kept across compile()
    tracker.enter("fit")                         # fit/evaluate/predict: "fit() call 3"
    ... program.train(...)                       # a trace calls tracker.traced("train", args)
    tracker.events                               # [Recompile(kind, context, changes), ...]

A change is named by the argument's path and what changed, as JAX's own cache-miss
explanations do, and with the usual fix:

    inputs.x: float32[128,784] -> int32[128,784] at fit() call 3: cast the input to one
    dtype, or feed it through a Dataset with a fixed element spec

After `warn_after` recompiles of one kind a `RecompileWarning` lists them; with `strict` any
recompile of a kind already compiled is a `RecompileError`, raised while tracing (before
anything runs: no state is donated). A new program (model.compile() again) starts its kinds
afresh: its first trace of each kind is expected.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax

from podkit.errors import ConfigError, RecompileError


class RecompileWarning(UserWarning):
    """A step compiled again more often than `warn_after` allows."""


@dataclasses.dataclass(frozen=True)
class Recompile:
    kind: str  # "train", "evaluate" or "predict"
    context: str  # "fit() call 3"
    changes: tuple[str, ...]  # "inputs.x: float32[128,784] -> int32[128,784]", ...
    #: a new sequence length (bucket) of variable-length input: one program per bucket is
    #: how such input runs, so it is reported but never warned about or refused
    length: bool = False

    def __str__(self) -> str:
        what = "; ".join(self.changes) or "no argument changed its shape or dtype (its " \
            "sharding or committed device may have)"
        note = " (a new input length: one program per length bucket)" if self.length else ""
        return f"{self.kind} step at {self.context}: {what}{note}"


def _path(path: tuple) -> str:
    """A tree path as dotted names: (SequenceKey(2), GetAttrKey('data'), DictKey('x')) ->
    "2.data.x"."""
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def signature(args: Any) -> dict[str, str]:
    """{path: "float32[128,784]"} of traced arguments (tracers or arrays)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        aval = getattr(leaf, "aval", None)
        if aval is None:  # eager steps (run_eagerly) see arrays and Python scalars
            try:
                aval = jax.typeof(leaf)
            except TypeError:
                out[_path(path)] = type(leaf).__name__
                continue
        text = aval.str_short(short_dtypes=False)
        if getattr(aval, "weak_type", False):
            text += " (weakly typed: a Python scalar)"
        out[_path(path)] = text
    return out


ARGUMENTS = {"train": ("state", "sums", "inputs"), "evaluate": ("state", "sums", "inputs"),
             "predict": ("state", "inputs")}
# What a step's input leaves are called for a reader who never saw podkit's step inputs
# (podkit.train.feeds.inputs: BatchInputs(x, y, sw, mask), StagedInputs(data, idx)).
NAMES = {"inputs.x": "x", "inputs.y": "y", "inputs.sw": "sample_weight",
         "inputs.mask": "the padding mask of the batches",
         "inputs.idx": "the row ids of the batches", "inputs.data": "the arrays staged on the "
         "devices,"}
# Leaves shaped (steps in the execution, batch, ...): which of the two changed says why.
STEPS_BY_BATCH = ("inputs.idx", "inputs.mask", "inputs.x", "inputs.y", "inputs.sw")


def _dims(text: str) -> list[str]:
    inside = text.partition("[")[2].partition("]")[0]
    return inside.split(",") if inside else []


LENGTH_CHANGED = "the sequence length changed"


def _length_note(label: str, old: str, new: str) -> str | None:
    """A change of an input's dims past its rows (staged arrays: (rows, ...); batches:
    (steps, batch, ...)), dtype and rank the same: a new sequence length."""
    lead = 1 if label.startswith("inputs.data.") else 2 if label.startswith(
        ("inputs.x", "inputs.y", "inputs.sw")) else None
    a, b = _dims(old), _dims(new)
    if lead is None or len(a) != len(b) or len(a) <= lead or a[lead:] == b[lead:] \
            or old.partition("[")[0] != new.partition("[")[0]:
        return None
    show = (lambda d: str(d[0]) if len(d) == 1 else "x".join(map(str, d)))
    return f"{LENGTH_CHANGED} from {show(a[lead:])} to {show(b[lead:])}"


def _gloss(label: str, old: str, new: str) -> str | None:
    length = _length_note(label, old, new)
    if length:
        return length
    notes = []
    if label.startswith(STEPS_BY_BATCH):
        a, b = _dims(old), _dims(new)
        if len(a) >= 2 and len(a) == len(b):
            if a[0] != b[0]:
                notes.append(f"{b[0]} steps in this execution instead of {a[0]}: "
                             "steps_per_execution does not divide the epoch's steps")
            if a[1] != b[1]:
                notes.append(f"the batch size changed from {a[1]} to {b[1]}")
    dtypes = old.partition("[")[0], new.partition("[")[0]
    if notes and dtypes[0] != dtypes[1]:
        notes.append(f"the dtype changed from {dtypes[0]} to {dtypes[1]}")
    return "; ".join(notes) or None


def _label(path: str, kind: str) -> str:
    """"2.x" -> "inputs.x"; "0.params.dense.kernel" -> "state.params.dense.kernel"."""
    head, _, rest = path.partition(".")
    names = ARGUMENTS.get(kind, ())
    if head.isdigit() and int(head) < len(names):
        head = names[int(head)]
    return f"{head}.{rest}" if rest else head


def _display(label: str) -> str:
    """"inputs.x" -> "x": the names a user passed, not the step's."""
    for prefix, name in NAMES.items():
        if label == prefix or label.startswith(prefix + "."):
            tail = label[len(prefix) + 1:]
            return f"{name} {tail}" if tail else name
    return label


def explain(before: dict[str, str], after: dict[str, str], kind: str = "") -> tuple[str, ...]:
    """What differs between two signatures, one line per argument."""
    changes = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        label = _label(path, kind)
        gloss = _gloss(label, old, new) if old is not None and new is not None else None
        if gloss:
            new = f"{new} ({gloss})"
        label = _display(label)
        if old is None:
            changes.append(f"{label}: new argument {new}")
        elif new is None:
            changes.append(f"{label}: argument {old} is gone")
        else:
            changes.append(f"{label}: {old} -> {new}")
    return tuple(changes)


ADVICE = {
    "train": "feed batches of one shape and dtype (cast the input; a Dataset's "
             "padded_batch or drop_remainder keeps shapes fixed)",
    "evaluate": "feed batches of one shape and dtype (cast the input, fix the batch size)",
    "predict": "call predict() with one batch size and dtype (model(x) compiles one step "
               "per power-of-two batch bucket)",
}
# When the inputs' length changed: every length is a program of its own.
LENGTH_ADVICE = ("pad the sequences to one length (the model's context, say), or to a few "
                 "bucket lengths (Dataset.padded_batch(batch_size, padded_shapes=...) per "
                 "bucket), each compiled once")


def advice(kind: str, events: list[Recompile]) -> str:
    """The fix for recompiles of `kind`: the length's when a length changed."""
    if any(LENGTH_CHANGED in change for e in events for change in e.changes):
        return LENGTH_ADVICE
    return ADVICE[kind]


class Recompiles:
    """The traces of one model's steps (see the module docstring)."""

    def __init__(self, warn_after: int | None = 5, strict: bool = False) -> None:
        self.counts = {"train": 0, "evaluate": 0, "predict": 0}  # model.trace_count
        self.events: list[Recompile] = []
        self.context = "a direct call"
        self.warn_after, self.strict = warn_after, strict
        self._last: dict[tuple[int, str], dict[str, str]] = {}
        self._calls: dict[str, int] = {}

    def enter(self, what: str) -> None:
        """A call of fit/evaluate/predict begins: what later traces happen at."""
        self._calls[what] = self._calls.get(what, 0) + 1
        self.context = f"{what}() call {self._calls[what]}"

    def configure(self, warn_after: int | None, strict: bool) -> None:
        if warn_after is not None and (isinstance(warn_after, bool) or
                                       not isinstance(warn_after, int) or warn_after < 0):
            raise ConfigError(f"recompile_warning_after={warn_after!r} must be an int >= 1, "
                              "or 0 or None (never warn).")
        if not isinstance(strict, bool):
            raise ConfigError(f"strict_recompiles={strict!r} must be True or False.")
        self.warn_after, self.strict = warn_after or None, strict

    def traced(self, program: int, kind: str, args: Any) -> None:
        """Called by a step while it is traced (`program`: the id of its Program). The
        inputs' form is part of the key: arrays staged on the devices and streamed batches
        are two programs, and the first trace of each is not a recompile."""
        key = (program, kind, type(args[-1]).__name__ if args else "")
        sig = signature(args)
        previous = self._last.get(key)
        if previous is None:
            self.counts[kind] += 1
            self._last[key] = sig
            return
        event = Recompile(kind, self.context, explain(previous, sig, kind),
                          length=_only_lengths(previous, sig))
        if self.strict and not event.length:  # refused before anything compiled
            raise RecompileError(f"strict_recompiles: the {event}. Fix: "
                                 f"{advice(kind, [event])}; or "
                                 "compile(strict_recompiles=False).")
        self.counts[kind] += 1
        self._last[key] = sig
        self.events.append(event)
        of_kind = [e for e in self.events if e.kind == kind and not e.length]
        if self.warn_after is not None and len(of_kind) == self.warn_after and not event.length:
            listed = "\n  ".join(str(e) for e in of_kind)
            times = "once" if len(of_kind) == 1 else f"{len(of_kind)} times"
            warnings.warn(f"the {kind} step compiled again {times}:\n  {listed}\n"
                          "Each compile costs as long as the first. Fix: "
                          f"{advice(kind, of_kind)}.",
                          RecompileWarning, stacklevel=_user_frame())

    def __repr__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        return (f"Recompiles(traces: {counts}; {len(self.events)} recompile(s), "
                f"warn_after={self.warn_after}, strict={self.strict})")


def _only_lengths(before: dict[str, str], after: dict[str, str]) -> bool:
    """Whether only the non-batch dims of the inputs' x / y changed (steps and batch dims,
    dtypes and everything else the same): a new sequence length."""
    if set(before) != set(after):
        return False
    changed = [p for p in before if before[p] != after[p]]
    if not changed:
        return False
    for path in changed:
        head, _, rest = path.partition(".")
        if not head.isdigit() or rest.split(".")[0] not in ("x", "y"):
            return False
        a, b = _dims(before[path]), _dims(after[path])
        if before[path].partition("[")[0] != after[path].partition("[")[0] or \
                len(a) != len(b) or len(a) < 3 or a[:2] != b[:2]:
            return False
    return True


def _user_frame() -> int:
    """The stacklevel of the first caller outside podkit, JAX and Flax (the user's line that
    called fit/evaluate/predict), for warnings.warn."""
    import inspect

    frame, level = inspect.currentframe(), 0
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.split(".")[0] not in ("podkit", "jax", "jaxlib", "flax", "contextlib"):
            return level
        frame, level = frame.f_back, level + 1
    return 2
