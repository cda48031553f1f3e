"""Sequential: a plain stack of podkit layers, as keras.Sequential."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from podkit.architectures import MODELS_FROM_CONFIG, SequentialArch
from podkit.architectures import from_config as arch_from_config
from podkit.errors import ConfigError
from podkit.layers import Layer
from podkit.layers.symbolic import Input, SymbolicTensor
from podkit.model import Model


class Sequential(Model):
    """`Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")])`.

    The input shape comes from the first batch, or up front from `input_shape=`, a
    `pk.Input(shape)` as the first entry, or `input_shape=` on the first layer (as Keras)."""

    def __init__(self, layers: Sequence[Layer] | None = None,
                 input_shape: Sequence[int] | None = None, seed: int = 0,
                 name: str = "sequential") -> None:
        layers = list(layers or [])
        if layers and isinstance(layers[0], SymbolicTensor):
            if input_shape is not None:
                raise ConfigError("pass input_shape= or a pk.Input first, not both.")
            input_shape, layers = layers[0].shape[1:], layers[1:]
        layers = [_check_layer(layer) for layer in layers]
        self._arch = SequentialArch(layers, input_shape)
        self._kind = "Sequential"
        self._setup(seed, name)
        self._symbolic: tuple[SymbolicTensor, Any] | None = None
        for layer in layers:
            self._trace(layer)
        self._attach_layers()

    @classmethod
    def from_config(cls, config: dict) -> Sequential:
        """A new (uncompiled) Sequential from what `get_config()` returned (as Keras), or
        `{"class_name", "config"}` as save() writes it; Keras's own Sequential config
        (`keras_model.get_config()`) too (podkit.interop)."""
        from podkit import interop

        if interop.is_keras_config(config):
            body = config.get("config", config) if "class_name" in config else config
            if "input_layers" in body:
                raise ConfigError("Sequential.from_config got a Keras functional model's "
                                  "config; call pk.Model.from_config(config), as in Keras.")
            return interop.model_from_keras_config(
                config if "class_name" in config else {"class_name": "Sequential",
                                                       "config": config})
        if "class_name" not in config:  # get_config()'s own dict
            config = {"class_name": "Sequential", "config": config}
        body = config.get("config") or {}
        kind, arguments = arch_from_config(config.get("class_name"), body)
        if kind != "Sequential":
            raise ConfigError(f"Sequential.from_config got a {kind} model's config; call "
                              "pk.Model.from_config(config), or pk.models.load_model(path).")
        return cls(*arguments, name=body.get("name", "sequential"))

    @property
    def layers(self) -> list[Layer]:
        return self._arch.layers

    def pop(self) -> Layer:
        """Remove and return the last layer (Keras's), before the model is built."""
        if self.built:
            raise ConfigError("cannot pop layers from a built model; build a new Sequential "
                              "from model.layers[:-1] instead.")
        if not self._arch.layers:
            raise ConfigError("this Sequential has no layers to pop.")
        return self._arch.layers.pop()

    def add(self, layer: Layer) -> None:
        if self.built:
            raise ConfigError("cannot add layers to a built model; add them before fitting.")
        if isinstance(layer, SymbolicTensor) and not self._arch.layers:
            self._arch.input_shape = layer.shape[1:]  # model.add(pk.Input(shape)), as Keras
            return
        layer = _check_layer(layer)
        self._trace(layer)  # a misfit fails here, the model as it was
        self._arch.layers.append(layer)
        self._attach_layers()

    def _trace(self, layer: Layer) -> None:
        """With a declared input shape, `layer` called on the model's symbolic tensors now,
        as Keras builds a Sequential that starts with an Input: a misfit (a Lambda that
        drops the batch, a kernel wider than its input) fails at the line that made the
        model, and `model.input`, `layer.output` exist (feature extractors)."""
        if self._symbolic is None:
            shape = self._arch.declared_shape()
            if shape is None and not self._arch.layers:  # add(Dense(4, input_shape=...))
                shape = layer.input_shape
            if shape is None:
                return
            kind = "int32" if layer.input_kind == "int" else "float32"
            start = Input(tuple(shape), dtype=kind, name=f"{self.name}_input")
            self._symbolic = (start, start)
        if layer.inputs == "many":
            raise ConfigError(f"layer {layer.name!r} ({type(layer).__name__}) takes several "
                              "tensors, so it cannot be a layer of a Sequential, which passes "
                              "one from layer to layer: use the functional API (pk.Input ... "
                              "pk.Model).")
        out = layer.symbolic_call(self._symbolic[1])
        if isinstance(out, list):
            raise ConfigError(f"layer {layer.name!r} ({type(layer).__name__}) gives {len(out)} "
                              "outputs, and a Sequential passes one from layer to layer: use "
                              "the functional API (pk.Input ... pk.Model).")
        self._symbolic = (self._symbolic[0], out)

    def _symbolic_io(self) -> tuple[Any, Any] | None:
        return self._symbolic


def _check_layer(layer: Any) -> Layer:
    """A layer of the list: a podkit layer, or a podkit model (nested, as Keras's)."""
    if isinstance(layer, Model) and layer.kind in ("Sequential", "Functional"):
        return layer.as_layer()
    if not isinstance(layer, Layer):
        hint = ("a pk.Input goes first only" if isinstance(layer, SymbolicTensor) else
                f"a {layer.kind} model cannot be a layer of a Sequential (a Sequential or "
                "functional model can)" if isinstance(layer, Model) else
                "wrap other Flax NNX modules with pk.Model(module)")
        raise ConfigError(f"Sequential got {layer!r}; it takes podkit layers (pk.layers.Dense, "
                          f"...); {hint}.")
    if getattr(layer, "host_only", None):  # TextVectorization: strings never enter XLA
        raise ConfigError(f"Sequential got {layer!r}: {layer.host_only}")
    return layer


MODELS_FROM_CONFIG["Sequential"] = Sequential.from_config
