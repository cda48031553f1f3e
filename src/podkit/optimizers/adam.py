"""The Adam family as Keras 3 computes it: Adam (and AMSGrad), AdamW, Nadam, Adamax, Lamb.

Keras adds Adam's epsilon to sqrt(v) *before* the bias correction: its step is
`m * lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) / (sqrt(v) + eps)`, whose effective epsilon is
`eps / sqrt(1 - beta_2^t)` (3.2e-6 at step 1 for eps 1e-7, beta_2 0.999). PyTorch, Optax and
MaxText add it after (`m_hat / (sqrt(v_hat) + eps)`). The two differ where gradients are as
small as epsilon; `epsilon_placement="pytorch"` on Adam and AdamW computes PyTorch's
`torch.optim.Adam`/`AdamW` step instead. Nadam and Lamb add epsilon after their bias
correction in Keras already, and Adamax has no square root to correct.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.optimizers.apply import sub
from podkit.optimizers.base import Optimizer
from podkit.optimizers.schedules import LearningRateSchedule

EPSILON_PLACEMENTS = ("keras", "pytorch")


def _betas(owner: str, beta_1: float, beta_2: float, epsilon: float) -> None:
    for name, v in (("beta_1", beta_1), ("beta_2", beta_2)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
            raise ConfigError(f"{owner}({name}={v!r}) must be in [0, 1).")
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon >= 0:
        raise ConfigError(f"{owner}(epsilon={epsilon!r}) must be a number >= 0.")


def _log(beta: float) -> float:
    """log(beta) in float64 (-inf for 0: a correction of 1)."""
    return math.log(beta) if beta > 0 else -math.inf


def _powers(beta_1: float, beta_2: float, iterations: Any, dtype: Any) -> tuple[Any, Any]:
    """Keras's `beta ** (iterations + 1)`, in the variable's dtype."""
    local_step = (iterations + 1).astype(dtype)
    return (jnp.power(jnp.asarray(beta_1, dtype), local_step),
            jnp.power(jnp.asarray(beta_2, dtype), local_step))


class Adam(Optimizer):
    """Keras's Adam (`amsgrad=True`: with the running maximum of v). `epsilon_placement`:
    "keras" (Keras's step, the default) or "pytorch" (epsilon added after the bias
    correction, as torch.optim.Adam, optax.adam and MaxText)."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, amsgrad: bool = False,
                 epsilon_placement: str = "keras", **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _betas(type(self).__name__, beta_1, beta_2, epsilon)
        if epsilon_placement not in EPSILON_PLACEMENTS:
            raise ConfigError(
                f"{type(self).__name__}(epsilon_placement={epsilon_placement!r}); use \"keras\" "
                "(epsilon added to sqrt(v) before the bias correction, Keras's Adam) or "
                "\"pytorch\" (after it, as torch.optim.Adam, optax.adam and MaxText).")
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.amsgrad, self.epsilon_placement = bool(amsgrad), epsilon_placement

    @property
    def slot_names(self) -> tuple[str, ...]:
        return ("momentum", "velocity", "velocity_hat") if self.amsgrad else \
            ("momentum", "velocity")

    def decay(self, variable, learning_rate, weight_decay):
        if self.epsilon_placement == "pytorch":  # torch.optim.AdamW's param *= 1 - lr * wd
            return variable * (1 - learning_rate.astype(variable.dtype) * weight_decay)
        return super().decay(variable, learning_rate, weight_decay)

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        beta_1_power, beta_2_power = _powers(self.beta_1, self.beta_2, iterations, dtype)
        m = slots["momentum"] + (g - slots["momentum"]) * (1 - self.beta_1)
        v = slots["velocity"] + (jnp.square(g) - slots["velocity"]) * (1 - self.beta_2)
        own = {"momentum": m, "velocity": v}
        if self.amsgrad:
            v = own["velocity_hat"] = jnp.maximum(slots["velocity_hat"], v)
        if self.epsilon_placement == "pytorch":
            # torch.optim computes 1 - beta^t on the host in float64; 1 - beta^t in float32
            # cancels (1 - 0.999f is 1.3e-5 off 0.001): -expm1(t * log(beta)) does not.
            local_step = (iterations + 1).astype(dtype)
            correction_1 = -jnp.expm1(local_step * _log(self.beta_1))
            correction_2 = -jnp.expm1(local_step * _log(self.beta_2))
            denominator = jnp.sqrt(v) / jnp.sqrt(correction_2) + self.epsilon
            return sub((lr / correction_1) * (m / denominator)), own
        alpha = lr * jnp.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        return sub((m * alpha) / (jnp.sqrt(v) + self.epsilon)), own

    def _own_config(self):
        config = {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                  "amsgrad": self.amsgrad}
        if self.epsilon_placement != "keras":  # a Keras config stays one Keras reads
            config["epsilon_placement"] = self.epsilon_placement
        return config


class AdamW(Adam):
    """Keras's AdamW: Adam with weight decay (default 0.004), `var -= var * wd * lr` before
    each step (as torch.optim.AdamW's `param *= 1 - lr * wd`)."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001,
                 weight_decay: float = 0.004, **kwargs: Any) -> None:
        if weight_decay is None:
            raise ConfigError("AdamW(weight_decay=None): AdamW's weight decay must be a number "
                              "(Keras's default 0.004; 0.0 for none, or use Adam).")
        super().__init__(learning_rate, weight_decay=weight_decay, **kwargs)


class _Moments(Optimizer):
    """The arguments Keras's Nadam, Adamax and Lamb share: beta_1, beta_2, epsilon."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _betas(type(self).__name__, beta_1, beta_2, epsilon)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)

    def _own_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}


class Nadam(_Moments):
    """Keras's Nadam (Dozat 2016): Adam with Nesterov momentum whose coefficient
    `u_t = beta_1 * (1 - 0.5 * 0.96^t)` changes per step, their product kept in the state."""

    slot_names = ("momentum", "velocity")

    def init_shared(self, dtype):
        return {"u_product": jnp.ones([], dtype)}

    def update_shared(self, shared, iterations):
        u_product = shared["u_product"]
        local_step = (iterations + 1).astype(u_product.dtype)
        decay = 1.0 - 0.5 * jnp.power(jnp.asarray(0.96), local_step)
        return {"u_product": u_product * self.beta_1 * decay}

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        local_step, next_step = (iterations + 1).astype(dtype), (iterations + 2).astype(dtype)
        decay = jnp.asarray(0.96, dtype)
        beta_1, beta_2 = jnp.asarray(self.beta_1, dtype), jnp.asarray(self.beta_2, dtype)
        u_t = beta_1 * (1.0 - 0.5 * jnp.power(decay, local_step))
        u_t_1 = beta_1 * (1.0 - 0.5 * jnp.power(decay, next_step))
        u_product_t = shared["u_product"].astype(dtype)
        u_product_t_1 = u_product_t * u_t_1
        beta_2_power = jnp.power(beta_2, local_step)
        m = slots["momentum"] + (g - slots["momentum"]) * (1 - beta_1)
        v = slots["velocity"] + (jnp.square(g) - slots["velocity"]) * (1 - beta_2)
        m_hat = (u_t_1 * m) / (1 - u_product_t_1) + ((1 - u_t) * g) / (1 - u_product_t)
        v_hat = v / (1 - beta_2_power)
        return sub((m_hat * lr) / (jnp.sqrt(v_hat) + self.epsilon)), \
            {"momentum": m, "velocity": v}


class Adamax(_Moments):
    """Keras's Adamax: Adam with the infinity norm, `u = max(beta_2 * u, |g|)`."""

    slot_names = ("momentum", "norm")

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        beta_1_power, _ = _powers(self.beta_1, self.beta_2, iterations, dtype)
        m = slots["momentum"] + (g - slots["momentum"]) * (1 - self.beta_1)
        u = jnp.maximum(self.beta_2 * slots["norm"], jnp.abs(g))
        return sub((lr * m) / ((1 - beta_1_power) * (u + self.epsilon))), \
            {"momentum": m, "norm": u}


class Lamb(_Moments):
    """LAMB (You et al. 2019) as Keras 3's `Lamb`: Adam's bias-corrected direction scaled per
    variable by the trust ratio ||w|| / ||direction||, so very large batches (32K for BERT)
    train at large learning rates. Weight decay is Keras's (`var -= var * wd * lr` before
    the step), not inside the trust ratio as in optax.lamb."""

    slot_names = ("momentum", "velocity")

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        beta_1_power, beta_2_power = _powers(self.beta_1, self.beta_2, iterations, dtype)
        m = slots["momentum"] + (g - slots["momentum"]) * (1 - self.beta_1)
        v = slots["velocity"] + (jnp.square(g) - slots["velocity"]) * (1 - self.beta_2)
        m_t_hat = m / (1.0 - beta_1_power)
        v_sqrt = jnp.sqrt(v / (1.0 - beta_2_power)) + self.epsilon
        update = m_t_hat / v_sqrt
        w_norm = jnp.sqrt(jnp.sum(jnp.power(variable, 2)))
        g_norm = jnp.sqrt(jnp.sum(jnp.power(update, 2)))
        ratio = jnp.where(w_norm > 0, jnp.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
        return sub(ratio * lr * update), {"momentum": m, "velocity": v}
