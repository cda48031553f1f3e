"""The seed model: a multilayer perceptron, Dense layers with an optional Dropout."""

from __future__ import annotations

from podkit import layers
from podkit.config import ModelConfig
from podkit.sequential import Sequential


def build_mlp(config: ModelConfig, info: dict | None = None, seed: int = 0) -> Sequential:
    """Dense layers; the output size is `model.outputs` (checked against the data's classes,
    when it has them)."""
    classes = (info or {}).get("classes")
    if classes is not None and config.output_activation == "softmax" and \
            config.outputs < classes:
        from podkit.errors import ConfigError

        raise ConfigError(f"model.outputs = {config.outputs} but the data has {classes} "
                          f"classes; set model.outputs = {classes}.")
    stack: list[layers.Layer] = []
    for units in config.hidden:
        stack.append(layers.Dense(units, activation=config.activation))
        if config.dropout:
            stack.append(layers.Dropout(config.dropout))
    stack.append(layers.Dense(config.outputs, activation=config.output_activation))
    return Sequential(stack, seed=seed, name="mlp")
