"""Example models, built by name from a config (`[model] name = "mlp"`)."""

from podkit.models.mlp import build_mlp

REGISTRY = {"mlp": build_mlp}

__all__ = ["REGISTRY", "build_mlp"]
