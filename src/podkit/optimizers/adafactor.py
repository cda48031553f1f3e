"""Adafactor (Shazeer & Stern 2018) as Keras 3 computes it."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.optimizers.apply import sub
from podkit.optimizers.base import Optimizer
from podkit.optimizers.schedules import LearningRateSchedule


def _rms(x: Any) -> Any:
    return jnp.sqrt(jnp.mean(jnp.square(x)))


class Adafactor(Optimizer):
    """Keras 3's Adafactor: the second moment of a variable of rank >= 2 factored into
    row and column statistics over its last two dimensions (memory O(rows + cols), not
    O(rows x cols)), decay `1 - t^beta_2_decay`, updates clipped to RMS `clip_threshold`,
    the step `max(epsilon_2, rms(var)) * min(lr, 1/sqrt(t))`.

    As in Keras 3, the step takes `min(lr, 1/sqrt(t))` whatever `relative_step` says (Keras
    applies the same minimum a second time when it is True), so `relative_step=False`
    changes nothing. Keras keeps a full-size velocity for factored variables, which it
    recomputes from the factors before each use; podkit keeps a scalar in its place (the
    same steps, without the memory)."""

    slot_names = ("r", "c", "v")

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001,
                 beta_2_decay: float = -0.8, epsilon_1: float = 1e-30, epsilon_2: float = 1e-3,
                 clip_threshold: float = 1.0, relative_step: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if not beta_2_decay < 0:
            raise ConfigError(f"Adafactor(beta_2_decay={beta_2_decay!r}) must be < 0 "
                              "(Keras's default -0.8).")
        if not clip_threshold > 0:
            raise ConfigError(f"Adafactor(clip_threshold={clip_threshold!r}) must be > 0.")
        self.beta_2_decay, self.epsilon_1 = float(beta_2_decay), float(epsilon_1)
        self.epsilon_2, self.clip_threshold = float(epsilon_2), float(clip_threshold)
        self.relative_step = bool(relative_step)

    def init_slot(self, name, param):
        factored = param.ndim >= 2
        if name == "r" and factored:
            return jnp.zeros(param.shape[:-1], param.dtype)
        if name == "c" and factored:
            return jnp.zeros((*param.shape[:-2], param.shape[-1]), param.dtype)
        if name == "v" and not factored:
            return jnp.zeros_like(param)
        return jnp.zeros([], param.dtype)  # Keras's placeholder: unused for this variable

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        epsilon_2 = jnp.asarray(self.epsilon_2, dtype)
        one = jnp.asarray(1.0, dtype)
        local_step = (iterations + 1).astype(dtype)
        rho_t = jnp.minimum(lr, 1 / jnp.sqrt(local_step))
        alpha_t = jnp.maximum(epsilon_2, _rms(variable)) * rho_t
        regulated_grad_square = jnp.square(g) + self.epsilon_1
        beta_2_t = 1 - jnp.power(local_step, jnp.asarray(self.beta_2_decay))
        own = dict(slots)
        if variable.ndim >= 2:
            r = beta_2_t * slots["r"] + (1 - beta_2_t) * jnp.mean(regulated_grad_square,
                                                                  axis=-1)
            c = beta_2_t * slots["c"] + (1 - beta_2_t) * jnp.mean(regulated_grad_square,
                                                                  axis=-2)
            v = jnp.expand_dims(r / jnp.mean(r, axis=-1, keepdims=True), -1) * \
                jnp.expand_dims(c, -2)
            own.update(r=r, c=c)
        else:
            v = own["v"] = beta_2_t * slots["v"] + (1 - beta_2_t) * regulated_grad_square
        u_t = g / jnp.sqrt(v)
        u_t_hat = u_t / jnp.maximum(one, _rms(u_t) / self.clip_threshold)
        return sub(alpha_t * u_t_hat), own

    def _own_config(self):
        return {"beta_2_decay": self.beta_2_decay, "epsilon_1": self.epsilon_1,
                "epsilon_2": self.epsilon_2, "clip_threshold": self.clip_threshold,
                "relative_step": self.relative_step}
