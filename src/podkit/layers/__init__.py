"""Keras-style layers on Flax NNX (see podkit.layers.base for what a layer is)."""

from __future__ import annotations

from podkit import serialization
from podkit.layers.attention import MultiHeadAttention
from podkit.layers.base import ACTIVATIONS, Layer, Shape, activation_name
from podkit.layers.conv import Conv2D, MaxPooling2D
from podkit.layers.core import (
    Activation,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    Rescaling,
    Reshape,
    Softmax,
)
from podkit.layers.lookup import lookup
from podkit.layers.merge import Add, Concatenate
from podkit.layers.normalization import BatchNormalization, LayerNormalization
from podkit.layers.stack import SequentialModule, build_sequential, run_layer
from podkit.layers.symbolic import Input  # keras.layers.Input, as keras.Input

__all__ = [
    "ACTIVATIONS", "Activation", "Add", "BatchNormalization", "Concatenate", "Conv2D", "Dense",
    "Dropout", "Embedding", "Flatten", "Input", "Layer", "LayerNormalization", "MaxPooling2D",
    "MultiHeadAttention", "Rescaling", "Reshape", "SequentialModule", "Shape", "Softmax",
    "activation_name", "build_sequential", "deserialize", "lookup", "run_layer", "serialize",
]

CLASSES: dict[str, type[Layer]] = {c.__name__: c for c in (
    Dense, Flatten, Dropout, Conv2D, MaxPooling2D, BatchNormalization, LayerNormalization,
    Embedding, Activation, Softmax, Reshape, Rescaling, Concatenate, Add, MultiHeadAttention)}


def serialize(layer: Layer) -> dict:
    return serialization.to_config(layer, CLASSES, "layer")


def deserialize(config: dict) -> Layer:
    return serialization.from_config(config, CLASSES, "layer")

