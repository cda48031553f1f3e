"""The seed model: a multilayer perceptron, Dense layers with an optional Dropout."""

from __future__ import annotations

from podkit import layers
from podkit.config import ModelConfig
from podkit.model import Sequential


def build_mlp(config: ModelConfig, seed: int = 0) -> Sequential:
    stack: list[layers.Layer] = []
    for units in config.hidden:
        stack.append(layers.Dense(units, activation=config.activation))
        if config.dropout:
            stack.append(layers.Dropout(config.dropout))
    stack.append(layers.Dense(config.outputs, activation=config.output_activation))
    return Sequential(stack, seed=seed, name="mlp")
