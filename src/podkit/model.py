"""Model: a Keras model as a facade over its architecture, state and compiled programs.

The work lives elsewhere: compile / fit / evaluate / predict in podkit.trainer (Model's base,
as Keras's Trainer), the network in podkit.architectures (Sequential layers, functional graph,
or any NNX module), compile()'s arguments in podkit.train.compile, the typed state in
podkit.train.state, the jitted programs in podkit.train.program (steps in train.step), the
input in podkit.train.feeds, the loops and their hooks in podkit.train.loop / hooks /
instruments / checkpointing, the callbacks in podkit.callbacks; Sequential in
podkit.sequential. A model holds its state in a StateCell that the loop updates, so callbacks
see and change it through `model.state`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.nnx as nnx
import jax
import numpy as np
import optax

from podkit import agree, serialization
from podkit import metrics as metrics_lib
from podkit import optimizers as optimizers_lib
from podkit.architectures import (
    MODELS_FROM_CONFIG,
    Architecture,
    GraphArch,
    InputSpec,
    ModelLayer,
    ModuleArch,
    SequentialArch,
    SubclassArch,
    concrete,
    param_labels,
)
from podkit.architectures import from_config as arch_from_config
from podkit.errors import ConfigError, InputError
from podkit.functional import SymbolicTensor, trace
from podkit.layers import Layer
from podkit.layers import base as layer_base
from podkit.layers.variable import Variable
from podkit.monitor import summary as summary_lib
from podkit.strategy import Strategy, current_strategy, scoped_strategy
from podkit.train import auto_steps, sparse
from podkit.train import compile as compile_lib
from podkit.train import feeds as feed_lib
from podkit.train import program as program_lib
from podkit.train import state as state_lib
from podkit.train.hooks import History
from podkit.train.recompiles import Recompiles
from podkit.train.step import GRAD_NORM_PARAMS, OutputSpec, StepSpec
from podkit.trainer import Trainer


class Model(Trainer):
    """Keras's Model.

        pk.Model(inputs, outputs)                      the functional API (pk.Input ...)
        pk.Model(lambda rngs: MyNNXModule(..., rngs=rngs))   any Flax NNX module, built
                                                       inside jit, already sharded
        pk.Model(module)                               a module you built (state is placed
                                                       into the strategy's shardings)
    """

    def __init__(self, inputs: Any = None, outputs: Any = None, *, seed: int = 0,
                 name: str | None = None, trainable: bool = True, dtype: Any = None) -> None:
        # trainable and dtype are Keras's Layer arguments: a subclass's
        # `super().__init__(**kwargs)` gets them from Keras's get_config() pattern
        # ({**super().get_config(), ...}), as a .keras file holds it
        layer_base.check_float32(f"{type(self).__name__}(dtype=...)", dtype)
        layer_base.flag(type(self).__name__, "trainable", trainable)
        if isinstance(inputs, SymbolicTensor) or (
                isinstance(inputs, list | tuple | dict) and outputs is not None):
            self._arch: Architecture = GraphArch(trace(inputs, outputs))
            self._kind = "Functional"
        elif outputs is not None:
            raise ConfigError("Model(inputs, outputs) takes pk.Input tensors as inputs.")
        elif inputs is None and type(self).call is not Model.call:
            self._arch = SubclassArch(self)  # Keras subclassing: layers and call()
            self._kind = "Subclass"
        elif inputs is None:
            raise ConfigError(
                "pk.Model() needs a network: subclass it (create layers in __init__ after "
                "super().__init__(), compute the outputs in call(self, inputs, "
                "training=False)), pass pk.Input tensors (Model(inputs, outputs)), or a Flax "
                "nnx.Module or factory rngs -> nnx.Module.")
        else:
            self._arch = ModuleArch(inputs)
            self._kind = "Module"
        default = "model" if type(self) is Model else serialization.snake_case(
            type(self).__name__)
        self._setup(seed, name or default)
        if self._kind == "Functional":
            self._io = (inputs, outputs)
            self._attach_layers()
        if not trainable:
            if self._kind == "Module":
                raise ConfigError("pk.Model(module, trainable=False): trainable applies to "
                                  "models of podkit layers; an NNX module's parameters are "
                                  "all trained.")
            # Keras freezes the whole model, a subclass's layers too, which __init__ makes
            # after this: applied once they exist (_apply_trainable_argument)
            self._freeze_pending = True

    def call(self, inputs: Any, training: bool = False) -> Any:
        """A subclass's forward pass (Keras subclassing): call the layers created in
        __init__ on `inputs`. The base class has none."""
        raise NotImplementedError(f"{type(self).__name__}.call(inputs, training=False) is not "
                                  "defined; a pk.Model subclass computes its outputs there.")

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not found: a subclass whose __init__ never called
        # super().__init__() lacks everything _setup makes; say so, as Keras does.
        if not name.startswith("__") and "_cell" not in self.__dict__:
            raise ConfigError(f"{type(self).__name__} has no {name!r} because its __init__ "
                              "did not call super().__init__(): call it first, before "
                              "creating layers (as in Keras).")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _setup(self, seed: int, name: str) -> None:
        self.seed, self.name = seed, name
        self._strategy: Strategy | None = scoped_strategy()
        self._compiled: compile_lib.CompileConfig | None = None
        self._outputs: tuple[OutputSpec, ...] = ()
        self._cell = state_lib.StateCell()
        self._layout: state_lib.StateLayout | None = None
        self._program: program_lib.Program | None = None
        self._input_spec: InputSpec | None = None
        self._output_shapes: tuple[tuple[int, ...], ...] = ()
        self._outputs_checked = False
        self._frozen: tuple[bool, ...] = ()  # _leaf_layers' trainable=False, as built
        # (layer, trainable) at compile(): what the optimizer and modules are made with
        self._compiled_trainable: list[tuple[Layer, bool]] = []
        self._trainable_warned: tuple[str, ...] = ()
        self._staging = feed_lib.StagingCache()
        # steps_per_execution="auto": the latest fit()'s choice, precompile()'s (which fits
        # then keep), and the lines already logged (podkit.train.auto_steps)
        self._auto_steps: auto_steps.Choice | None = None
        self._auto_pinned: auto_steps.Choice | None = None
        self._auto_said: set[str] = set()
        self.recompiles = Recompiles()  # every trace of its steps, and why (compile())
        self._as_layer: ModelLayer | None = None
        self._shape_cache: dict = {}  # output shapes by other input shapes (Trainer)
        self._layer_stores: dict[Any, _LayerStore] = {}  # each layer's view of the state
        self.stop_training = False
        self.history: History | None = None
        self._freeze_pending = False  # Model(trainable=False) before the layers existed
        # What the base class keeps, never a subclass's layers (podkit.layers.subclass).
        self._base_attributes = frozenset(self.__dict__) | {"_base_attributes", "_io",
                                                            "_symbolic"}

    def _after_training(self) -> None:
        """What this model trained reaches the other models that share its layers."""
        self._share_weights()

    def _share_weights(self) -> None:
        """Keras's shared layers and nested models are the same variables in every model;
        here each built model holds its own copy, so after this one changes them (fit,
        set_weights, load_weights) they are written into the others: after
        `autoencoder.fit`, `encoder.predict` uses the trained weights, and after fine-tuning,
        `base.predict` and `base.get_weights()` are the fine-tuned ones."""
        if not self.built or not self._arch.layer_items():
            return
        for store in self._stores():
            arrays = [a for a, _ in store.read()]
            if isinstance(store.layer, ModelLayer) and store.layer.model.built:
                store.layer.model.set_weights(arrays)  # the nested model itself
            store.layer.share(arrays, store)
        if self._as_layer is not None:  # the models this one is nested in
            self._as_layer.share(self._weight_arrays())

    def _symbolic_io(self) -> tuple[Any, Any] | None:
        """(inputs, outputs) as pk.Input tensors: a functional model's own, None when the
        model has none (Sequential overrides)."""
        return self.__dict__.get("_io")

    def _io_part(self, which: int, what: str) -> Any:
        io = self._symbolic_io()
        if io is None:
            raise ConfigError(f"model.{what} exists for functional models and Sequentials "
                              "that declare their input (pk.Input first, or input_shape=); "
                              f"this {self.kind} model has none.")
        return io[which]

    @property
    def inputs(self) -> list[SymbolicTensor]:
        """The model's input tensors (Keras's `model.inputs`)."""
        return _tensor_list(self._io_part(0, "inputs"))

    @property
    def outputs(self) -> list[SymbolicTensor]:
        """The model's output tensors (Keras's `model.outputs`)."""
        return _tensor_list(self._io_part(1, "outputs"))

    @property
    def input(self) -> Any:
        """The input tensor (a list for several), as Keras's `model.input`."""
        return self._io_part(0, "input")

    @property
    def output(self) -> Any:
        """The output tensor (a list for several), as Keras's `model.output`."""
        return self._io_part(1, "output")

    def _store(self, key: Any, layer: Layer) -> _LayerStore:
        # One store per layer, kept as long as the model: the layer holds them weakly.
        store = self._layer_stores.get(key)
        if store is None or store.layer is not layer:
            store = self._layer_stores[key] = _LayerStore(self, key, layer, self._require_built)
        return store

    def _attach_layers(self) -> None:
        """Point each layer's weights (layer.weights, get_weights) at this model's state, so
        that a layer of a model whose input is declared has weights before any fit (the
        model builds when they are read). Building attaches them again. A layer whose
        weights live in a built model stays pointed there until this one builds (and copies
        them): a trained layer called on a new pk.Input keeps its trained weights."""
        for key, layer in self._arch.layer_items():
            source = layer.weight_source()
            if source is None or not source.holds():
                layer.attach(self._store(key, layer))

    @property
    def trace_count(self) -> dict[str, int]:
        """Traces (compilations) of each step so far: {"train": n, "evaluate": n,
        "predict": n}; `model.recompiles.events` says why each after the first happened."""
        return self.recompiles.counts

    # -- strategy and state -------------------------------------------------------------------
    @property
    def strategy(self) -> Strategy:
        if self._strategy is None:
            self._strategy = current_strategy()
        return self._strategy

    @property
    def state(self) -> state_lib.TrainState | None:
        """The TrainState (step, params, opt_state, rest, rng); replaceable, also by a
        callback during fit()."""
        self._cell.value = state_lib.resolved(self._cell.value)  # maybe still initializing
        return self._cell.value

    @property
    def steps_trained(self) -> int:
        """Optimizer steps the state has taken: 0 for a model not built yet or a state still
        being initialized (without waiting for it); a device fetch otherwise."""
        value = self._cell.value
        return 0 if value is None else state_lib.step_of(value)

    @state.setter
    def state(self, value: state_lib.TrainState) -> None:
        if not isinstance(value, state_lib.TrainState):
            raise ConfigError(f"model.state must be a TrainState, not {type(value).__name__}.")
        self._cell.value = value

    @property
    def layout(self) -> state_lib.StateLayout:
        """Where every leaf of the state lives: shardings and abstract values."""
        self._require_built("layout")
        return self._layout

    @property
    def built(self) -> bool:
        return self._cell.value is not None

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    @property
    def optimizer(self) -> optimizers_lib.Optimizer:
        if self._compiled is None:
            raise ConfigError("the model has no optimizer yet: call model.compile(...) first.")
        return self._compiled.optimizer

    @property
    def compiled_metrics(self) -> dict[str, metrics_lib.Metric]:
        """Every logged value by its history key ("loss", "accuracy", "out_loss", ...)."""
        if self._program is not None:
            return self._program.spec.entries()
        return {}

    @property
    def metrics_names(self) -> list[str]:
        return list(self.compiled_metrics)

    @property
    def kind(self) -> str:
        """"Sequential", "Functional" (pk.Input ... pk.Model) or "Module" (an NNX module)."""
        return self._kind

    @property
    def input_spec(self) -> InputSpec | None:
        """Names, shapes (batch excluded) and dtypes of the inputs, once built."""
        return self._input_spec

    @property
    def input_shape(self) -> Any:
        if self._input_spec is None:
            return None
        shapes = [(None, *s) for s in self._input_spec.shapes]
        return shapes[0] if len(shapes) == 1 else shapes

    @property
    def output_shape(self) -> Any:
        if not self._output_shapes:
            return None
        shapes = [(None, *s) for s in self._output_shapes]
        return shapes[0] if len(shapes) == 1 else shapes

    # -- building -----------------------------------------------------------------------------
    def _create_fn(self) -> Callable[[], nnx.Module]:
        spec, arch, seed = self._input_spec, self._arch, self.seed

        def create() -> nnx.Module:
            with nnx.use_eager_sharding(False):
                return arch.create(spec, nnx.Rngs(params=seed, dropout=seed + 1))

        return create

    def build(self, input_shape: Sequence[int] | dict[str, Sequence[int]] | None = None,
              dtype: Any = None) -> None:
        """Create the state, sharded, for inputs of `input_shape` (batch excluded; a leading
        None, as Keras writes it, is dropped; a dict of them for named inputs).
        fit/evaluate/predict build from the first batch when this was not called."""
        if self.built:
            return
        sample = None
        if isinstance(input_shape, dict):  # a model of several named inputs (an NNX module's)
            dtype = np.float32 if dtype is None else dtype
            sample = {}
            for name, shape in input_shape.items():
                shape = tuple(shape)
                if not all(isinstance(d, int) and d > 0 for d in shape):
                    raise ConfigError(f"build(input_shape={input_shape!r}): input {name!r} "
                                      "needs positive ints, the batch dim excluded.")
                sample[name] = np.zeros((1, *shape), dtype)
            self._build_from(sample)
            return
        if input_shape is not None:
            shape = tuple(input_shape)
            if shape and shape[0] is None:
                shape = shape[1:]
            if not all(isinstance(d, int) and d > 0 for d in shape):
                raise ConfigError(f"build(input_shape={input_shape!r}): positive ints, the "
                                  "batch dim excluded (or given as None).")
            if dtype is None:  # a model that starts with an Embedding takes integer ids
                first = self._arch.layer_list()[:1]
                dtype = np.int32 if first and first[0].input_kind == "int" else np.float32
            sample = np.zeros((1, *shape), dtype)
        self._build_from(sample)

    def build_for(self, spec: InputSpec,
                  initial_state: Callable[[state_lib.StateLayout], state_lib.TrainState] | None
                  = None) -> None:
        """Build for inputs described by `spec` (what a saved model records). With
        `initial_state`, the state comes from it (a checkpoint read into the layout) instead of
        a fresh initialization."""
        if self.built:
            return
        sample = [np.zeros((1, *concrete(s)), d)
                  for s, d in zip(spec.shapes, spec.dtypes, strict=True)]
        self._build_from(sample[0] if len(sample) == 1 else dict(zip(spec.names, sample,
                                                                       strict=True)),
                         initial_state)

    @classmethod
    def from_config(cls, config: dict) -> Model:
        """A new (uncompiled) functional model from what `get_config()` returned (as Keras),
        or `{"class_name", "config"}` as save() writes it; a Sequential's config goes to
        pk.Sequential.from_config, as in Keras. A subclass: `cls(**config)` of what its
        get_config() returned, as Keras's default. Keras's own functional config
        (`keras_model.get_config()`, with `input_layers`) is read too (podkit.interop)."""
        if cls.call is not Model.call:
            return cls(**config)
        from podkit import interop

        body = config.get("config", config) if "class_name" in config else config
        if isinstance(body, dict) and "input_layers" in body:  # Keras's functional config
            return interop.model_from_keras_config(config)
        if "class_name" not in config:  # get_config()'s own dict
            if "layers" in config and "inputs" not in config:  # a Sequential's
                raise ConfigError("Model.from_config got a Sequential model's config; call "
                                  "pk.Sequential.from_config(config), as in Keras.")
            config = {"class_name": "Functional", "config": config}
        body = config.get("config") or {}
        kind, arguments = arch_from_config(config.get("class_name"), body)
        if kind != "Functional":
            raise ConfigError(f"Model.from_config got a {kind} model's config; call "
                              f"pk.{kind}.from_config(config), or pk.models.load_model(path).")
        return cls(*arguments, name=body.get("name", "model"))

    def _labels_of(self, params: Any, module: Any = None) -> Any:
        """"train" / "frozen" per parameter, or None when every one trains: frozen layers'
        (trainable=False), or what an NNX module says of its own (`param_labels(params)`,
        e.g. the Llama's with LoRA: only the adapters train)."""
        if any(not layer.trainable for layer in self._arch.layer_list()):
            return param_labels(params, self._arch.layer_items())
        own = getattr(module, "param_labels", None)
        return own(params) if callable(own) else None

    def _transform(self, params: Any, labels: Any = None) -> optax.GradientTransformation:
        """The optimizer's transformation for `params` (a pure dict, abstract or real);
        frozen parameters (`labels`, _labels_of) get no update at all (no moments either),
        as Keras leaves non-trainable weights out of the optimizer. An uncompiled model
        (inference only) has none."""
        if self._compiled is None:
            return optax.identity()
        tx = self._compiled.optimizer.transform()
        if labels is not None:
            tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
        return tx

    def _build_from(self, x_sample: Any,
                    initial_state: Callable[[state_lib.StateLayout], state_lib.TrainState]
                    | None = None) -> None:
        self._input_spec = self._arch.input_spec(x_sample)
        # Where each layer's weights live now (before this build points them here): a layer
        # of another built model (a feature extractor made of a trained model's layers)
        # starts from those, as Keras's layers are the same variables in both.
        sources = {key: layer.weight_source() for key, layer in self._arch.layer_items()}
        create = self._create_fn()
        self._make_layout_and_program(create)
        if initial_state is not None:
            self.state = initial_state(self._layout)
        elif self._arch.built_module is not None:
            self.state = state_lib.place_module(self._layout, self._arch.built_module,
                                                self._program.spec.tx)
        else:
            # Compiled on a thread: fit() compiles its train step meanwhile (PendingState).
            self._cell.value = state_lib.init_state_async(self._layout, create,
                                                          self._program.spec.tx)
        if initial_state is None:
            # A nested model that was built already (a pretrained base) lends its weights, as
            # Keras's nested model is the same variables. Copied once: later they are this
            # model's (read them through get_layer(name)).
            for key, layer in self._arch.layer_items():
                if isinstance(layer, ModelLayer) and layer.model.built:
                    self._store(key, layer).write(layer.model.get_weights())
                    continue
                source = sources.get(key)
                if source is not None and source.model is not self and source.holds():
                    mine, theirs = self._store(key, layer), [a for a, _ in source.read()]
                    if [a.shape for a, _ in mine.read()] == [a.shape for a in theirs]:
                        mine.write([agree.gather(a) for a in theirs])
            # This model nested in another that was built first (an encoder inside an
            # autoencoder that trained): it is the same variables, so it starts from those.
            held = self._as_layer.holders() if self._as_layer is not None else []
            if held and [tuple(a.shape) for a, _ in held[0].read()] == \
                    [tuple(a.shape) for a in self._weight_arrays()]:
                self.set_weights([agree.gather(a) for a, _ in held[0].read()])

    def _apply_trainable_argument(self) -> None:
        """`Model(trainable=False)` (a subclass's `super().__init__(trainable=False)`, as a
        .keras file of a frozen model gives it): its layers frozen once they exist."""
        if self._freeze_pending and self._arch.layer_list():
            self._freeze_pending = False
            for layer in self._arch.layer_list():
                layer.trainable = False

    def _leaf_layers(self) -> list[Layer]:
        """Every layer, a nested model's own layers instead of the model (whose trainable
        is theirs)."""
        self._apply_trainable_argument()
        found, todo = [], list(self._arch.layer_list())
        while todo:
            layer = todo.pop(0)
            if isinstance(layer, ModelLayer):
                todo.extend(layer.model.layers)
            else:
                found.append(layer)
        return found

    @contextlib.contextmanager
    def _trainable_as_compiled(self) -> Iterator[None]:
        """The layers' trainable flags as they were at compile() while the model makes its
        module and optimizer: Keras's rule (trainable takes effect at compile), which the GAN
        recipe relies on (a discriminator compiled trainable, then frozen for the combined
        model compiled after it). Uncompiled, the flags as they are."""
        now = [(layer, layer.trainable) for layer, _ in self._compiled_trainable]
        for layer, flag in self._compiled_trainable:
            layer.trainable = flag
        try:
            yield
        finally:
            for layer, flag in now:
                layer.trainable = flag

    def _make_layout_and_program(self, create: Callable[[], nnx.Module]) -> None:
        self._shape_cache = {}
        with self._trainable_as_compiled():
            abstract = self._arch.built_module or nnx.eval_shape(create)
            pure = nnx.to_pure_dict(state_lib.split(abstract)[1])
            labels = self._labels_of(pure, abstract)
            tx = self._transform(pure, labels)
            self._frozen = tuple(not layer.trainable for layer in self._leaf_layers())
        strategy = self.strategy
        for key, layer in self._arch.layer_items():
            layer.attach(self._store(key, layer))
        self._layout = state_lib.make_layout(abstract, tx, strategy.rules, strategy.mesh,
                                             required=strategy.user_rules)
        if not self._outputs:  # inference before compile(): outputs without losses
            self._outputs = tuple(OutputSpec(name=n, loss=None)
                                  for n in self._arch.output_names())
        spec = StepSpec(graphdef=self._layout.graphdef, outputs=self._outputs,
                        output_names=self._arch.output_names(), tx=tx,
                        batch_sharding=strategy.batch_sharding(),
                        logits_arg=self._arch.logits_arg,
                        microbatches=self._compiled.microbatches if self._compiled else 1,
                        frozen=(None if labels is None else
                                jax.tree.map(lambda label: label == "frozen", labels)),
                        tables=sparse.table_layouts(abstract, self._layout.shardings.params),
                        grad_norm=self._grad_norm(self._layout.abstract))
        program = program_lib.build(
            spec, self._layout, strategy, tracker=self.recompiles,
            jit=self._compiled.jit if self._compiled is not None else True)
        self._output_shapes = program.output_shapes(self._layout.abstract,
                                                    self._input_spec.example())
        if len(self._output_shapes) != len(self._outputs):
            raise ConfigError(f"the model gives {len(self._output_shapes)} outputs but compile() "
                              f"described {len(self._outputs)}.")
        self._program = program

    def _grad_norm(self, abstract: Any) -> bool:
        """Whether the train step measures the gradient norm: compile(grad_norm=...), or by
        the model's size (podkit.train.step.GRAD_NORM_PARAMS)."""
        chosen = getattr(self._compiled, "grad_norm", None)
        if chosen is not None:
            return bool(chosen)
        params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract.params))
        return params >= GRAD_NORM_PARAMS

    # -- layers -------------------------------------------------------------------------------
    @property
    def architecture(self) -> Architecture:
        """How the model gets its network (podkit.architectures)."""
        return self._arch

    def as_layer(self) -> Layer:
        """This model as a layer of another (Keras's nested models); one per model."""
        if self._as_layer is None:
            self._as_layer = ModelLayer(self)
        return self._as_layer

    @property
    def layers(self) -> list[Layer]:
        """The model's podkit layers: a Sequential's in order, a functional model's in the
        graph's order, a subclass's in the order they were assigned (none for an NNX
        module)."""
        self._apply_trainable_argument()
        return self._arch.layer_list()

    def get_layer(self, name: str | None = None, index: int | None = None) -> Layer:
        """A layer by `name` or by `index` into `layers`, as Keras."""
        layers = self.layers
        if (name is None) == (index is None):
            raise ConfigError("get_layer() takes name= or index=, one of them.")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int) or \
                    not -len(layers) <= index < len(layers):
                raise ConfigError(f"get_layer(index={index!r}): the model has {len(layers)} "
                                  "layers.")
            return layers[index]
        for layer in layers:
            if layer.name == name:
                return layer
        raise ConfigError(f"no layer named {name!r}; the layers are "
                          f"{[layer.name for layer in layers]}.")

    # -- weights ------------------------------------------------------------------------------
    def _declared_input(self) -> bool:
        return isinstance(self._arch, GraphArch) or (
            isinstance(self._arch, SequentialArch) and self._arch.declared_shape() is not None)

    def _require_built(self, what: str) -> None:
        """Build now if the input shapes are declared (functional models, Sequential with an
        input shape); otherwise say how to build."""
        if not self.built and self._declared_input():
            self._build_from(None)
        if not self.built:
            raise ConfigError(
                f"{what} needs a built model: call model.build(input_shape), "
                "or fit the model once.")

    def module(self) -> nnx.Module:
        """The network as a Flax NNX module holding the current weights (a new module each
        call, sharing the state's arrays): for code that runs the network itself, e.g.
        sampling from a language model."""
        self._require_built("module()")
        s = self.state
        return state_lib.merge(self.layout.graphdef, s.params, s.rest, s.rng)

    def sharding_table(self) -> list[dict]:
        """Where every parameter and optimizer-state leaf lives: path, shape, dtype, spec and
        bytes per device (see podkit.train.state.describe_layout); `fit(run_dir=...)` writes
        it as shardings.json."""
        self._require_built("sharding_table()")
        return state_lib.describe_layout(self.layout)

    def count_params(self) -> int:
        """Every variable's size, as Keras counts (batch statistics included)."""
        self._require_built("count_params()")
        return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(
            (self.state.params, self.state.rest)))

    def _stores(self) -> list[_LayerStore]:
        """This model's view of each layer that holds weights in its state (a subclass's
        uncalled ones do not): its own, whichever model a shared layer was built in last."""
        built = self.state.params.get("layers", {}), self.state.rest.get("layers", {})
        return [self._store(key, layer) for key, layer in self._arch.layer_items()
                if key in built[0] or key in built[1]]

    @property
    def weights(self) -> list[Variable] | list[jax.Array]:
        """Every variable, layer by layer in Keras's order, as `Variable`s that read the
        state when used (a network of podkit layers); for an NNX module, the parameters,
        then the other variables, as the state's arrays (which the next train step
        replaces)."""
        self._require_built("weights")
        if self._arch.layer_items():
            return [Variable(store, i, store.layer.keras_weight_path(name), store.layer.name)
                    for store in self._stores() for i, name in enumerate(store.names())]
        return state_lib.weights(self.state)

    def _weight_arrays(self) -> list[jax.Array]:
        """`weights` as the state's arrays now (get_weights, sharing)."""
        self._require_built("weights")
        if self._arch.layer_items():
            return [w for store in self._stores() for w, _ in store.read()]
        return state_lib.weights(self.state)

    def _param_labels(self) -> list[str]:
        labels = self._labels_of(self.state.params, self.module())
        return (jax.tree.leaves(labels) if labels is not None else
                ["train"] * len(jax.tree.leaves(self.state.params)))

    @property
    def trainable_weights(self) -> list[Variable] | list[jax.Array]:
        """The parameters the optimizer updates (those of layers with trainable=True)."""
        self._require_built("trainable_weights")
        if self._arch.layer_items():
            return [v for v in self.weights if v.trainable]
        return [w for w, label in zip(jax.tree.leaves(self.state.params), self._param_labels(),
                                      strict=True) if label == "train"]

    @property
    def non_trainable_weights(self) -> list[Variable] | list[jax.Array]:
        """Frozen layers' parameters and the other variables (batch statistics)."""
        self._require_built("non_trainable_weights")
        if self._arch.layer_items():
            return [v for v in self.weights if not v.trainable]
        frozen = [w for w, label in zip(jax.tree.leaves(self.state.params),
                                        self._param_labels(), strict=True) if label != "train"]
        return [*frozen, *jax.tree.leaves(self.state.rest)]

    @property
    def trainable(self) -> bool:
        self._apply_trainable_argument()
        return not self._freeze_pending and all(
            layer.trainable for layer in self._arch.layer_list())

    @trainable.setter
    def trainable(self, value: bool) -> None:
        """Freeze (or unfreeze) every layer, as Keras's `model.trainable = False`; compile
        again to apply it."""
        layers = self._arch.layer_list()
        if not layers and self._kind != "Subclass":
            raise ConfigError("model.trainable applies to models of podkit layers; an NNX "
                              "module's parameters are all trained.")
        self._freeze_pending = not value and not layers  # a subclass's layers come later
        for layer in layers:
            layer.trainable = bool(value)

    def get_weights(self) -> list[np.ndarray]:
        """Every variable as numpy arrays (gathered to this host, writable copies, as
        Keras's), in `weights` order."""
        return [np.array(agree.gather(a)) for a in self._weight_arrays()]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set every variable from arrays in `get_weights()` order (shapes must match)."""
        self._require_built("set_weights()")
        if not self._arch.layer_items():
            self.state = state_lib.with_weights(self.state, self._layout, weights)
            return
        weights, stores = list(weights), self._stores()
        counts = [len(store.read()) for store in stores]
        if len(weights) != sum(counts):
            per = ", ".join(f"{store.layer.name}: {n}" for store, n in zip(stores, counts,
                                                                           strict=True))
            raise InputError(f"set_weights() got {len(weights)} arrays; the model has "
                              f"{sum(counts)} weights ({per}), in get_weights() order.")
        start = 0
        for store, n in zip(stores, counts, strict=True):
            store.write(weights[start:start + n])
            start += n
        self._share_weights()

    # -- saving -------------------------------------------------------------------------------
    def get_config(self) -> dict:
        """The architecture as JSON (Sequential and functional models); a subclass defines
        its own (its constructor's arguments, as Keras asks), and `super().get_config()`
        in it gives Keras's base config: name, trainable, dtype (Keras's serialized
        float32 policy)."""
        config = self._arch.config()
        if config is None and self._kind == "Subclass" and \
                type(self).get_config is not Model.get_config:
            return {"name": self.name, "trainable": self.trainable,
                    "dtype": serialization.keras_dtype_policy()}
        if config is None:
            hint = (f" {type(self).__name__} can define get_config() returning its __init__ "
                    "arguments (then from_config rebuilds it)." if self._kind == "Subclass"
                    else "")
            raise ConfigError("this model is built from Python code (an NNX module, a factory "
                              "or a subclass): its architecture has no config; build it from "
                              f"code and load weights into it.{hint}")
        return {"name": self.name, **config}

    def to_json(self, **kwargs: Any) -> str:
        """The architecture as a JSON string (Keras's): `pk.models.model_from_json` makes a
        new model from it. `kwargs` go to json.dumps (indent=2, ...)."""
        import json

        return json.dumps({"class_name": self.kind, "config": self.get_config()}, **kwargs)

    def compile_config(self) -> dict | None:
        return None if self._compiled is None else compile_lib.serialize(self._compiled,
                                                                          self._outputs)

    def save(self, path: Any) -> None:
        """A directory: model.json (architecture, compile config) and the state (Orbax); a
        path ending in `.keras` gets Keras 3's file instead (podkit.interop)."""
        from podkit import interop, saving

        self._require_built("save()")  # a declared input builds now, as for get_weights()
        if interop.suffix_format(path) is not None:  # Keras's files, by suffix as Keras
            interop.save_model(self, path)
            return
        saving.save_model(self, path)

    def export(self, filepath: Any, format: str = "tf_saved_model", **kwargs: Any) -> None:
        """Keras's `model.export()` writes a TensorFlow SavedModel, which needs TensorFlow;
        podkit has none. The way there is a Keras file: `model.save("m.keras")`, then in
        Keras `keras.saving.load_model("m.keras").export(filepath)`. (podkit's own exports,
        safetensors and npz, are `podkit export` / `podkit.runs.export`.)"""
        raise ConfigError(
            f"model.export({filepath!r}, format={format!r}): podkit writes no SavedModel "
            "(that needs TensorFlow). Save a Keras file and export it with Keras: "
            "model.save('m.keras'); then keras.saving.load_model('m.keras').export("
            f"{filepath!r}) (Keras 3 with the TensorFlow backend; docs/migrating.md).")

    def save_weights(self, path: Any) -> None:
        """podkit's directory; a path ending in `.weights.h5` gets Keras 3's weights file."""
        from podkit import interop, saving

        self._require_built("save_weights()")
        if interop.suffix_format(path) is not None:
            interop.save_weights(self, path)
            return
        saving.save_weights(self, path)

    def load_weights(self, path: Any, step: int | None = None) -> None:
        """The variables saved at `path`: a directory model.save() or save_weights() wrote,
        or a checkpoint directory (ModelCheckpoint, fit(checkpoint=)): its newest valid
        step, or `step`. Any device count. Keras's files too, by suffix: `.weights.h5`,
        `.keras`, and tf.keras's legacy `.h5` (podkit.interop)."""
        from podkit import interop, saving

        if interop.suffix_format(path) is not None:
            self._require_built("load_weights()")
            interop.load_weights(self, path)
        else:
            saving.load_weights(self, path, step)
        self._share_weights()

    # -- inspection ---------------------------------------------------------------------------
    def summary(self, line_length: int | None = None, positions: Sequence[float] | None = None,
                print_fn: Callable[[str], Any] | None = None, expand_nested: bool = False,
                show_trainable: bool = False, layer_range: Sequence[str] | None = None
                ) -> str:
        """Keras's table (layer (type), output shape, param #, and connected to for a
        functional model), the total, trainable and non-trainable counts as Keras counts
        them (batch statistics are non-trainable), and the strategy. Keras's arguments:
        `line_length` / `positions` fix the columns' ends, `print_fn` is called on each
        line, `expand_nested` lists a nested model's layers under it, `show_trainable` adds
        a Trainable column (Y / N, "-" for a layer without weights), `layer_range=(first,
        last)` prints the rows between two layers (names or regular expressions). Returns
        the text too (Keras returns None)."""
        self._require_built("summary()")
        named = self._summary_rows(expand_nested, 0)
        rows, head = None, None
        if named is not None:
            if layer_range is not None:
                start, stop = summary_lib.layer_range([n for n, _, _ in named], layer_range)
                named = named[start:stop]
            width = max((len(row) for _, row, _ in named), default=3)
            rows = [(*row, *[""] * (width - len(row)), *([mark] if show_trainable else []))
                    for _, row, mark in named]
            head = ("Layer (type)", "Output Shape", "Param #", "Connected to")[:width] + (
                ("Trainable",) if show_trainable else ())
        elif expand_nested or show_trainable or layer_range is not None:
            raise ConfigError("summary(expand_nested=, show_trainable=, layer_range=) apply "
                              "to models of podkit layers; an NNX module's summary lists its "
                              "parameters.")
        trainable = sum(int(np.prod(w.shape)) for w in self.trainable_weights)
        text = summary_lib.summary(self.name, self.state.params, rows, self.count_params(),
                                   trainable, self.strategy, head, line_length, positions)
        for line in text.splitlines():
            (print_fn or print)(line)
        return text

    def _summary_rows(self, expand_nested: bool, depth: int
                      ) -> list[tuple[str, tuple[str, ...], str]] | None:
        """(layer name, row, trainable mark) for summary(); with `expand_nested`, a nested
        model's own rows follow its row, indented. None for an NNX module."""
        items = self._arch.layer_items()
        if not items:
            return None
        counts = {store.key: sum(int(np.prod(w.shape)) for w, _ in store.read())
                  for store in self._stores()}
        rows = self._arch.summary_rows(self._input_spec, counts)
        first = len(rows) - len(items)  # a functional model's inputs come first
        out: list[tuple[str, tuple[str, ...], str]] = []
        for i, row in enumerate(rows):
            key, layer = items[i - first] if i >= first else (None, None)
            mark = ("-" if layer is None or not counts.get(key) else
                    "Y" if layer.trainable else "N")
            name = layer.name if layer is not None else row[0].split(" (")[0]
            out.append((name, (("  " * depth) + row[0], *row[1:]), mark))
            if expand_nested and isinstance(layer, ModelLayer):
                inner = layer.model
                if not inner.built:  # built now, from this model's copy of its weights
                    inner.build()
                    inner.set_weights([a for a, _ in self._store(key, layer).read()])
                # (the same class's method, on the nested model)
                out.extend(inner._summary_rows(True, depth + 1) or [])  # noqa: SLF001
        return out




def _tensor_list(value: Any) -> list[SymbolicTensor]:
    """One tensor, a list / tuple or a dict of them (as Model(inputs, outputs) took them),
    as a list."""
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list | tuple) else [value]


class _LayerStore:
    """A built layer's variables in its model's state (podkit.layers.base.WeightStore): the
    parameters and other variables under the module's `layers[key]`, in the layer's Keras
    order."""

    def __init__(self, model: Model, key: Any, layer: Layer,
                 require_built: Callable[[str], None]) -> None:
        self.model, self.key, self.layer = model, key, layer
        self.require_built = require_built  # the model's: builds it when its input is known

    def changed(self) -> None:
        """The layer's variables were set here: every other model that holds them (this
        layer shared, or this model nested in another, or nested models in this one) gets
        them too."""
        self.model._share_weights()  # noqa: SLF001 (the model's own helper, this module)

    def names(self) -> list[str]:
        return [path for _, path in self._paths()]

    def holds(self) -> bool:
        """Whether the model is built and its state holds this layer's variables."""
        if not self.model.built:
            return False
        state = self.model.state
        return any(isinstance(tree, dict) and self.key in tree.get("layers", {})
                   for tree in (state.params, state.rest))

    def _state(self) -> state_lib.TrainState:
        # A model whose inputs are declared builds now (layer.weights before any fit, as
        # Keras's layers have weights once the model knows its input); else says how.
        self.require_built(f"the weights of layer {self.layer.name!r}")
        return self.model.state

    def _paths(self) -> list[tuple[str, str]]:
        """(collection, path) of each variable, "params" or "rest", in Keras's order."""
        state = self._state()
        found = {}
        for collection, tree in (("params", state.params), ("rest", state.rest)):
            sub = tree.get("layers", {}).get(self.key) if isinstance(tree, dict) else None
            for path, _ in jax.tree_util.tree_flatten_with_path(sub or {})[0]:
                found[".".join(str(getattr(k, "key", k)) for k in path)] = collection
        order = [p for p in self.layer.weight_order if p in found]
        order += sorted(p for p in found if p not in order)
        return [(found[p], p) for p in order]

    def _leaf(self, tree: Any, path: str) -> Any:
        node = tree["layers"][self.key]
        for part in path.split("."):
            node = node[part] if part in node else node[int(part)]
        return node

    def read(self) -> list[tuple[jax.Array, bool]]:
        state = self._state()
        return [(self._leaf(getattr(state, c), p), c == "params") for c, p in self._paths()]

    def write(self, arrays: Sequence[Any]) -> None:
        paths = self._paths()
        arrays = list(arrays)
        if len(arrays) != len(paths):
            raise InputError(f"layer {self.layer.name!r} has {len(paths)} weights "
                              f"({', '.join(p for _, p in paths)}); set_weights got "
                              f"{len(arrays)}.")
        state = self._state()
        trees = {"params": jax.tree.map(lambda a: a, state.params),
                 "rest": jax.tree.map(lambda a: a, state.rest)}
        for (collection, path), new in zip(paths, arrays, strict=True):
            old = self._leaf(trees[collection], path)
            # Another model's arrays on the same devices move there; the rest via the host.
            if not (isinstance(new, jax.Array) and new.sharding == old.sharding):
                new = np.asarray(agree.gather(new) if isinstance(new, jax.Array) else new)
            if tuple(new.shape) != tuple(old.shape):
                raise InputError(f"layer {self.layer.name!r}: weight {path} has shape "
                                  f"{tuple(old.shape)}; set_weights got {tuple(new.shape)}.")
            parent, last = path.rpartition(".")[::2]
            node = trees[collection]["layers"][self.key]
            for part in parent.split(".") if parent else ():
                node = node[part] if part in node else node[int(part)]
            key = last if last in node else int(last)
            node[key] = jax.device_put(new.astype(old.dtype), old.sharding)
        self.model.state = state.replace(params=trees["params"], rest=trees["rest"])


MODELS_FROM_CONFIG["Functional"] = Model.from_config
