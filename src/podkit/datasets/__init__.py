"""Small real datasets that ship inside podkit (nothing is downloaded)."""

from podkit.datasets.digits import load_digits

__all__ = ["load_digits"]
