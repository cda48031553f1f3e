"""The optimizer base class: Keras 3's `BaseOptimizer` arguments, the learning rate held in
the optimizer state, the config; and `OptaxOptimizer`, a user's Optax transformation.

A subclass gives Keras's per-variable update (`slot_names`, `init_slot`, `update_step`, and
for Nadam the scalars shared across variables); `transform()` wraps it in Keras's
`apply` (podkit.optimizers.apply: clipping, weight decay, EMA, iterations) inside
`inject_learning_rate`, so the rate is optimizer state.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax

from podkit.errors import ConfigError
from podkit.optimizers import schedules
from podkit.optimizers.apply import Options, Step, keras_transform
from podkit.optimizers.schedules import LearningRateSchedule
from podkit.optimizers.state import (
    inject_learning_rate,
    learning_rate_of,
    step_count_of,
    with_learning_rate,
)


class StateAccess(Protocol):
    """How an optimizer compiled into a model reads and replaces its state (see Model)."""

    def get_opt_state(self) -> Any: ...
    def set_opt_state(self, opt_state: Any) -> None: ...


class Optimizer:
    """Base class: Keras's optimizer arguments; subclasses give the update step."""

    slot_names: tuple[str, ...] = ()

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, *,
                 weight_decay: float | None = None, clipnorm: float | None = None,
                 clipvalue: float | None = None, global_clipnorm: float | None = None,
                 use_ema: bool = False, ema_momentum: float = 0.99,
                 ema_overwrite_frequency: int | None = None,
                 loss_scale_factor: float | None = None,
                 gradient_accumulation_steps: int | None = None,
                 name: str | None = None, **unknown: Any) -> None:
        owner = type(self).__name__
        if unknown:
            hint = " Keras 3's name for the rate is learning_rate=." if "lr" in unknown else ""
            raise ConfigError(f"{owner}() got arguments podkit does not support: "
                              f"{', '.join(sorted(unknown))}.{hint}")
        if loss_scale_factor is not None:
            raise ConfigError(f"{owner}(loss_scale_factor={loss_scale_factor!r}) is not "
                              "supported: podkit computes losses and gradients in float32 "
                              "(mixed precision keeps float32 master weights); leave it None.")
        if gradient_accumulation_steps is not None:
            raise ConfigError(
                f"{owner}(gradient_accumulation_steps={gradient_accumulation_steps!r}) is not "
                "supported; compile(microbatches=k) splits each batch into k parts whose "
                "gradients one optimizer step applies (one step per batch, not per k batches).")
        self._learning_rate = _check_learning_rate(learning_rate)
        for what, v in (("weight_decay", weight_decay), ("clipnorm", clipnorm),
                        ("clipvalue", clipvalue), ("global_clipnorm", global_clipnorm)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not v >= 0):
                raise ConfigError(f"{owner}({what}={v!r}) must be a number >= 0 (or None).")
        clips = {k: v for k, v in (("clipnorm", clipnorm), ("clipvalue", clipvalue),
                                   ("global_clipnorm", global_clipnorm)) if v is not None}
        if len(clips) > 1:  # Keras's rule: it applies only one of them
            raise ConfigError(f"{owner}({', '.join(f'{k}={v!r}' for k, v in clips.items())}): "
                              "pass one of clipnorm, clipvalue and global_clipnorm, as Keras.")
        if not isinstance(use_ema, bool):
            raise ConfigError(f"{owner}(use_ema={use_ema!r}) must be True or False.")
        if isinstance(ema_momentum, bool) or not isinstance(ema_momentum, int | float) or \
                not 0 <= ema_momentum <= 1:
            raise ConfigError(f"{owner}(ema_momentum={ema_momentum!r}) must be in [0, 1].")
        if ema_overwrite_frequency is not None and (
                isinstance(ema_overwrite_frequency, bool)
                or not isinstance(ema_overwrite_frequency, int) or ema_overwrite_frequency < 1):
            raise ConfigError(f"{owner}(ema_overwrite_frequency={ema_overwrite_frequency!r}) "
                              "must be an int >= 1 or None.")
        if not use_ema and (ema_momentum != 0.99 or ema_overwrite_frequency is not None):
            raise ConfigError(f"{owner}(ema_momentum={ema_momentum!r}, ema_overwrite_frequency="
                              f"{ema_overwrite_frequency!r}) apply with use_ema=True only; "
                              "set use_ema=True or leave them out.")
        self.weight_decay, self.clipnorm = _number(weight_decay), _number(clipnorm)
        self.clipvalue, self.global_clipnorm = _number(clipvalue), _number(global_clipnorm)
        self.use_ema, self.ema_momentum = use_ema, float(ema_momentum)
        self.ema_overwrite_frequency = ema_overwrite_frequency
        self.name = name or type(self).__name__.lower()
        self._exclude_pattern: str | None = None
        self._access: StateAccess | None = None

    # -- Keras's per-variable update (subclasses) ------------------------------------------------
    def init_slot(self, name: str, param: jax.Array) -> jax.Array:
        """The initial value of one slot of one variable (Keras's `add_variable_from_reference`:
        zeros unless the optimizer says otherwise)."""
        del name
        return jnp.zeros_like(param)

    def init_shared(self, dtype: Any) -> dict[str, jax.Array]:
        """Scalars the optimizer keeps once for all variables (Nadam's)."""
        del dtype
        return {}

    def update_shared(self, shared: dict[str, jax.Array], iterations: jax.Array
                      ) -> dict[str, jax.Array]:
        """The shared scalars' update, once per step before the variables' (Nadam's)."""
        del iterations
        return shared

    def decay(self, variable: jax.Array, learning_rate: jax.Array, weight_decay: float
              ) -> jax.Array:
        """Keras's `_apply_weight_decay`, before the update step: `var - var * wd * lr`."""
        lr = learning_rate.astype(variable.dtype)
        wd = jnp.asarray(weight_decay, variable.dtype)
        return variable - variable * wd * lr

    def update_step(self, gradient: jax.Array, variable: jax.Array, slots: dict[str, Any],
                    learning_rate: jax.Array, iterations: jax.Array,
                    shared: dict[str, jax.Array]) -> tuple[Step, dict[str, Any]]:
        """Keras's `update_step`: how the variable changes, and the slots' new values."""
        raise NotImplementedError

    def _options(self) -> Options:
        return Options(weight_decay=self.weight_decay, clipnorm=self.clipnorm,
                       clipvalue=self.clipvalue, global_clipnorm=self.global_clipnorm,
                       use_ema=self.use_ema, ema_momentum=self.ema_momentum,
                       ema_overwrite_frequency=self.ema_overwrite_frequency,
                       exclude_pattern=self._exclude_pattern)

    def transform(self) -> optax.GradientTransformation:
        options = self._options()

        def factory(learning_rate: Any) -> optax.GradientTransformation:
            return keras_transform(self, learning_rate, options)

        return inject_learning_rate(factory, self._learning_rate)

    def exclude_from_weight_decay(self, var_list: Any = None,
                                  var_names: list[str] | None = None) -> None:
        """Keras's: weights whose name contains one of `var_names` (a regex each, searched
        in the weight's name, e.g. "bias" or "gamma") get no weight decay. Call it before
        compile(). `var_list` (variable objects) is not supported: name them. As in Keras,
        the exclusion is not part of `get_config()`."""
        if self._opt_state() is not None:
            raise ConfigError("exclude_from_weight_decay() after the model was built changes "
                              "nothing it trains with; call it before compile(), as Keras "
                              "requires it before the optimizer is built.")
        if var_list:
            raise ConfigError("exclude_from_weight_decay(var_list=...) is not supported: "
                              "podkit's optimizer sees parameters by name; pass var_names "
                              "(e.g. var_names=['bias', 'gamma']).")
        names = list(var_names or [])
        for n in names:
            if not isinstance(n, str):
                raise ConfigError(f"exclude_from_weight_decay(var_names={names!r}): each must "
                                  "be a string.")
        pattern = "|".join(sorted(set(names))) if names else None
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ConfigError(f"exclude_from_weight_decay(var_names={names!r}): {e}; each "
                                  "name is a regular expression, as in Keras.") from None
        self._exclude_pattern = pattern

    # -- the learning rate ----------------------------------------------------------------------
    def attach(self, access: StateAccess | None) -> None:
        """Called by Model.compile: `learning_rate` then reads and writes the model's state."""
        self._access = access

    def _opt_state(self) -> Any:
        """The optimizer state of the model this optimizer is compiled into (None before the
        model is built, or when not compiled into one)."""
        return None if self._access is None else self._access.get_opt_state()

    @property
    def learning_rate(self) -> float:
        """The current learning rate: from the model's state once it exists (a schedule's
        value at the number of steps taken, as Keras)."""
        lr, opt_state = self._learning_rate, self._opt_state()
        if callable(lr):
            return float(lr(0 if opt_state is None else step_count_of(opt_state)))
        value = None if opt_state is None else learning_rate_of(opt_state)
        return float(lr) if value is None else value

    @property
    def follows_schedule(self) -> bool:
        """Whether the learning rate is a schedule (then no callback may set it)."""
        return callable(self._learning_rate)

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        if isinstance(self._learning_rate, LearningRateSchedule) or callable(value):
            raise ConfigError(
                f"{type(self).__name__} follows the schedule {self._learning_rate!r}; its "
                "learning rate cannot also be set. Compile with a float learning rate to set it "
                "from a callback.")
        self._learning_rate = _check_learning_rate(value)
        opt_state = self._opt_state()
        if opt_state is not None:
            self._access.set_opt_state(with_learning_rate(opt_state, self._learning_rate))

    @property
    def iterations(self) -> int:
        """Optimizer steps taken (Keras's `optimizer.iterations`)."""
        opt_state = self._opt_state()
        return 0 if opt_state is None else step_count_of(opt_state)

    # -- config -------------------------------------------------------------------------------
    def get_config(self) -> dict:
        lr = self._learning_rate
        return {"learning_rate": schedules.serialize(lr) if callable(lr) else lr,
                "weight_decay": self.weight_decay, "clipnorm": self.clipnorm,
                "clipvalue": self.clipvalue, "global_clipnorm": self.global_clipnorm,
                "use_ema": self.use_ema, "ema_momentum": self.ema_momentum,
                "ema_overwrite_frequency": self.ema_overwrite_frequency,
                "name": self.name, **self._own_config()}

    def _own_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config: dict) -> Optimizer:
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = schedules.deserialize(config["learning_rate"])
        return cls(**config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learning_rate={self._learning_rate!r})"


class OptaxOptimizer(Optimizer):
    """A user's optax transformation, as given."""

    def __init__(self, tx: optax.GradientTransformation) -> None:
        self.tx = tx
        self.name = "optax"
        self._access = None
        self._learning_rate = None

    def transform(self) -> optax.GradientTransformation:
        return self.tx

    @property
    def learning_rate(self) -> float:
        opt_state = self._opt_state()
        value = None if opt_state is None else learning_rate_of(opt_state)
        if value is None:
            raise ConfigError(self._no_rate())
        return value

    @property
    def follows_schedule(self) -> bool:
        """Whether the learning rate is a schedule (then no callback may set it)."""
        return callable(self._learning_rate)

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        opt_state = self._opt_state()
        if opt_state is None or learning_rate_of(opt_state) is None:
            raise ConfigError(self._no_rate())
        self._access.set_opt_state(with_learning_rate(opt_state, _check_learning_rate(value)))

    def _no_rate(self) -> str:
        return ("this optimizer is a plain optax transformation: podkit cannot see its learning "
                "rate. Use pk.optimizers.Adam(...) (or another pk.optimizers class), or build "
                "the transformation with optax.inject_hyperparams.")

    def get_config(self) -> dict:
        raise ConfigError("an optax transformation cannot be saved as a config; compile the "
                          "loaded model with it again (its state is saved with the weights).")

    def __repr__(self) -> str:
        return f"OptaxOptimizer({self.tx!r})"


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _check_learning_rate(value: Any) -> float | LearningRateSchedule:
    if isinstance(value, LearningRateSchedule):
        return value
    if callable(value):
        raise ConfigError(
            f"learning_rate={value!r} is a function; pass a pk.optimizers.schedules object "
            "(CosineDecay, ExponentialDecay, PiecewiseConstantDecay, or a subclass of "
            "LearningRateSchedule), which can be saved with the model.")
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"learning_rate={value!r} must be a number >= 0 or a schedule.")
    return float(value)
