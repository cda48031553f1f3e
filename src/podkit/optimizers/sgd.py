"""SGD (Keras 3's, with momentum and Nesterov) and LARS (not in Keras: Optax's and the
paper's, SGD whose step per parameter is scaled by the trust ratio)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.optimizers.apply import Options, add, sub
from podkit.optimizers.base import Optimizer
from podkit.optimizers.schedules import LearningRateSchedule


class SGD(Optimizer):
    """Keras's SGD: `m = m * momentum - g * lr; var += m` (Nesterov: `var += m * momentum -
    g * lr`), or `var -= g * lr` without momentum."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if isinstance(momentum, bool) or not isinstance(momentum, int | float) or \
                not 0.0 <= momentum < 1.0:
            raise ConfigError(f"SGD(momentum={momentum!r}) must be in [0, 1).")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    @property
    def slot_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum != 0 else ()

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        lr = learning_rate.astype(variable.dtype)
        g = gradient.astype(variable.dtype)
        if self.momentum == 0:
            return sub(g * lr), {}
        momentum = jnp.asarray(self.momentum, variable.dtype)
        m = slots["momentum"] * momentum - g * lr
        if self.nesterov:
            return add(m * momentum - g * lr), {"momentum": m}
        return add(m), {"momentum": m}

    def _own_config(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov}


class Lars(Optimizer):
    """LARS (You et al. 2017): SGD whose step for each parameter is scaled by the trust ratio
    ||w|| / ||g + wd * w|| times `trust_coefficient`, then momentum: ResNet-50 at batch 32K.
    Not in Keras 3: Optax's `lars` per parameter (its weight decay is added to the gradient
    inside the trust ratio, not Keras's `var -= var * wd * lr`), with the momentum taken
    before the learning rate (the same step for a constant rate)."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.1, momentum: float = 0.9,
                 nesterov: bool = False, trust_coefficient: float = 0.001,
                 epsilon: float = 0.0, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"Lars(momentum={momentum!r}) must be in [0, 1).")
        if not trust_coefficient > 0:
            raise ConfigError(f"Lars(trust_coefficient={trust_coefficient!r}) must be > 0 "
                              "(0.001 is the paper's).")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.trust_coefficient, self.epsilon = float(trust_coefficient), float(epsilon)

    @property
    def slot_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def _options(self) -> Options:
        return super()._options()._replace(keras_weight_decay=False)

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        g = gradient.astype(variable.dtype)
        if self.weight_decay:
            g = g + self.weight_decay * variable
        param_norm, update_norm = jnp.linalg.norm(variable), jnp.linalg.norm(g)
        trust = self.trust_coefficient * param_norm / (update_norm + self.epsilon)
        zero = jnp.logical_or(param_norm == 0.0, update_norm == 0.0)
        g = g * jnp.where(zero, jnp.array(1.0, variable.dtype), trust)
        own: dict[str, jax.Array] = {}
        if self.momentum:
            trace = g + self.momentum * slots["momentum"]
            g = g + self.momentum * trace if self.nesterov else trace
            own = {"momentum": trace}
        return sub(g * learning_rate.astype(variable.dtype)), own

    def _own_config(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov,
                "trust_coefficient": self.trust_coefficient, "epsilon": self.epsilon}
