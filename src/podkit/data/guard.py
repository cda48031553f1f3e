"""The random-access side of ignore_errors: a MapDataset whose element i is the parent's, or a
`Dropped` marker when computing it raised. Here, not in ops/, because it loads Grain, which
waits for the first build; it must be a module-level class to travel to worker processes."""

from __future__ import annotations

from typing import Any

from podkit.data import random_access
from podkit.data._grain import grain


class Dropped:
    """What a guarded element is when computing it raised (pickles to and from workers)."""

    def __init__(self, message: str) -> None:
        self.message = message


class GuardedMapDataset(grain.MapDataset):
    def __init__(self, parent: grain.MapDataset) -> None:
        super().__init__(parent)

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        try:
            return self._parent[index]
        except Exception as e:  # any failure drops this element only
            return Dropped(f"{type(e).__name__}: {e}")

    def _getitems(self, indices: Any) -> list:
        try:
            return random_access.read(self._parent, indices)
        except Exception:  # find the bad ones one by one
            return [self[int(i)] for i in indices]

    def __str__(self) -> str:
        return "podkit.GuardedMapDataset"
