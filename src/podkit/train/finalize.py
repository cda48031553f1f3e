"""Keras's `optimizer.finalize_variable_values` at the end of fit(): with `use_ema`, the
trainable weights become their moving average (Keras's JAX trainer does it after the last
epoch, before `on_train_end`)."""

from __future__ import annotations

from podkit import optimizers
from podkit.train.hooks import LoopHook, LoopRun
from podkit.train.state import resolved


class FinalizeVariables(LoopHook):
    """Listed after the callbacks' hook, so that it closes before them: `on_train_end` sees
    the averaged weights, as in Keras. It acts in `close`, after the final checkpoint (saved
    in `end`): checkpoints hold the training state (the weights as trained, the average in
    the optimizer state), so a resumed run continues exactly. A failing fit leaves the
    weights as trained (Keras finalizes in a `finally`, on a state that may be unusable)."""

    def close(self, run: LoopRun, failing: bool) -> None:
        if failing or run.kind != "training":
            return
        state = resolved(run.cell.value)
        params = optimizers.finalized_params(state.opt_state, state.params)
        if params is not None:
            run.cell.value = state.replace(params=params)
