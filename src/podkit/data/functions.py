"""User functions inside a pipeline: tf.data's calling convention, and errors that say where."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from podkit.data import structure
from podkit.errors import DataError


def call(fn: Callable, element: Any) -> Any:
    # tf.data passes a tuple element as positional arguments, anything else as one argument.
    if type(element) is tuple:
        return fn(*element)
    return fn(element)


def fn_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class UserFn:
    """Wraps a map/filter/... function: numpy outputs, and failures as DataError(index)."""

    def __init__(self, fn: Callable, verb: str, to_numpy: bool = True) -> None:
        self.fn, self.verb, self.to_numpy = fn, verb, to_numpy

    def __call__(self, index: int, element: Any) -> Any:
        try:
            out = call(self.fn, element)
        except DataError:
            raise
        except Exception as e:  # re-raised with the element's index
            raise DataError(
                f"the {self.verb} function {fn_name(self.fn)} raised {type(e).__name__}: {e} "
                f"on element {index}", index, traceback.format_exc()) from e
        if self.verb == "filter":
            return bool(out)
        if out is None:
            raise DataError(f"the {self.verb} function {fn_name(self.fn)} returned None on "
                            f"element {index}; return the new element.", index)
        return structure.as_numpy(out) if self.to_numpy else out

    def __repr__(self) -> str:
        return f"{self.verb}:{fn_name(self.fn)}"
