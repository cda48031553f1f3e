"""Where elements come from: random-access sources and generators."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from podkit.data import sources, structure
from podkit.data.constants import UNKNOWN_CARDINALITY
from podkit.data.ops.base import Node
from podkit.data.stream import Context, FilesStream, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Source(Node):
    """from_tensor_slices, range, from_sequence, TextLineDataset, ArrayRecordDataset: any
    __len__/__getitem__ source; `kind` is the verb that made it."""

    kind: str
    source: Any
    keeps_random_access = True

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.kind

    def describe_args(self) -> dict[str, Any]:
        return {"source": self.source}

    def cardinality(self) -> int:
        return len(self.source)

    def varies(self) -> bool:
        return False

    def in_memory_tensors(self) -> Any:
        """The arrays of from_tensor_slices (None for any other source)."""
        return self.source.tensors if isinstance(self.source, sources.Slices) else None

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        if isinstance(self.source, sources.Slices | sources.Range):
            return random_access.ArraySource(self.source)
        return random_access.Source(self.source)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Generator(Node):
    """from_generator: elements of fn(*args), called anew for each iteration."""

    fn: Callable[..., Any]
    args: tuple = ()
    signature: Any = None
    name = "generator"

    def describe_args(self) -> dict[str, Any]:
        return {"fn": self.fn, "args": self.args, "signature": self.signature}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return GeneratorStream(self.fn, self.args)


class GeneratorStream(Stream):
    """Resuming replays the generator up to the saved position."""

    def __init__(self, fn: Any, args: tuple) -> None:
        self._fn, self._args, self._gen, self._count = fn, args, None, 0

    def next(self) -> Any:
        if self._gen is None:
            self._gen = iter(self._fn(*self._args))
            for _ in range(self._count):  # replay to the restored position
                next(self._gen)
        item = next(self._gen)
        self._count += 1
        return structure.as_numpy(item)

    def get_state(self) -> dict:
        return {"count": self._count}

    def set_state(self, state: dict) -> None:
        self._gen, self._count = None, int(state["count"])


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CompressedText(Node):
    """TextLineDataset of GZIP or ZLIB files: a compressed file has no line offsets to seek
    to, so its lines are read in order, file after file (a stream, no random access)."""

    files: tuple[str, ...]
    compression: str
    buffer_size: int | None = None
    name = "text"

    def describe_args(self) -> dict[str, Any]:
        return {"files": list(self.files), "compression": self.compression}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY  # as tf.data's TextLineDataset: known only once read

    def varies(self) -> bool:
        return False

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return CompressedTextStream(self.files, self.compression, self.buffer_size)


class CompressedTextStream(FilesStream):
    """The lines of compressed files; the state is (file, lines read of it)."""

    key = "line"

    def __init__(self, files: tuple[str, ...], compression: str, buffer_size: int | None,
                 ) -> None:
        super().__init__(files)
        self._compression, self._buffer = compression, buffer_size

    def open(self, path: str, skip: int) -> Iterator[bytes]:
        lines = sources.compressed_lines(path, self._compression, self._buffer)
        for _ in range(skip):  # replay to the restored position
            next(lines)
        return lines
