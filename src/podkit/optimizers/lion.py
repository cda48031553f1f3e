"""Lion (Chen et al. 2023) as Keras 3's: the sign of an interpolated momentum."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.optimizers.apply import sub
from podkit.optimizers.base import Optimizer
from podkit.optimizers.schedules import LearningRateSchedule


class Lion(Optimizer):
    """`var -= lr * sign(m * beta_1 + g * (1 - beta_1)); m = m * beta_2 + g * (1 - beta_2)`."""

    slot_names = ("momentum",)

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.99, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if not 0 < beta_1 <= 1:
            raise ConfigError(f"Lion(beta_1={beta_1!r}) must be in (0, 1] (at 0 Lion is "
                              "sign SGD).")
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        beta_1, beta_2 = jnp.asarray(self.beta_1, dtype), jnp.asarray(self.beta_2, dtype)
        m = slots["momentum"]
        step = lr * jnp.sign(m * beta_1 + g * (1.0 - beta_1))
        return sub(step), {"momentum": m * beta_2 + g * (1.0 - beta_2)}

    def _own_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2}
