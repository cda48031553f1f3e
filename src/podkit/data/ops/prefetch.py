"""prefetch: elements computed ahead of the consumer.

Over random access it asks the reader for read-ahead (a Grain thread, or deeper worker queues;
see podkit.data.autotune) and adds no node of its own; over a stream a thread reads ahead.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from podkit.data.constants import AUTOTUNE
from podkit.data.ops.base import PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context, PrefetchStream, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain

STREAM_AUTOTUNE_BUFFER = 8  # elements a stream's read-ahead thread keeps under AUTOTUNE


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Prefetch(PassesBatches, SplitsBelow, Unary):
    buffer: int  # or AUTOTUNE
    name = "prefetch"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"buffer": self.buffer}

    def prefetch_buffer(self) -> int | None:
        return self.buffer

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        return self.parent.build(ctx, path)

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        buffer = self.buffer if self.buffer != AUTOTUNE else STREAM_AUTOTUNE_BUFFER
        return PrefetchStream(self.parent.stream(ctx, path), buffer)
