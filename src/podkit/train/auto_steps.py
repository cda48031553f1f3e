"""`steps_per_execution="auto"` (compile's default): how many steps one device call runs when
the user did not say.

Every device call costs the host a fixed amount (the dispatch, the loop's bookkeeping, and
on XLA:CPU the executable's set-up and its buffers), which a small model's step does not hide:
k steps in one call (a `lax.scan` in podkit.train.step) pay it once. Keras runs one step per
call unless told otherwise; podkit chooses, when nothing needs the host between steps:

    choice = choose(steps=469, seconds_at_peak=4.6e-4, batch_bytes=0, every_batch=())
    choice.k, choice.why        # 67, "67 steps ... divides the epoch's 469 steps"

The rules, in order (docs/keras.md, "steps_per_execution"):
  1. one step per call when something needs the host after every step: a callback that
     overrides a per-batch hook sees every batch (`Callback.needs_every_batch`), as it would
     in Keras with the default; an eager model (`run_eagerly`) has no call to save;
  2. otherwise as many as fit in `EXECUTION_S` seconds of the devices' peak FLOP/s (the
     step's FLOPs from its forward, traced), at most `MAX_STEPS`, and, for batches fed from
     the host, at most `BATCH_BYTES` of stacked batches per device: an execution stays short
     enough that the progress bar moves, a preemption's final save starts within seconds and
     the watchdog's limit is never near;
  3. a divisor of what happens every so many steps (fit()'s `log_every`, a checkpoint
     manager's `every_steps`, `profile_steps`' bounds), so it falls between executions; and
     a count that divides the epoch's steps, so one program serves the whole epoch; where
     the largest such divisor is under a quarter of the bound, the bound itself, and the
     epoch's last execution compiles once more for its shorter length (never under
     `strict_recompiles`, which then keeps the divisor).
Training only: evaluate(), predict() and fit()'s validation run one step per call, as Keras:
their length varies from call to call (`model(x)` on any batch), a count chosen per length
would compile per length, and a padded last execution would compute steps for nothing.
The choice is the same on every process (process 0's): processes that ran different programs
would wait for each other's collectives forever.
"""

from __future__ import annotations

import dataclasses

AUTO = "auto"
MAX_STEPS = 128
# An execution's FLOPs at the devices' peak: small steps run far below the peak (10-40% MFU),
# so an execution of this budget takes a few seconds of real time.
EXECUTION_S = 2.0
BATCH_BYTES = 128 << 20  # per device: the k batches an execution stacks


@dataclasses.dataclass(frozen=True)
class Choice:
    k: int
    why: str

    def line(self) -> str:
        """The log line: what was chosen and why."""
        steps = "1 step" if self.k == 1 else f"{self.k} steps"
        return (f"podkit: steps_per_execution='auto' runs {steps} per device call: {self.why}. "
                "Pass compile(steps_per_execution=k) to choose.")


def choose(*, steps: int | None, seconds_at_peak: float | None, batch_bytes: int = 0,
           every_batch: tuple[str, ...] = (), jit: bool = True,
           intervals: tuple[tuple[str, int], ...] = (), strict: bool = False) -> Choice:
    """The steps per execution for an epoch of `steps` (None: unknown length) whose step
    takes `seconds_at_peak` of the devices' peak (None: unknown) and stacks `batch_bytes`
    per device and step (0: data staged on the devices). `every_batch`: the callbacks that
    need the host after each step; `intervals`: (what, steps) the count must divide, so
    that what happens every so many steps (log points, checkpoints, a profile's first and
    last step) falls between executions; `strict`: no second program for a short last
    execution."""
    if not jit:
        return Choice(1, "the model runs eagerly (run_eagerly=True): no device call to save")
    if every_batch:
        return Choice(1, f"callback(s) {', '.join(every_batch)} override a per-batch hook, "
                         "so they see every batch")
    bound, limit = MAX_STEPS, f"at most {MAX_STEPS}"
    if seconds_at_peak is not None and seconds_at_peak > 0:
        by_time = max(int(EXECUTION_S / seconds_at_peak), 1)
        if by_time < bound:
            bound, limit = by_time, (
                f"a step is {_seconds(seconds_at_peak)} at the devices' peak FLOP/s and an "
                f"execution at most {EXECUTION_S:g} s of it")
    if batch_bytes > 0 and BATCH_BYTES // batch_bytes < bound:
        bound, limit = max(BATCH_BYTES // batch_bytes, 1), (
            f"a step's batch is {batch_bytes / 2**20:.1f} MiB per device and an execution "
            f"stacks at most {BATCH_BYTES >> 20} MiB")
    fits = list(range(1, bound + 1))  # the counts every interval allows
    intervals = tuple((what, n) for what, n in intervals if n > 0)
    if intervals:
        fits = [d for d in fits if all(n % d == 0 for _, n in intervals)]
        if fits[-1] < bound:
            bound = fits[-1]
            limit += " and a divisor of " + ", ".join(f"{what} ({n})" for what, n in intervals)
    if steps is None:
        return Choice(bound, f"{limit}; the epoch's length is unknown")
    if steps <= bound and bound in fits and steps in fits:
        return Choice(steps, f"the whole epoch ({steps} steps) in one call"
                      if steps > 1 else "the epoch is one step")
    best = max(d for d in fits if steps % d == 0)
    if best * 4 >= bound or strict:
        return Choice(best, f"{limit}, and {best} divides the epoch's {steps} steps")
    return Choice(bound, f"{limit}; no count from {-(-bound // 4)} to {bound} divides the "
                  f"epoch's {steps} steps, so its last execution is shorter (compiled once "
                  "more)")


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"
