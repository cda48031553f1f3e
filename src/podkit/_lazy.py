"""Module attributes that load on first use (PEP 562), for packages whose public names live in
submodules they should not import up front."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def attributes(module: str, table: Mapping[str, tuple[str, str | None]],
               namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """(__getattr__, __dir__) for `module`: name -> (submodule, attribute or None for the
    submodule itself), each resolved once into `namespace` (the module's globals())."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, attr = table[name]
        value = importlib.import_module(where)
        if attr is not None:
            value = getattr(value, attr)
        namespace[name] = value  # resolved once
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
