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

    def __str__(self) -> str:
        what = "; ".join(self.changes) or "no argument changed its shape or dtype (its " \
            "sharding or committed device may have)"
        return f"{self.kind} step at {self.context}: {what}"


def signature(args: Any) -> dict[str, str]:
    """{path: "float32[128,784]"} of traced arguments (tracers or arrays)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        aval = getattr(leaf, "aval", None)
        if aval is None:  # eager steps (run_eagerly) see arrays and Python scalars
            try:
                aval = jax.typeof(leaf)
            except TypeError:
                out[jax.tree_util.keystr(path)] = type(leaf).__name__
                continue
        text = aval.str_short(short_dtypes=False)
        if getattr(aval, "weak_type", False):
            text += " (weakly typed: a Python scalar)"
        out[jax.tree_util.keystr(path)] = text
    return out


ARGUMENTS = {"train": ("state", "sums", "inputs"), "evaluate": ("state", "sums", "inputs"),
             "predict": ("state", "inputs")}
# What a step's input leaves are, for a reader who never saw podkit's step inputs.
GLOSS = {"inputs.data": "the arrays staged on the devices", "inputs.sw": "the sample weights"}
# Leaves shaped (steps in the execution, batch, ...): which of the two changed says why.
STEPS_BY_BATCH = ("inputs.idx", "inputs.mask", "inputs.x", "inputs.y")


def _dims(text: str) -> list[str]:
    inside = text.partition("[")[2].partition("]")[0]
    return inside.split(",") if inside else []


def _gloss(label: str, old: str, new: str) -> str | None:
    if label.startswith(STEPS_BY_BATCH):
        a, b = _dims(old), _dims(new)
        if len(a) >= 2 and len(a) == len(b):
            if a[0] != b[0]:
                return (f"{b[0]} steps in this execution instead of {a[0]}: "
                        "steps_per_execution does not divide the epoch's steps")
            if a[1] != b[1]:
                return f"the batch size changed from {a[1]} to {b[1]}"
    return next((g for prefix, g in GLOSS.items() if label.startswith(prefix)), None)


def _label(path: str, kind: str) -> str:
    """"[2].x" -> "inputs.x"."""
    parts = path.lstrip("[").replace("][", ".").replace("]", "").replace("'", "")
    head, _, rest = parts.partition(".")
    names = ARGUMENTS.get(kind, ())
    if head.isdigit() and int(head) < len(names):
        head = names[int(head)]
    return f"{head}.{rest}" if rest else head


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
                                       not isinstance(warn_after, int) or warn_after < 1):
            raise ConfigError(f"recompile_warning_after={warn_after!r} must be an int >= 1 "
                              "or None (never warn).")
        self.warn_after, self.strict = warn_after, bool(strict)

    def traced(self, program: int, kind: str, args: Any) -> None:
        """Called by a step while it is traced (`program`: the id of its Program)."""
        self.counts[kind] += 1
        sig = signature(args)
        previous = self._last.get((program, kind))
        self._last[(program, kind)] = sig
        if previous is None:
            return
        event = Recompile(kind, self.context, explain(previous, sig, kind))
        self.events.append(event)
        if self.strict:
            raise RecompileError(f"strict_recompiles: the {event}. Fix: "
                                 f"{ADVICE[kind]}; or compile(strict_recompiles=False).")
        of_kind = [e for e in self.events if e.kind == kind]
        if self.warn_after is not None and len(of_kind) == self.warn_after:
            listed = "\n  ".join(str(e) for e in of_kind)
            warnings.warn(f"the {kind} step compiled again {len(of_kind)} times:\n  {listed}\n"
                          f"Each compile costs as long as the first. Fix: {ADVICE[kind]}.",
                          RecompileWarning, stacklevel=2)
