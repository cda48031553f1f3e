"""cache: the elements of the first complete pass, kept in memory or in a file.

Whatever its parent is, a cache has random access: the first iteration materializes the parent
(in parallel where the parent allows), later ones read by index. A file cache is written under
a temporary name and renamed, so it is whole or absent.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from typing import TYPE_CHECKING, Any

from podkit.data import sources
from podkit.data.constants import INFINITE_CARDINALITY
from podkit.data.ops.base import Node, PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context
from podkit.errors import InputError

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Cache(PassesBatches, SplitsBelow, Unary):
    filename: str = ""  # "": in memory
    name = "cache"
    materialized = True

    def describe_args(self) -> dict[str, Any]:
        return {"filename": self.filename}

    def varies(self) -> bool:
        return False  # the first pass is kept: later iterations see the same elements

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        path_ = self.filename + ".podkit_cache.array_record" if self.filename else ""
        memo = self.runtime.memo
        if "cache" not in memo:
            if path_ and os.path.exists(path_):
                memo["cache"] = sources.ArrayRecords([path_])
            else:
                elements = drain(self.parent, ctx, "cache()")
                if path_:
                    _write(path_, elements)
                    memo["cache"] = sources.ArrayRecords([path_])
                else:
                    memo["cache"] = sources.Elements(elements)
        ds = random_access.Source(memo["cache"])
        return ds.map(random_access.Unpickle()) if path_ else ds


def drain(node: Node, ctx: Context, what: str) -> list[Any]:
    """All elements of a finite node."""
    if node.cardinality() == INFINITE_CARDINALITY:
        raise InputError(f"{what} of an endless dataset would never finish; put repeat() after "
                         "cache(), or take(n) first.")
    stream = node.stream(ctx, (0,))
    out = []
    try:
        while True:
            out.append(stream.next())
    except StopIteration:
        return out
    finally:
        stream.close()


def _write(path: str, elements: list[Any]) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = ArrayRecordWriter(path + ".tmp", "group_size:1")
    try:
        for e in elements:
            writer.write(pickle.dumps(e, protocol=5))
        writer.close()
        os.replace(path + ".tmp", path)
    except BaseException:
        writer.close()
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")
        raise
