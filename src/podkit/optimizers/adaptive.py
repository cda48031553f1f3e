"""Keras 3's per-coordinate adaptive optimizers: RMSprop, Adagrad, Adadelta, Ftrl."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from podkit.errors import ConfigError
from podkit.optimizers.apply import add, assign, sub
from podkit.optimizers.base import Optimizer
from podkit.optimizers.schedules import LearningRateSchedule


class RMSprop(Optimizer):
    """Keras's RMSprop: `var -= lr * g / sqrt(velocity + eps)` (epsilon inside the square
    root), `centered` subtracting the squared mean gradient, `momentum` accumulating the
    steps."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, rho: float = 0.9,
                 momentum: float = 0.0, epsilon: float = 1e-7, centered: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)
        self.centered = bool(centered)

    @property
    def slot_names(self) -> tuple[str, ...]:
        return ("velocity", *(("momentum",) if self.momentum > 0 else ()),
                *(("average_gradient",) if self.centered else ()))

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        rho = self.rho
        velocity = rho * slots["velocity"] + (1 - rho) * jnp.square(g)
        own = {"velocity": velocity}
        if self.centered:
            average = own["average_gradient"] = \
                rho * slots["average_gradient"] + (1 - rho) * g
            denominator = velocity - jnp.square(average) + self.epsilon
        else:
            denominator = velocity + self.epsilon
        increment = (lr * g) / jnp.sqrt(denominator)
        if self.momentum > 0:
            own["momentum"] = self.momentum * slots["momentum"] + increment
            return sub(own["momentum"]), own
        return sub(increment), own

    def _own_config(self):
        return {"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}


class Adagrad(Optimizer):
    """Keras's Adagrad: `acc += g^2; var -= lr * g / sqrt(acc + eps)`."""

    slot_names = ("accumulator",)

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001,
                 initial_accumulator_value: float = 0.1, epsilon: float = 1e-7,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.epsilon = float(epsilon)

    def init_slot(self, name, param):
        return jnp.full_like(param, self.initial_accumulator_value)

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        accumulator = slots["accumulator"] + jnp.square(g)
        return sub((lr * g) / jnp.sqrt(accumulator + self.epsilon)), \
            {"accumulator": accumulator}

    def _own_config(self):
        return {"initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon}


class Adadelta(Optimizer):
    """Keras's Adadelta (Zeiler 2012): the step is `-sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps)
    * g`, times the learning rate (Keras's default 0.001; the paper's method is 1.0)."""

    slot_names = ("accumulated_grad", "accumulated_delta_var")

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, rho: float = 0.95,
                 epsilon: float = 1e-7, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        rho = self.rho

        def rms(x):
            return jnp.sqrt(x + self.epsilon)

        accumulated_grad = rho * slots["accumulated_grad"] + (1 - rho) * jnp.square(g)
        delta_var = -((rms(slots["accumulated_delta_var"]) * g) / rms(accumulated_grad))
        accumulated_delta_var = rho * slots["accumulated_delta_var"] + \
            (1 - rho) * jnp.square(delta_var)
        return add(lr * delta_var), {"accumulated_grad": accumulated_grad,
                                     "accumulated_delta_var": accumulated_delta_var}

    def _own_config(self):
        return {"rho": self.rho, "epsilon": self.epsilon}


class Ftrl(Optimizer):
    """Keras's FTRL-Proximal (McMahan et al. 2013): per-coordinate rates from the accumulated
    squared gradients, L1 and L2 regularization in closed form (sparse weights for large
    linear models), `l2_shrinkage_regularization_strength` and `beta` as Keras's."""

    slot_names = ("accumulator", "linear")

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001,
                 learning_rate_power: float = -0.5, initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0,
                 l2_shrinkage_regularization_strength: float = 0.0, beta: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        for what, v, ok, rule in (
                ("initial_accumulator_value", initial_accumulator_value, lambda x: x >= 0,
                 ">= 0"),
                ("learning_rate_power", learning_rate_power, lambda x: x <= 0, "<= 0"),
                ("l1_regularization_strength", l1_regularization_strength, lambda x: x >= 0,
                 ">= 0"),
                ("l2_regularization_strength", l2_regularization_strength, lambda x: x >= 0,
                 ">= 0"),
                ("l2_shrinkage_regularization_strength", l2_shrinkage_regularization_strength,
                 lambda x: x >= 0, ">= 0"),
                ("beta", beta, lambda x: True, "a number")):
            if isinstance(v, bool) or not isinstance(v, int | float) or not ok(v):
                raise ConfigError(f"Ftrl({what}={v!r}) must be {rule}.")
        self.learning_rate_power = float(learning_rate_power)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.l1_regularization_strength = float(l1_regularization_strength)
        self.l2_regularization_strength = float(l2_regularization_strength)
        self.l2_shrinkage_regularization_strength = float(l2_shrinkage_regularization_strength)
        self.beta = float(beta)

    def init_slot(self, name, param):
        if name == "accumulator":
            return jnp.full_like(param, self.initial_accumulator_value)
        return jnp.zeros_like(param)

    def update_step(self, gradient, variable, slots, learning_rate, iterations, shared):
        dtype = variable.dtype
        lr, g = learning_rate.astype(dtype), gradient.astype(dtype)
        accum, linear = slots["accumulator"], slots["linear"]
        power = jnp.asarray(-self.learning_rate_power)
        l2_reg = self.l2_regularization_strength + self.beta / (2.0 * lr)
        grad_to_use = g + (2 * self.l2_shrinkage_regularization_strength) * variable
        new_accum = accum + jnp.square(g)
        linear = linear + (grad_to_use - (
            (jnp.power(new_accum, power) - jnp.power(accum, power)) / lr) * variable)
        quadratic = jnp.power(new_accum, power) / lr + 2 * l2_reg
        l1 = self.l1_regularization_strength
        linear_clipped = jnp.clip(linear, -l1, l1)
        return assign((linear_clipped - linear) / quadratic), \
            {"accumulator": new_accum, "linear": linear}

    def _own_config(self):
        return {"learning_rate_power": self.learning_rate_power,
                "initial_accumulator_value": self.initial_accumulator_value,
                "l1_regularization_strength": self.l1_regularization_strength,
                "l2_regularization_strength": self.l2_regularization_strength,
                "l2_shrinkage_regularization_strength":
                    self.l2_shrinkage_regularization_strength,
                "beta": self.beta}
