"""Sequential and Model: Keras's compile / fit / evaluate / predict / summary on Flax NNX.

State is built as shapes first (`nnx.eval_shape`), then created directly in its shardings by a
jitted init with `out_shardings` - never built on one device and copied. The steps are pure
functions of that state (podkit.train.step); the loop (podkit.train.loop) drives them.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from podkit import data as data_lib
from podkit import losses as losses_lib
from podkit import metrics as metrics_lib
from podkit import optimizers as optimizers_lib
from podkit.errors import ConfigError, InputError
from podkit.layers import Layer, build_sequential
from podkit.sharding import state_shardings
from podkit.strategy import _CURRENT, Strategy, current_strategy
from podkit.train import loop as loop_lib
from podkit.train.feed import (
    ArrayFeed,
    BatchFeed,
    StagedDatasetFeed,
    check_divisible,
    dataset_input,
)
from podkit.train.hooks import Callback, History
from podkit.train.step import StepSpec, make_eval_step, make_predict_step, make_train_step

REMAINDER_OPTIONS = ("pad", "drop")


class Model:
    """Keras's Model over any Flax NNX module.

    `Model(module)` wraps a built module (its state is placed into the strategy's shardings);
    `Model(lambda rngs: MyModule(..., rngs=rngs))` builds it inside jit, already sharded.
    """

    def __init__(self, module: nnx.Module | Callable[[nnx.Rngs], nnx.Module] | None = None,
                 seed: int = 0) -> None:
        self._module_or_factory = module
        self.seed = seed
        self._strategy: Strategy | None = _CURRENT.get()
        self._compiled: dict | None = None
        self.state: dict | None = None
        self._spec: StepSpec | None = None
        self._steps: dict[str, Callable] = {}
        self.input_shape: tuple[int, ...] | None = None
        self.input_dtype: Any = None
        self.output_shape: tuple[int, ...] | None = None
        self.stop_training = False

    # -- strategy ---------------------------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            self._strategy = current_strategy()
        return self._strategy

    # -- building ---------------------------------------------------------------------------
    @property
    def built(self) -> bool:
        return self.state is not None

    def _create(self, rngs: nnx.Rngs) -> nnx.Module:
        """Build the NNX module (called under eval_shape and again inside the jitted init)."""
        m = self._module_or_factory
        if isinstance(m, nnx.Module):
            return m
        if callable(m):
            return m(rngs)
        raise ConfigError("Model(module) needs an nnx.Module or a callable rngs -> nnx.Module.")

    def _final_activation(self) -> str | None:
        return None  # an arbitrary module's output is used as it is

    def build(self, input_shape: Sequence[int], dtype: Any = jnp.float32) -> None:
        """Create parameters and optimizer state, sharded, for inputs of `input_shape`
        (batch excluded). fit/evaluate/predict call this from the first batch."""
        if self.built:
            return
        if self._compiled is None:
            raise ConfigError("call model.compile(optimizer=..., loss=...) before fitting.")
        self.input_shape, self.input_dtype = tuple(int(d) for d in input_shape), dtype
        strategy = self.strategy
        mesh, rules = strategy.mesh, strategy.rules

        def create() -> nnx.Module:
            with nnx.use_eager_sharding(False):
                return self._create(nnx.Rngs(params=self.seed, dropout=self.seed + 1))

        user_module = isinstance(self._module_or_factory, nnx.Module)
        if user_module:  # already built by the user: its state only needs placing
            graphdef, abs_params, abs_rest = nnx.split(self._module_or_factory, nnx.Param, ...)
        else:
            graphdef, abs_params, abs_rest = nnx.split(nnx.eval_shape(create), nnx.Param, ...)
        shardings = {
            "params": state_shardings(abs_params, rules, mesh),
            "rest": state_shardings(abs_rest, rules, mesh),
        }
        replicated = strategy.replicated()
        tx = self._compiled["tx"]

        if not user_module:
            def init():
                _, p, r = nnx.split(create(), nnx.Param, ...)
                return nnx.to_pure_dict(p), nnx.to_pure_dict(r)

            params_v, rest_v = jax.jit(
                init, out_shardings=(shardings["params"], shardings["rest"])
            )()
        else:  # a module the user built already: place its state into the shardings
            params_v = jax.device_put(nnx.to_pure_dict(abs_params), shardings["params"])
            rest_v = jax.device_put(nnx.to_pure_dict(abs_rest), shardings["rest"])

        opt_abstract = jax.eval_shape(tx.init, params_v)
        shardings["opt_state"] = _mirror_param_shardings(
            opt_abstract, shardings["params"], replicated
        )
        opt_state = jax.jit(tx.init, out_shardings=shardings["opt_state"])(params_v)
        shardings["step"] = replicated
        self.state = {
            "step": jax.device_put(jnp.zeros((), jnp.int32), replicated),
            "params": params_v,
            "opt_state": opt_state,
            "rest": rest_v,
        }
        self._state_shardings = shardings
        self._graphdef = graphdef
        out = jax.eval_shape(
            lambda p, r, x: nnx.merge(graphdef, p, r)(x),
            params_v, rest_v, jax.ShapeDtypeStruct((1, *self.input_shape), dtype),
        )
        self.output_shape = tuple(out.shape[1:])
        self._make_steps()

    def _make_steps(self) -> None:
        c = self._compiled
        loss: losses_lib.Loss = c["loss"]
        act = self._final_activation()
        fused = act if act is not None and act == loss.fuses_with else None
        self._spec = StepSpec(
            graphdef=self._graphdef,
            loss=loss,
            metrics=c["metrics"],
            tx=c["tx"],
            fused_activation=fused,
            batch_sharding=self.strategy.batch_sharding(),
        )
        unroll = not c["jit"]
        train = make_train_step(self._spec, unroll)
        evaluate = make_eval_step(self._spec, unroll)
        predict = make_predict_step(self._spec, unroll)
        if c["jit"]:
            sums_sh = self.strategy.replicated()
            train = jax.jit(
                train, donate_argnums=(0,), out_shardings=(self._state_shardings, sums_sh)
            )
            evaluate = jax.jit(evaluate, out_shardings=sums_sh)
            predict = jax.jit(predict)
        else:
            train, evaluate, predict = (_eager(f) for f in (train, evaluate, predict))
        self._steps = {"train": train, "eval": evaluate, "predict": predict}

    # -- compile ----------------------------------------------------------------------------
    def compile(
        self,
        optimizer: str | optax.GradientTransformation = "rmsprop",
        loss: str | Callable | None = None,
        metrics: Sequence[str] | None = None,
        steps_per_execution: int = 1,
        jit: bool = True,
        learning_rate: float | None = None,
    ) -> None:
        """Choose optimizer, loss and metrics. `steps_per_execution=k` runs k steps per device
        call; `jit=False` runs the same steps eagerly, for debugging."""
        if loss is None:
            raise ConfigError(
                f"compile() needs a loss; valid names: {', '.join(sorted(losses_lib.LOSSES))}, "
                "or a callable (y_true, y_pred) -> per-example losses."
            )
        if not isinstance(steps_per_execution, int) or steps_per_execution < 1:
            raise ConfigError(
                f"steps_per_execution={steps_per_execution!r} must be a positive int."
            )
        scope = _CURRENT.get()
        if scope is not None and self.built and scope is not self._strategy:
            raise ConfigError(
                "this model was built under another strategy; build and compile it inside "
                "the same strategy.scope()."
            )
        if scope is not None:
            self._strategy = scope
        loss_obj = losses_lib.get(loss)
        self._compiled = {
            "tx": optimizers_lib.get(optimizer, learning_rate),
            "loss": loss_obj,
            "metrics": metrics_lib.get(metrics, loss_obj),
            "steps_per_execution": steps_per_execution,
            "jit": bool(jit),
        }
        if self.state is not None:  # recompiling a built model: fresh optimizer state
            params = self.state["params"]
            self.state = None
            self.build(self.input_shape, self.input_dtype)
            self.state["params"] = params
        elif self.input_shape is not None:
            self.build(self.input_shape, self.input_dtype)

    @property
    def steps_per_execution(self) -> int:
        return self._compiled["steps_per_execution"] if self._compiled else 1

    # -- input checks -------------------------------------------------------------------------
    def _check_batch(self, x: Any, y: Any) -> None:
        """Raise before XLA sees a batch that does not fit the built model."""
        if not self.built:
            return
        shape = tuple(np.shape(x)[1:])
        if shape != self.input_shape:
            raise InputError(
                f"features of shape (batch, {', '.join(map(str, shape))}) do not match the "
                f"model, built for (batch, {', '.join(map(str, self.input_shape))}); reshape the "
                "data or build a new model for it."
            )
        if y is None:
            return
        loss = self._compiled["loss"]
        if loss.label_kind == "sparse":
            y = np.asarray(y)
            classes = self.output_shape[-1]
            if y.size and (not np.issubdtype(y.dtype, np.integer)
                           and not np.all(np.mod(y, 1) == 0)):
                raise InputError(
                    f"labels of dtype {y.dtype} are not class ids; "
                    f"{loss.name} needs integer labels in [0, {classes})."
                )
            if y.size and (y.min() < 0 or y.max() >= classes):
                bad = y.min() if y.min() < 0 else y.max()
                raise InputError(
                    f"label {bad} is out of range for {classes} classes; {loss.name} needs "
                    f"labels in [0, {classes}) - check the data or the size of the last layer."
                )

    def _ensure_built(self, x_sample: Any) -> None:
        if self._compiled is None:
            raise ConfigError("call model.compile(optimizer=..., loss=...) first.")
        if not self.built:
            x_sample = np.asarray(x_sample)
            self.build(x_sample.shape[1:], x_sample.dtype)

    # -- data -------------------------------------------------------------------------------
    def _global_batch(self, batch_size: int | None, remainder: str | None) -> int:
        dp = self.strategy.data_parallel_size
        batch_size = 32 if batch_size is None else batch_size
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size={batch_size!r} must be a positive int.")
        if batch_size % dp == 0:
            return batch_size
        lower, upper = (batch_size // dp) * dp, -(-batch_size // dp) * dp
        if remainder == "pad":
            return upper
        if remainder == "drop" and lower > 0:
            return lower
        if remainder not in (None, "pad", "drop"):
            raise ConfigError(f"remainder={remainder!r}; valid values: 'pad', 'drop'.")
        raise InputError(
            f"global batch_size={batch_size} is not divisible by the data-parallel size {dp}; "
            f"use batch_size={upper}" + (f" or {lower}" if lower else "") + ", or pass "
            "remainder='pad' (pad each batch with weight-0 examples to "
            f"{upper}) or remainder='drop' (batches of {lower or dp})."
        )

    def _feed(
        self,
        x: Any,
        y: Any,
        *,
        batch_size: int | None,
        sample_weight: Any = None,
        shuffle: bool,
        steps_per_epoch: int | None,
        remainder: str | None,
        with_labels: bool,
        seed: int,
        steps_per_execution: int,
        training: bool = False,
    ) -> ArrayFeed | BatchFeed:
        strategy = self.strategy
        if _is_arrays(x):
            x = jax.tree.map(np.asarray, x)
            n = len(jax.tree.leaves(x)[0])
            if y is None and with_labels:
                raise InputError("x is an array but y is missing; pass fit(x, y) with labels.")
            y = np.asarray(y) if y is not None else np.zeros((n,), np.float32)
            if len(y) != n:
                raise InputError(
                    f"x has {n} examples but y has {len(y)}; x and y must have the same length."
                )
            if sample_weight is not None and len(sample_weight) != n:
                raise InputError(
                    f"sample_weight has {len(sample_weight)} entries but x has {n} examples."
                )
            if n == 0:
                raise InputError("the dataset is empty (x has 0 examples).")
            self._ensure_built(jax.tree.leaves(x)[0][:1])
            self._check_batch(x, y if with_labels else None)
            return ArrayFeed(
                x, y, sample_weight,
                batch_size=self._global_batch(batch_size, remainder),
                steps_per_execution=steps_per_execution,
                shuffle=shuffle,
                seed=seed,
                steps_per_epoch=steps_per_epoch,
                batch_sharding=strategy.batch_sharding(leading=1),
                data_sharding=strategy.replicated(),
            )
        if y is not None:
            raise InputError(
                "y must be None when x is an iterable of batches; yield (x, y) tuples instead."
            )
        if sample_weight is not None:
            raise InputError(
                "sample_weight applies to arrays only; with a Dataset or an iterable of "
                "batches, put the weights in its elements: (x, y, sample_weight) (as Keras).")
        if batch_size is not None:
            raise InputError("batch_size does not apply to an iterable of batches; batch it.")
        staged = self._staged_dataset(x, steps_per_epoch, steps_per_execution, with_labels)
        if staged is not None:
            return staged
        iterable = x
        if isinstance(x, data_lib.Dataset):
            iterable, steps_per_epoch = dataset_input(x, steps_per_epoch, training=training)
        if not self.built and isinstance(iterable, data_lib.Dataset):
            first = iterable._peek()  # in this process, without using up an iteration
            if first is None:
                raise InputError("the dataset is empty (it produced no batches).")
            self._ensure_built((first[0] if isinstance(first, tuple | list) else first)[:1])
        elif not self.built:
            it = iter(iterable)
            first = next(it, None)
            if first is None:
                raise InputError("the dataset is empty (the iterable produced no batches).")
            if it is iterable:  # a one-shot iterator: put the batch we looked at back
                iterable = itertools.chain([first], it)
            self._ensure_built((first[0] if isinstance(first, tuple | list) else first)[:1])

        dp_local = max(self.strategy.data_parallel_size // jax.process_count(), 1)
        return BatchFeed(
            iterable,
            steps_per_execution=steps_per_execution,
            steps_per_epoch=steps_per_epoch,
            batch_sharding=strategy.batch_sharding(leading=1),
            check=self._check_batch,
            divisor=dp_local,
            with_labels=with_labels,
        )

    def _staged_dataset(self, ds: Any, steps_per_epoch: int | None, steps_per_execution: int,
                        with_labels: bool) -> StagedDatasetFeed | None:
        """`from_tensor_slices(arrays) [.shuffle .take .skip .shard .repeat] .batch [.prefetch]`
        on one process: feed it as arrays are fed (staged on the devices, row ids per step),
        in the order the Dataset defines. None for any other input."""
        if not isinstance(ds, data_lib.Dataset) or jax.process_count() > 1 or steps_per_epoch:
            return None
        from podkit.data.random_access import staged_rows

        n = ds.cardinality()
        plan = staged_rows(ds) if n > 0 else None
        if plan is None:
            return None
        tensors, batch_size, batch_rows = plan
        parts = tensors if isinstance(tensors, tuple) else (tensors,)
        if not 1 <= len(parts) <= 3 or (with_labels and len(parts) < 2):
            return None
        x = parts[0]
        y = parts[1] if len(parts) > 1 else np.zeros(len(jax.tree.leaves(x)[0]), np.float32)
        w = parts[2] if len(parts) > 2 else None
        if not _is_arrays(x) or np.asarray(y).ndim == 0:
            return None
        check_divisible(batch_size, max(self.strategy.data_parallel_size, 1))
        self._ensure_built(jax.tree.leaves(x)[0][:1])
        self._check_batch(x, y if with_labels else None)
        return StagedDatasetFeed(
            x, np.asarray(y), w, batch_rows,
            batch_size=batch_size,
            steps_per_execution=steps_per_execution,
            steps_per_epoch=n,
            batch_sharding=self.strategy.batch_sharding(leading=1),
            data_sharding=self.strategy.replicated(),
        )

    # -- fit / evaluate / predict -------------------------------------------------------------
    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: int | str = 1,
        callbacks: Sequence[Callback] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        sample_weight: Any = None,
        steps_per_epoch: int | None = None,
        remainder: str | None = None,
        log_every: int | None = None,
        seed: int | None = None,
    ) -> History:
        """Train for `epochs`; returns a History whose `.history` has per-epoch means.

        verbose: 0 silent, 1 or "auto" a progress bar (one line per epoch when stdout is not
        a terminal), 2 one line per epoch.
        """
        verbose = _verbosity(verbose)
        if x is None:
            raise InputError("fit() needs x: arrays with y, or an iterable of (x, y) batches.")
        if not isinstance(epochs, int) or epochs < 1:
            raise ConfigError(f"epochs={epochs!r} must be a positive int.")
        if not 0.0 <= validation_split < 1.0:
            raise ConfigError(f"validation_split={validation_split!r} must be in [0, 1).")
        if validation_split and _is_arrays(x):
            n = len(jax.tree.leaves(x)[0])
            cut = n - int(math.floor(n * validation_split))
            validation_data = (
                jax.tree.map(lambda a: np.asarray(a)[cut:], x), np.asarray(y)[cut:]
            )
            x, y = jax.tree.map(lambda a: np.asarray(a)[:cut], x), np.asarray(y)[:cut]
        elif validation_split:
            raise InputError("validation_split works with arrays only; pass validation_data.")
        feed = self._feed(
            x, y,
            batch_size=batch_size,
            sample_weight=sample_weight,
            shuffle=shuffle,
            steps_per_epoch=steps_per_epoch,
            remainder=remainder,
            with_labels=True,
            seed=self.seed if seed is None else seed,
            steps_per_execution=self.steps_per_execution,
            training=True,
        )
        val_fn = None
        if validation_data is not None:
            if isinstance(validation_data, tuple) and len(validation_data) == 2 and _is_arrays(
                validation_data[0]
            ):
                vx, vy = validation_data
                val_fn = lambda: self.evaluate(vx, vy, batch_size=batch_size,  # noqa: E731
                                               verbose=0, remainder=remainder)
            else:
                val_fn = lambda: self.evaluate(validation_data, verbose=0)  # noqa: E731
        history = History()
        cbs: list[Callback] = [history, *(callbacks or [])]
        if verbose:
            from podkit.monitor.progress import ProgressBar

            cbs.append(ProgressBar(epochs, getattr(feed, "steps_per_epoch", None) or 0,
                                   live=None if verbose == 1 else False))
        for cb in cbs:
            cb.model = self
        self.stop_training = False
        loop_lib.fit_loop(self, feed, epochs=epochs, callbacks=cbs, validate=val_fn,
                          log_every=log_every)
        self.history = history
        return history

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        steps: int | None = None,
        remainder: str | None = None,
    ) -> dict[str, float]:
        """Loss and metrics over the data, as a dict (`{"loss": ..., "accuracy": ...}`).

        verbose: 0 silent; 1, 2 or "auto" print one line with the results when done.
        """
        verbose = _verbosity(verbose)
        start = time.perf_counter()
        feed = self._feed(
            x, y, batch_size=batch_size, shuffle=False, steps_per_epoch=steps,
            remainder=remainder, with_labels=True, seed=0,
            steps_per_execution=self.steps_per_execution,
        )
        results = loop_lib.eval_loop(self, feed)
        if verbose:
            from podkit.monitor.progress import summary_line

            print(summary_line("evaluate", time.perf_counter() - start, results), flush=True)
        return results

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        steps: int | None = None,
        remainder: str | None = "pad",
    ) -> np.ndarray:
        """The model's outputs for every example of x, as one numpy array.

        verbose: 0 silent; 1, 2 or "auto" print one line (examples, seconds) when done.
        """
        verbose = _verbosity(verbose)
        start = time.perf_counter()
        feed = self._feed(
            x, None, batch_size=batch_size, shuffle=False, steps_per_epoch=steps,
            remainder=remainder, with_labels=False, seed=0,
            steps_per_execution=self.steps_per_execution,
        )
        out = loop_lib.predict_loop(self, feed)
        if verbose:
            from podkit.monitor.progress import summary_line

            print(summary_line("predict", time.perf_counter() - start,
                               {"examples": len(out)}), flush=True)
        return out

    # -- inspection -------------------------------------------------------------------------
    def count_params(self) -> int:
        self._require_built("count_params")
        return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(self.state["params"]))

    def _require_built(self, what: str) -> None:
        if not self.built:
            raise ConfigError(
                f"{what}() needs a built model: call model.build(input_shape) after compile(), "
                "or fit the model once."
            )

    def get_weights(self) -> dict:
        """The parameters as a nested dict of numpy arrays (gathered to this host)."""
        self._require_built("get_weights")
        return jax.tree.map(np.asarray, jax.device_get(self.state["params"]))

    def summary(self, print_fn: Callable[[str], None] = print) -> str:
        self._require_built("summary")
        rows = [("parameter", "shape", "count", "sharding")]
        flat = jax.tree_util.tree_flatten_with_path(self.state["params"])[0]
        for path, leaf in flat:
            name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
            rows.append((name, str(tuple(leaf.shape)), f"{leaf.size:,}", str(leaf.sharding.spec)))
        text = _table(rows) + (
            f"\nTotal params: {self.count_params():,}\nStrategy: {self.strategy!r}"
        )
        print_fn(text)
        return text


class Sequential(Model):
    """`Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")])`."""

    def __init__(
        self,
        layers: Sequence[Layer] | None = None,
        input_shape: Sequence[int] | None = None,
        seed: int = 0,
        name: str = "sequential",
    ) -> None:
        super().__init__(None, seed=seed)
        layers = list(layers or [])
        for layer in layers:
            if not isinstance(layer, Layer):
                raise ConfigError(
                    f"Sequential got {layer!r}; it takes podkit layers (pk.layers.Dense, ...). "
                    "Wrap other Flax NNX modules with pk.Model(module)."
                )
        if not layers:
            raise ConfigError("Sequential([]) has no layers; pass at least one layer.")
        self.layers = layers
        self.name = name
        self._layer_shapes: list[tuple[int, ...]] = []
        if input_shape is not None:
            self.input_shape = tuple(input_shape)
            self.input_dtype = jnp.int32 if layers[0].input_kind == "int" else jnp.float32

    def add(self, layer: Layer) -> None:
        if self.built:
            raise ConfigError("cannot add layers to a built model; add them before fitting.")
        self.layers.append(layer)

    def _create(self, rngs: nnx.Rngs) -> nnx.Module:
        module, self._layer_shapes = build_sequential(self.layers, self.input_shape, rngs)
        return module

    def _final_activation(self) -> str | None:
        return self.layers[-1].activation

    def summary(self, print_fn: Callable[[str], None] = print) -> str:
        self._require_built("summary")
        counts = {}
        for i, layer_params in self.state["params"].get("layers", {}).items():
            counts[i] = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(layer_params))
        rows = [("layer (type)", "output shape", "params")]
        for i, (layer, shape) in enumerate(zip(self.layers, self._layer_shapes, strict=True)):
            rows.append((f"{layer.name} ({type(layer).__name__})", str((None, *shape)),
                         f"{counts.get(i, 0):,}"))
        text = (
            f'Model: "{self.name}"\n' + _table(rows)
            + f"\nTotal params: {self.count_params():,}\nStrategy: {self.strategy!r}"
        )
        print_fn(text)
        return text


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = "-" * (sum(widths) + 3 * (len(widths) - 1))
    fmt = lambda r: "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line, fmt(rows[0]), line, *map(fmt, rows[1:]), line])


def _verbosity(verbose: Any) -> int:
    """Keras's verbose values: 0, 1, 2 or "auto" (= 1); anything else is refused."""
    if verbose == "auto":
        return 1
    if isinstance(verbose, bool) or verbose not in (0, 1, 2):
        raise ConfigError(f"verbose={verbose!r}; pass 0 (silent), 1 (progress bar), 2 (one "
                          "line per epoch) or 'auto'.")
    return int(verbose)


def _is_arrays(x: Any) -> bool:
    """Arrays (or a dict of arrays, for several inputs) as opposed to an iterable of batches."""
    if isinstance(x, np.ndarray | jax.Array):
        return True
    return isinstance(x, dict) and bool(x) and all(
        isinstance(v, np.ndarray | jax.Array) for v in x.values()
    )


def _mirror_param_shardings(opt_abstract: Any, param_shardings: dict, default: NamedSharding):
    """Optimizer state leaves that mirror a parameter (Adam's mu, nu) take its sharding."""
    by_path = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(param_shardings)[0]:
        by_path[tuple(str(k) for k in path)] = sh

    def pick(path, leaf):
        keys = tuple(str(k) for k in path)
        for start in range(len(keys)):
            sh = by_path.get(keys[start:])
            if sh is not None and len(sh.spec) <= len(leaf.shape):
                return sh
        return default

    return jax.tree_util.tree_map_with_path(pick, opt_abstract)


def _eager(fn: Callable) -> Callable:
    def run(*args):
        with jax.disable_jit():
            return fn(*args)

    return run
