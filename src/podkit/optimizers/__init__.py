"""Optimizers as in Keras 3 (`pk.optimizers.Adam(learning_rate=1e-3 | schedule)`), over Optax.

An optimizer is a description; `transform()` builds the Optax transformation the compiled step
runs. The learning rate lives in the optimizer *state* (`optax.inject_hyperparams`), not in the
compiled program, so `model.optimizer.learning_rate = 1e-4` (what LearningRateScheduler and
ReduceLROnPlateau do) changes one number on the devices and never recompiles. A schedule is
evaluated on the device from the optimizer's step count.

Names work as in Keras: `compile(optimizer="adam")` is `Adam()` with Keras's defaults. A plain
`optax.GradientTransformation` is accepted too; its learning rate is reachable only when it was
built with `optax.inject_hyperparams`.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import optax

from podkit import serialization
from podkit.errors import ConfigError
from podkit.optimizers import schedules
from podkit.optimizers.schedules import LearningRateSchedule

__all__ = [
    "SGD", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Lamb", "Lars", "Lion", "Nadam",
    "Optimizer", "RMSprop",
    "get", "learning_rate_of", "schedules", "with_learning_rate",
]


class StateAccess(Protocol):
    """How an optimizer compiled into a model reads and replaces its state (see Model)."""

    def get_opt_state(self) -> Any: ...
    def set_opt_state(self, opt_state: Any) -> None: ...


class Optimizer:
    """Base class: Keras's optimizer arguments; subclasses give the update direction."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, *,
                 weight_decay: float | None = None, clipnorm: float | None = None,
                 clipvalue: float | None = None, global_clipnorm: float | None = None,
                 name: str | None = None, **unknown: Any) -> None:
        if unknown:
            hint = " Keras 3's name for the rate is learning_rate=." if "lr" in unknown else ""
            raise ConfigError(f"{type(self).__name__}() got arguments podkit does not support: "
                              f"{', '.join(sorted(unknown))}.{hint}")
        self._learning_rate = _check_learning_rate(learning_rate)
        for what, v in (("weight_decay", weight_decay), ("clipnorm", clipnorm),
                        ("clipvalue", clipvalue), ("global_clipnorm", global_clipnorm)):
            if v is not None and (not isinstance(v, int | float) or v < 0):
                raise ConfigError(f"{type(self).__name__}({what}={v!r}) must be a number >= 0.")
        if clipnorm is not None and global_clipnorm is not None:
            raise ConfigError("pass clipnorm or global_clipnorm, not both.")
        self.weight_decay, self.clipnorm = weight_decay, clipnorm
        self.clipvalue, self.global_clipnorm = clipvalue, global_clipnorm
        self.name = name or type(self).__name__.lower()
        self._access: StateAccess | None = None

    # -- the transformation ---------------------------------------------------------------------
    def _direction(self) -> optax.GradientTransformation:
        """The update before weight decay and the learning rate (Adam's m/sqrt(v), ...)."""
        raise NotImplementedError

    def _decay(self) -> list[optax.GradientTransformation]:
        """Decoupled weight decay, as Keras: var -= lr * wd * var."""
        return [optax.add_decayed_weights(self.weight_decay)] if self.weight_decay else []

    def _direction_and_decay(self) -> list[optax.GradientTransformation]:
        """The update direction, then weight decay (LAMB and LARS scale both by the
        layer-wise trust ratio)."""
        return [self._direction(), *self._decay()]

    def transform(self) -> optax.GradientTransformation:
        def factory(learning_rate: Any) -> optax.GradientTransformation:
            parts = []
            if self.clipvalue is not None:
                parts.append(optax.clip(self.clipvalue))
            if self.clipnorm is not None:
                parts.append(_clip_each_by_norm(self.clipnorm))
            if self.global_clipnorm is not None:
                parts.append(optax.clip_by_global_norm(self.global_clipnorm))
            parts.extend(self._direction_and_decay())
            parts.append(optax.scale_by_learning_rate(learning_rate))
            return optax.chain(*parts)

        return inject_learning_rate(factory, self._learning_rate)

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


class SGD(Optimizer):
    def __init__(self, learning_rate: float | LearningRateSchedule = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"SGD(momentum={momentum!r}) must be in [0, 1).")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _direction(self):
        if self.momentum == 0:
            return optax.identity()
        return optax.trace(decay=self.momentum, nesterov=self.nesterov)

    def _own_config(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov}


class Adam(Optimizer):
    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, amsgrad: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.amsgrad = bool(amsgrad)

    def _direction(self):
        if self.amsgrad:
            return optax.scale_by_amsgrad(self.beta_1, self.beta_2, self.epsilon)
        return optax.scale_by_adam(self.beta_1, self.beta_2, self.epsilon)

    def _own_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "amsgrad": self.amsgrad}


class AdamW(Adam):
    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001,
                 weight_decay: float = 0.004, **kwargs: Any) -> None:
        super().__init__(learning_rate, weight_decay=weight_decay, **kwargs)


class Nadam(Adam):
    def _direction(self):
        return optax.scale_by_adam(self.beta_1, self.beta_2, self.epsilon, nesterov=True)


class Adamax(Adam):
    def _direction(self):
        return optax.scale_by_adamax(self.beta_1, self.beta_2, self.epsilon)


class RMSprop(Optimizer):
    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, rho: float = 0.9,
                 momentum: float = 0.0, epsilon: float = 1e-7, centered: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)
        self.centered = bool(centered)

    def _direction(self):
        # Keras 3: g / sqrt(velocity + epsilon), epsilon inside the square root.
        scale = (optax.scale_by_stddev if self.centered else optax.scale_by_rms)(
            decay=self.rho, eps=self.epsilon, eps_in_sqrt=True)
        if self.momentum:
            return optax.chain(scale, optax.trace(decay=self.momentum))
        return scale

    def _own_config(self):
        return {"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}


class Adagrad(Optimizer):
    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001,
                 initial_accumulator_value: float = 0.1, epsilon: float = 1e-7,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.initial_accumulator_value, self.epsilon = initial_accumulator_value, epsilon

    def _direction(self):
        return optax.scale_by_rss(self.initial_accumulator_value, self.epsilon)

    def _own_config(self):
        return {"initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon}


class Lion(Optimizer):
    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.99, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)

    def _direction(self):
        return optax.scale_by_lion(self.beta_1, self.beta_2)

    def _own_config(self):
        return {"beta_1": self.beta_1, "beta_2": self.beta_2}


class Lamb(Adam):
    """LAMB (You et al. 2019), Keras 3's `Lamb`: Adam's direction plus weight decay, scaled per
    parameter by the trust ratio ||w|| / ||update||, so very large batches (32K for BERT)
    train at large learning rates. Optax's `lamb` order: adam, decay, trust ratio, rate."""

    def __init__(self, learning_rate: float | LearningRateSchedule = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, **kwargs)

    def _direction_and_decay(self):
        return [self._direction(), *self._decay(), optax.scale_by_trust_ratio()]


class Lars(Optimizer):
    """LARS (You et al. 2017): SGD whose step for each parameter is scaled by the trust ratio
    ||w|| / ||g + wd * w|| times `trust_coefficient`, then momentum: ResNet-50 at batch 32K.
    Not in Keras 3; Optax's `lars` order: decay, trust ratio, momentum, rate."""

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

    def _direction_and_decay(self):
        parts = [*self._decay(), optax.scale_by_trust_ratio(
            trust_coefficient=self.trust_coefficient, eps=self.epsilon)]
        if self.momentum:
            parts.append(optax.trace(decay=self.momentum, nesterov=self.nesterov))
        return parts

    def _own_config(self):
        return {"momentum": self.momentum, "nesterov": self.nesterov,
                "trust_coefficient": self.trust_coefficient, "epsilon": self.epsilon}


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern 2018) with Keras 3's arguments: second moments factored
    into row and column statistics (memory O(rows + cols) per matrix, not O(rows x cols)),
    decay 1 - t^beta_2_decay, updates clipped to RMS `clip_threshold`, scaled by the
    parameter's RMS (at least `epsilon_2`), and with `relative_step` the rate capped by
    1/sqrt(t). Over Optax's pieces (`scale_by_factored_rms` factors matrices whose two
    largest dimensions are >= 128; smaller ones keep a full second moment)."""

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

    def _direction(self):
        parts = [optax.scale_by_factored_rms(decay_rate=-self.beta_2_decay,
                                             epsilon=self.epsilon_1),
                 optax.clip_by_block_rms(self.clip_threshold),
                 optax.scale_by_param_block_rms(self.epsilon_2)]
        if self.relative_step:
            parts.append(_relative_step(self._learning_rate))
        return optax.chain(*parts)

    def _own_config(self):
        return {"beta_2_decay": self.beta_2_decay, "epsilon_1": self.epsilon_1,
                "epsilon_2": self.epsilon_2, "clip_threshold": self.clip_threshold,
                "relative_step": self.relative_step}


def _relative_step(learning_rate: Any) -> optax.GradientTransformation:
    """Scales updates so that the rate the optimizer then applies, lr, becomes
    min(lr, 1/sqrt(t)) (Keras's Adafactor with relative_step)."""

    def init(params: Any) -> optax.ScaleByScheduleState:
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        t = (state.count + 1).astype(jnp.float32)
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        factor = jnp.minimum(1.0, 1.0 / (jnp.sqrt(t) * jnp.maximum(lr, 1e-30)))
        updates = jax.tree.map(lambda u: u * factor.astype(u.dtype), updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init, update)


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


def inject_learning_rate(factory: Any, learning_rate: float | LearningRateSchedule
                         ) -> optax.GradientTransformation:
    """`optax.inject_hyperparams(factory)(learning_rate=...)` with one state tree for a float
    and a schedule: the rate in `hyperparams`, no `hyperparams_states`. A schedule is evaluated
    from the state's own step count (`count`) at every update, so a resumed run may switch
    between a constant rate and a schedule, or to another schedule, and the new one continues
    from the restored count (optax's schedule state would be another tree, a copy of that
    count; `checkpoint.arrays.DROPPED` leaves it unread in older files)."""
    if not callable(learning_rate):
        return optax.inject_hyperparams(factory)(learning_rate=learning_rate)
    schedule = learning_rate
    tx = optax.inject_hyperparams(factory)(learning_rate=0.0)

    def with_rate(state: Any) -> Any:
        value = jnp.asarray(schedule(state.count))
        if getattr(value, "weak_type", False) or not jnp.issubdtype(value.dtype, jnp.floating):
            # optax's rule: a weakly typed rate takes the state's dtype (the parameters')
            value = value.astype(state.hyperparams["learning_rate"].dtype)
        return state._replace(hyperparams={**state.hyperparams, "learning_rate": value})

    def init(params: Any) -> Any:
        return with_rate(tx.init(params))

    def update(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> Any:
        return tx.update(updates, with_rate(state), params, **extra_args)

    return optax.GradientTransformationExtraArgs(init, update)


def _clip_each_by_norm(max_norm: float) -> optax.GradientTransformation:
    """Keras's clipnorm: each gradient tensor is scaled to a norm of at most max_norm."""

    def update(updates, state, params=None):
        def clip(g):
            norm = jnp.sqrt(jnp.sum(jnp.square(g)))
            return g * jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-12))

        return jax.tree.map(clip, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


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


# -- the learning rate inside an optimizer state -----------------------------------------------
_INJECTED = (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)


def _is_injected(node: Any) -> bool:
    return isinstance(node, _INJECTED)


def learning_rate_of(opt_state: Any) -> float | None:
    """The learning rate held in an optimizer state (None when it holds none)."""
    for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
        if _is_injected(node) and "learning_rate" in node.hyperparams:
            return float(jax.device_get(node.hyperparams["learning_rate"]))
    return None


def learning_rate_in(opt_state: Any) -> Any:
    """The learning-rate array held in an optimizer state, inside a traced step (None when
    it holds none)."""
    for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
        if _is_injected(node) and "learning_rate" in node.hyperparams:
            return node.hyperparams["learning_rate"]
    return None


def step_count_of(opt_state: Any) -> int:
    """The optimizer steps taken, as the state counts them (what schedules read)."""
    for node in jax.tree.leaves(opt_state, is_leaf=_is_injected):
        if _is_injected(node):
            return int(jax.device_get(node.count))
    return 0


def with_learning_rate(opt_state: Any, value: float) -> Any:
    """The same optimizer state with a new learning rate: same dtype and placement, so the
    compiled step is reused as it is."""
    found = []

    def replace(node: Any) -> Any:
        if _is_injected(node) and "learning_rate" in node.hyperparams and not found:
            old = node.hyperparams["learning_rate"]
            new = jnp.asarray(value, old.dtype)
            if isinstance(old, jax.Array):
                new = jax.device_put(new, old.sharding)
            found.append(True)
            return node._replace(hyperparams={**node.hyperparams, "learning_rate": new})
        return node

    out = jax.tree.map(replace, opt_state, is_leaf=_is_injected)
    if not found:
        raise ConfigError("this optimizer state holds no learning rate (see OptaxOptimizer).")
    return out


CLASSES: dict[str, type[Optimizer]] = {c.__name__: c for c in (
    SGD, Adam, AdamW, Nadam, Adamax, RMSprop, Adagrad, Lion, Lamb, Lars, Adafactor)}
NAMES: dict[str, type[Optimizer]] = {k.lower(): v for k, v in CLASSES.items()}


def get(optimizer: str | Optimizer | optax.GradientTransformation,
        learning_rate: float | LearningRateSchedule | None = None) -> Optimizer:
    """A Keras name (with an optional learning rate), an Optimizer, or an optax transform."""
    if isinstance(optimizer, str):
        cls = NAMES.get(optimizer.lower())
        if cls is None:
            raise ConfigError(f"unknown optimizer {optimizer!r}; valid names: "
                              f"{', '.join(sorted(NAMES))}, or a pk.optimizers object, or an "
                              "optax.GradientTransformation.")
        return cls() if learning_rate is None else cls(learning_rate=learning_rate)
    if learning_rate is not None:
        raise ConfigError("learning_rate= applies to optimizer names only; an optimizer object "
                          "carries its own (e.g. pk.optimizers.Adam(learning_rate=...)).")
    if isinstance(optimizer, Optimizer):
        return optimizer
    if isinstance(optimizer, type) and issubclass(optimizer, Optimizer):
        return optimizer()
    if isinstance(optimizer, optax.GradientTransformation):
        return OptaxOptimizer(optimizer)
    raise ConfigError(f"optimizer={optimizer!r} is neither a name ({', '.join(sorted(NAMES))}), "
                      "a pk.optimizers object nor an optax.GradientTransformation.")


def serialize(optimizer: Optimizer) -> dict:
    return serialization.to_config(optimizer, CLASSES, "optimizer")


def deserialize(config: dict) -> Optimizer:
    return serialization.from_config(config, CLASSES, "optimizer")
