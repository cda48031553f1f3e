"""batch, padded_batch, unbatch and bucket_by_sequence_length: grouping elements."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data import batching, structure
from podkit.data.constants import UNKNOWN_CARDINALITY
from podkit.data.functions import call
from podkit.data.ops.base import Node, Unary
from podkit.data.ops.slicing import Shard
from podkit.data.stream import Context, OnParent, Replaying, Stream
from podkit.errors import ConfigError, InputError

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Batch(Unary):
    """batch (fn stacks) and padded_batch (fn pads): `size` consecutive elements each."""

    size: int
    drop: bool
    fn: batching.Stack | batching.Pad
    parallel: int | None = None
    deterministic: bool | None = None
    keeps_random_access = True

    @property
    def name(self) -> str:  # type: ignore[override]
        return "padded_batch" if isinstance(self.fn, batching.Pad) else "batch"

    @property
    def stacks(self) -> bool:
        """A plain batch(): equal shapes stacked, so a gather of rows can assemble it."""
        return isinstance(self.fn, batching.Stack)

    def describe_args(self) -> dict[str, Any]:
        args = {"size": self.size, "drop": self.drop, "fn": self.fn}
        if self.stacks:  # padded_batch has no parallel arguments
            args.update(parallel=self.parallel, deterministic=self.deterministic)
        return args

    def cardinality(self) -> int:
        n = self.parent.cardinality()
        if n < 0:
            return n
        return n // self.size if self.drop else -(-n // self.size)

    def batch_dim_varies(self) -> bool:
        return not self.drop

    def batch_size(self) -> int | None:
        return self.size

    def element_spec(self, first: Any) -> Any:
        """padded_batch: None for every padded dim (its size is the batch's longest), the
        size for a dim padded_shapes fixes, as tf.data. tf.data keeps a dim the input's spec
        fixes; podkit reads specs off elements, so any dim padded_shapes leaves open is None."""
        spec = super().element_spec(first)
        if self.stacks:
            return spec
        assert isinstance(self.fn, batching.Pad)
        leaf_specs = structure.leaves(spec)
        targets = (_leaf_shapes(spec, self.fn.padded_shapes)
                   if self.fn.padded_shapes is not None else [None] * len(leaf_specs))
        fixed = iter([structure.TensorSpec(
            (s.shape[0], *(None if t is None or t[d] in (None, -1) else int(t[d])
                           for d in range(len(s.shape) - 1))), s.dtype)
            for s, t in zip(leaf_specs, targets, strict=True)])
        return structure.map_structure(lambda _: next(fixed), spec)

    def parallel_calls(self) -> int | None:
        return self.parallel

    def reorders(self) -> bool:
        return self.deterministic is False

    def for_process(self, num_processes: int, index: int) -> Node:
        """Shard just below the batch, batch / processes: global batch k (the union of every
        process's batch k) holds exactly this dataset's batch k."""
        if self.size % num_processes:
            raise ConfigError(
                f"batch size {self.size} is not divisible by the {num_processes} processes; "
                f"batch to a multiple of {num_processes} (the global batch).")
        return dataclasses.replace(self, parent=Shard(self.parent, num_processes, index),
                                   size=self.size // num_processes)

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        return random_access.BatchMapDataset(self.parent.build(ctx, path), self.size,
                                             self.drop, self.fn)

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return BatchStream(self.parent.stream(ctx, path), self.size, self.drop, self.fn)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Unbatch(Unary):
    """The rows of each element."""

    name = "unbatch"

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return UnbatchStream(self.parent.stream(ctx, path))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Bucket(Unary):
    """bucket_by_sequence_length with tf.data's rules (see Dataset.bucket_by_sequence_length)."""

    length_fn: Callable[..., Any]
    bounds: list[int]
    sizes: list[int]
    padded_shapes: Any = None
    padding_values: Any = None
    to_boundary: bool = False
    no_padding: bool = False
    drop: bool = False
    name = "bucket"

    def describe_args(self) -> dict[str, Any]:
        return {"length_fn": self.length_fn, "bounds": self.bounds, "sizes": self.sizes,
                "padded_shapes": self.padded_shapes, "padding_values": self.padding_values,
                "to_boundary": self.to_boundary, "no_padding": self.no_padding,
                "drop": self.drop}

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        return BucketStream(self.parent.stream(ctx, path), self)


class BatchStream(OnParent):
    def __init__(self, parent: Stream, size: int, drop: bool, fn: Any) -> None:
        super().__init__(parent)
        self._size, self._drop, self._fn = size, drop, fn

    def next(self) -> Any:
        items = []
        try:
            while len(items) < self._size:
                items.append(self._parent.next())
        except StopIteration:
            if not items or self._drop:
                raise
        return self._fn(items)


class UnbatchStream(Stream):
    def __init__(self, parent: Stream) -> None:
        self._parent = parent
        self._batch: list | None = None
        self._pos = 0
        self._before = parent.get_state()  # the parent's state before the current batch

    def next(self) -> Any:
        while self._batch is None or self._pos >= len(self._batch):
            self._before = self._parent.get_state()
            self._batch, self._pos = _rows(self._parent.next()), 0
        item = self._batch[self._pos]
        self._pos += 1
        return item

    def get_state(self) -> dict:
        return {"before": self._before, "pos": self._pos if self._batch is not None else 0,
                "open": self._batch is not None}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["before"])
        self._before, self._batch, self._pos = state["before"], None, 0
        if state["open"]:
            self._batch, self._pos = _rows(self._parent.next()), int(state["pos"])

    def close(self) -> None:
        self._parent.close()


def _rows(batch: Any) -> list:
    flat = structure.leaves(batch)
    sizes = {len(np.asarray(x)) if np.ndim(x) else None for x in flat}
    if None in sizes or len(sizes) != 1:
        raise InputError(f"unbatch needs leaves with one common leading dim, got shapes "
                         f"{structure.describe(batch)}.")
    n = sizes.pop()
    return [structure.map_structure(lambda a, i=i: a[i], batch) for i in range(n)]


class BucketStream(Replaying):
    """bucket_by_sequence_length with tf.data's rules."""

    def __init__(self, parent: Stream, op: Bucket) -> None:
        self._op = op
        self._pad = batching.Pad(op.padded_shapes, op.padding_values)
        self._stack = batching.Stack()
        super().__init__(parent)

    def _reset(self) -> None:
        self._buckets: list[list] = [[] for _ in self._op.sizes]
        self._done = False
        self._flush = 0

    def _buffer_empty(self) -> bool:
        return self._done and not any(self._buckets)

    def _emit(self, b: int, items: list) -> Any:
        a = self._op
        if a.no_padding:
            return self._stack(items)
        if a.to_boundary:
            if b == len(a.bounds):
                raise InputError(
                    f"an element is longer than the last bucket boundary {a.bounds[-1]} and "
                    "pad_to_bucket_boundary=True; add a larger boundary or filter long "
                    "elements out.")
            target = a.bounds[b] - 1
            return batching.Pad(_boundary_shapes(items[0], target, a.padded_shapes),
                                a.padding_values)(items)
        return self._pad(items)

    def _produce(self) -> Any:
        a = self._op
        while not self._done:
            try:
                item = self._parent.next()
            except StopIteration:
                self._done = True
                break
            length = int(call(a.length_fn, item))
            b = batching.bucket_index(length, a.bounds)
            self._buckets[b].append(item)
            if len(self._buckets[b]) == a.sizes[b]:
                items, self._buckets[b] = self._buckets[b], []
                return self._emit(b, items)
        while self._flush < len(self._buckets):  # leftovers, bucket by bucket
            b = self._flush
            items, self._buckets[b] = self._buckets[b], []
            self._flush += 1
            if items and not a.drop:
                return self._emit(b, items)
        raise StopIteration


def _leaf_shapes(template: Any, shapes: Any) -> list[Any]:
    """padded_shapes mirrors the element's structure with one shape (a tuple, list or None)
    per leaf: the shapes in leaf order (a shape is a leaf here, not a structure)."""
    if isinstance(template, dict):
        return [s for k in template for s in _leaf_shapes(template[k], shapes[k])]
    if isinstance(template, tuple | list):
        return [s for t, sh in zip(template, shapes, strict=True) for s in _leaf_shapes(t, sh)]
    return [None if shapes is None else tuple(shapes)]


def _boundary_shapes(element: Any, target: int, padded_shapes: Any) -> Any:
    if padded_shapes is not None:
        return structure.map_structure(lambda s: s, padded_shapes)
    return structure.map_structure(
        lambda x: tuple([target] + [None] * (np.ndim(x) - 1)) if np.ndim(x) else (), element)


