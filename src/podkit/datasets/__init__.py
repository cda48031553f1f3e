"""Datasets by name (`[data] name = ...` in a config); the small real ones ship inside podkit,
the others are generated or built from text every Python installation has (nothing is
downloaded)."""

from podkit.datasets.digits import load_digits
from podkit.datasets.registry import REGISTRY, Data, load

__all__ = ["REGISTRY", "Data", "load", "load_digits"]
