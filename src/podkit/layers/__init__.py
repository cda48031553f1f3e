"""Keras-style layers on Flax NNX (see podkit.layers.base for what a layer is).

Every podkit layer class registers itself by name (`base.CLASSES`): what a saved config
names, and what `deserialize` builds."""

from __future__ import annotations

from podkit.layers.activations import ELU, LeakyReLU, PReLU, ReLU
from podkit.layers.attention import MultiHeadAttention
from podkit.layers.augmentation import (
    RandomBrightness,
    RandomContrast,
    RandomCrop,
    RandomFlip,
    RandomRotation,
    RandomTranslation,
    RandomZoom,
)
from podkit.layers.base import (
    ACTIVATIONS,
    CLASSES,
    Item,
    Layer,
    Shape,
    activation_name,
    deserialize,
    serialize,
)
from podkit.layers.conv import Conv1D, Conv2D, Conv2DTranspose, DepthwiseConv2D, SeparableConv2D
from podkit.layers.core import (
    Activation,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    Lambda,
    Masking,
    Rescaling,
    Reshape,
    Softmax,
)
from podkit.layers.image import CenterCrop, Resizing
from podkit.layers.lookup import lookup
from podkit.layers.merge import (
    Add,
    Average,
    Concatenate,
    Dot,
    Maximum,
    Minimum,
    Multiply,
    Subtract,
)
from podkit.layers.noise import GaussianNoise, SpatialDropout1D, SpatialDropout2D
from podkit.layers.normalization import (
    BatchNormalization,
    GroupNormalization,
    LayerNormalization,
)
from podkit.layers.pooling import (
    AveragePooling1D,
    AveragePooling2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    MaxPooling1D,
    MaxPooling2D,
)
from podkit.layers.preprocessing import CategoryEncoding, Normalization
from podkit.layers.recurrent import GRU, LSTM, Bidirectional, SimpleRNN
from podkit.layers.reshaping import Cropping2D, Permute, RepeatVector, UpSampling2D, ZeroPadding2D
from podkit.layers.stack import SequentialModule, build_sequential, run_layer
from podkit.layers.symbolic import Input  # keras.layers.Input, as keras.Input
from podkit.layers.text import TextVectorization
from podkit.layers.wrappers import TimeDistributed

__all__ = [
    "ACTIVATIONS", "CLASSES", "ELU", "GRU", "LSTM", "Activation", "Add", "Average",
    "AveragePooling1D", "AveragePooling2D", "BatchNormalization", "Bidirectional",
    "CategoryEncoding", "CenterCrop", "Concatenate", "Conv1D", "Conv2D", "Conv2DTranspose",
    "Cropping2D", "Dense", "DepthwiseConv2D", "Dot", "Dropout", "Embedding", "Flatten",
    "GaussianNoise", "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalMaxPooling1D",
    "GlobalMaxPooling2D", "GroupNormalization", "Input", "Item", "Lambda", "Layer",
    "LayerNormalization", "LeakyReLU", "Masking", "MaxPooling1D", "MaxPooling2D", "Maximum",
    "Minimum", "MultiHeadAttention", "Multiply", "Normalization", "PReLU", "Permute",
    "RandomBrightness", "RandomContrast", "RandomCrop", "RandomFlip", "RandomRotation",
    "RandomTranslation", "RandomZoom", "ReLU", "RepeatVector", "Rescaling", "Reshape",
    "Resizing", "SeparableConv2D", "SequentialModule", "Shape", "SimpleRNN", "Softmax",
    "SpatialDropout1D", "SpatialDropout2D", "Subtract", "TextVectorization", "TimeDistributed",
    "UpSampling2D", "ZeroPadding2D", "activation_name", "build_sequential", "deserialize",
    "lookup", "run_layer", "serialize",
]
