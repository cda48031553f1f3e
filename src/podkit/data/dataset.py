"""pk.data.Dataset: tf.data's verbs as an immutable plan, run on Grain.

A Dataset is a node in a plan: an op, its parent datasets and its arguments. Nothing runs until
it is iterated. Ops that keep random access (sources, map, batch, shuffle, repeat, take, skip,
shard, enumerate, zip, concatenate, cache) build a Grain MapDataset, which worker processes can
compute in parallel by index and which resumes from one number. Ops that need the stream in
order (filter, interleave, unbatch, bucketing, generators) run as resumable streams on top; see
podkit.data.stream.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from podkit.data import batching, sources, structure
from podkit.data.functions import fn_name
from podkit.errors import ConfigError, InputError

AUTOTUNE = -1
INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2

# Ops that keep random access when all their parents have it.
_RANDOM_ACCESS = {
    "slices", "range", "sequence", "text", "array_record", "map", "batch", "padded_batch",
    "shuffle", "repeat", "take", "skip", "shard", "enumerate", "zip", "concatenate", "prefetch",
}
# Ops whose output is a random-access source whatever their parent is.
_MATERIALIZED = {"cache"}


def _positive(name: str, value: Any, allow_autotune: bool = False) -> None:
    if allow_autotune and value == AUTOTUNE:
        return
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        hint = " or pk.data.AUTOTUNE" if allow_autotune else ""
        raise ConfigError(f"{name}={value!r}; pass a positive int{hint}.")


def _deterministic(value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"deterministic={value!r}; pass True, False or None.")
    return value


def _parallel(value: Any) -> int | None:
    if value is not None:
        _positive("num_parallel_calls", value, allow_autotune=True)
    return value


def _count(name: str, value: Any) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < -1:
        raise ConfigError(f"{name}={value!r}; pass an int >= 0 (or -1 for all).")
    return int(value)


class InMemoryPlan(NamedTuple):
    """See Dataset.in_memory_plan."""

    tensors: Any
    batch_size: int
    epoch_rows: Callable[[int], np.ndarray]


class Dataset:
    """A tf.data-style input pipeline. Build one with a constructor, chain verbs, iterate."""

    def __init__(self, op: str, parents: Sequence[Dataset] = (), **args: Any) -> None:
        self._op = op
        self._parents = tuple(parents)
        self._args = args
        self._random_access = op in _MATERIALIZED or (
            op in _RANDOM_ACCESS and all(p._random_access for p in self._parents))
        self._iterations = 0  # each __iter__ is a new epoch for shuffles
        self._memo: dict[str, Any] = {}  # per-node run-time memory: cache contents, autotune

    # -- constructors ------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors: Any) -> Dataset:
        """Elements are the rows of `tensors` (arrays, or tuples/dicts of them)."""
        return Dataset("slices", source=sources.Slices(tensors))

    @staticmethod
    def range(*args: int) -> Dataset:
        """range(stop), range(start, stop) or range(start, stop, step) of int64 scalars."""
        if not 1 <= len(args) <= 3 or not all(isinstance(a, int | np.integer) for a in args):
            raise ConfigError(f"range{args!r}; pass 1 to 3 ints: (stop), (start, stop) or "
                              "(start, stop, step).")
        if len(args) == 3 and args[2] == 0:
            raise ConfigError("range() step must not be 0.")
        r = range(*args)
        return Dataset("range", source=sources.Range(r.start, r.stop, r.step))

    @staticmethod
    def from_sequence(sequence: Any) -> Dataset:
        """Any object with __len__ and __getitem__ (a list, a Grain data source, ...)."""
        if not (hasattr(sequence, "__len__") and hasattr(sequence, "__getitem__")):
            raise InputError(f"from_sequence needs __len__ and __getitem__; a "
                             f"{type(sequence).__name__} has not. Use from_generator for "
                             "iterables.")
        return Dataset("sequence", source=sequence)

    @staticmethod
    def from_generator(generator: Callable[..., Any], output_signature: Any = None,
                       args: Sequence[Any] | None = None) -> Dataset:
        """Elements of `generator(*args)`, called anew for each iteration.

        Resuming replays the generator up to the saved position, so it must be deterministic.
        """
        if not callable(generator):
            raise InputError(f"from_generator needs a callable that returns an iterator, got "
                             f"a {type(generator).__name__}; pass e.g. `lambda: my_gen()`.")
        return Dataset("generator", fn=generator, args=tuple(args or ()),
                       signature=output_signature)

    @staticmethod
    def zip(*datasets: Any) -> Dataset:
        """Elements of several datasets side by side (a tuple, or the structure given)."""
        structure_ = datasets[0] if len(datasets) == 1 and not isinstance(
            datasets[0], Dataset) else tuple(datasets)
        parts = structure.leaves(structure_)
        if not parts or not all(isinstance(d, Dataset) for d in parts):
            raise InputError("zip takes datasets, or a tuple/dict of datasets.")
        return Dataset("zip", parts, structure=structure.map_structure(lambda _: None,
                                                                       structure_))

    # -- transformations ---------------------------------------------------------------------
    def map(self, map_func: Callable, num_parallel_calls: int | None = None,
            deterministic: bool | None = None) -> Dataset:
        """Apply `map_func` to every element.

        num_parallel_calls=N computes the elements in N worker processes; AUTOTUNE decides
        from the measured cost of one element (docs/data.md); None computes them here. The
        output order is the input order unless deterministic=False, which lets elements come
        as workers finish them.
        """
        if not callable(map_func):
            raise ConfigError(f"map needs a function, got {map_func!r}.")
        return Dataset("map", [self], fn=map_func, parallel=_parallel(num_parallel_calls),
                       deterministic=_deterministic(deterministic))

    def filter(self, predicate: Callable) -> Dataset:
        if not callable(predicate):
            raise ConfigError(f"filter needs a predicate function, got {predicate!r}.")
        return Dataset("filter", [self], fn=predicate)

    def batch(self, batch_size: int, drop_remainder: bool = False,
              num_parallel_calls: int | None = None, deterministic: bool | None = None,
              ) -> Dataset:
        """Stack `batch_size` consecutive elements. num_parallel_calls and deterministic act
        as map's: batches are assembled in worker processes, with the elements."""
        _positive("batch_size", batch_size)
        return Dataset("batch", [self], size=int(batch_size), drop=bool(drop_remainder),
                       fn=batching.Stack(), parallel=_parallel(num_parallel_calls),
                       deterministic=_deterministic(deterministic))

    def padded_batch(self, batch_size: int, padded_shapes: Any = None,
                     padding_values: Any = None, drop_remainder: bool = False) -> Dataset:
        _positive("batch_size", batch_size)
        return Dataset("padded_batch", [self], size=int(batch_size), drop=bool(drop_remainder),
                       fn=batching.Pad(padded_shapes, padding_values))

    def bucket_by_sequence_length(
        self, element_length_func: Callable, bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int], padded_shapes: Any = None, padding_values: Any = None,
        pad_to_bucket_boundary: bool = False, no_padding: bool = False,
        drop_remainder: bool = False,
    ) -> Dataset:
        """Group elements by length into batches (tf.data's semantics).

        For shapes that never change, and so one compiled step per bucket, pass
        pad_to_bucket_boundary=True and drop_remainder=True.
        """
        bounds = list(bucket_boundaries)
        if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)) or not all(
                isinstance(b, int) and b > 0 for b in bounds):
            raise ConfigError(f"bucket_boundaries={bounds}; pass increasing positive ints.")
        sizes = list(bucket_batch_sizes)
        if len(sizes) != len(bounds) + 1:
            raise ConfigError(f"bucket_batch_sizes has {len(sizes)} entries; it needs "
                              f"len(bucket_boundaries) + 1 = {len(bounds) + 1}.")
        for s in sizes:
            _positive("bucket_batch_sizes entry", s)
        return Dataset("bucket", [self], length_fn=element_length_func, bounds=bounds,
                       sizes=sizes, padded_shapes=padded_shapes, padding_values=padding_values,
                       to_boundary=bool(pad_to_bucket_boundary), no_padding=bool(no_padding),
                       drop=bool(drop_remainder))

    def unbatch(self) -> Dataset:
        return Dataset("unbatch", [self])

    def shuffle(self, buffer_size: int, seed: int | None = None,
                reshuffle_each_iteration: bool = True) -> Dataset:
        """A seed-determined random order; a new one each iteration (and each repeat) unless
        reshuffle_each_iteration=False. See docs/data.md for how it differs from tf.data."""
        _positive("buffer_size", buffer_size)
        if seed is not None and (not isinstance(seed, int | np.integer) or seed < 0):
            raise ConfigError(f"seed={seed!r}; pass a non-negative int or None.")
        auto = seed is None
        if auto:  # drawn once; iterator states carry it so a restored iterator reuses it
            seed = int.from_bytes(os.urandom(4), "little") >> 1  # 31 bits: fits int32
        return Dataset("shuffle", [self], buffer=int(buffer_size), seed=int(seed),
                       auto_seed=auto, reshuffle=bool(reshuffle_each_iteration))

    def repeat(self, count: int | None = None) -> Dataset:
        if count is not None:
            count = _count("count", count)
        return Dataset("repeat", [self], count=None if count in (None, -1) else count)

    def take(self, count: int) -> Dataset:
        return Dataset("take", [self], count=_count("count", count))

    def skip(self, count: int) -> Dataset:
        return Dataset("skip", [self], count=_count("count", count))

    def shard(self, num_shards: int, index: int) -> Dataset:
        _positive("num_shards", num_shards)
        if not isinstance(index, int | np.integer) or not 0 <= index < num_shards:
            raise ConfigError(f"shard index={index!r}; pass 0 <= index < num_shards="
                              f"{num_shards}.")
        return Dataset("shard", [self], num=int(num_shards), index=int(index))

    def interleave(self, map_func: Callable, cycle_length: int | None = None,
                   block_length: int | None = None, num_parallel_calls: int | None = None,
                   deterministic: bool | None = None) -> Dataset:
        """map_func(element) -> Dataset; take block_length elements from each of cycle_length
        open datasets in turn (tf.data's order).

        With num_parallel_calls, each open dataset is read ahead by a thread of its own (for
        readers that wait on files; CPU-heavy work belongs in a map before or inside it).
        deterministic=False then takes the next element from whichever open dataset has one
        ready when the one whose turn it is has not.
        """
        if not callable(map_func):
            raise ConfigError(f"interleave needs a function returning a Dataset, got "
                              f"{map_func!r}.")
        cycle = cycle_length if cycle_length not in (None, AUTOTUNE) else (os.cpu_count() or 1)
        _positive("cycle_length", cycle)
        block = 1 if block_length is None else block_length
        _positive("block_length", block)
        return Dataset("interleave", [self], fn=map_func, cycle=int(cycle), block=int(block),
                       parallel=_parallel(num_parallel_calls),
                       deterministic=_deterministic(deterministic))

    def cache(self, filename: str | os.PathLike = "") -> Dataset:
        """Keep the elements of the first complete pass, in memory or (filename) in a file that
        later runs reuse. The file is written whole or not at all."""
        return Dataset("cache", [self], filename=os.fspath(filename))

    def prefetch(self, buffer_size: int) -> Dataset:
        _positive("buffer_size", buffer_size, allow_autotune=True)
        return Dataset("prefetch", [self], buffer=int(buffer_size))

    def enumerate(self, start: int = 0) -> Dataset:
        return Dataset("enumerate", [self], start=int(start))

    def concatenate(self, dataset: Dataset) -> Dataset:
        if not isinstance(dataset, Dataset):
            raise InputError(f"concatenate needs a Dataset, got {type(dataset).__name__}.")
        return Dataset("concatenate", [self, dataset])

    # -- inspection --------------------------------------------------------------------------
    def cardinality(self) -> int:
        """Number of elements; INFINITE_CARDINALITY (-1) or UNKNOWN_CARDINALITY (-2)."""
        return _cardinality(self)

    def __len__(self) -> int:
        n = self.cardinality()
        if n < 0:
            raise TypeError("the dataset's length is "
                            f"{'infinite' if n == INFINITE_CARDINALITY else 'unknown'}; use "
                            "cardinality().")
        return n

    @property
    def element_spec(self) -> Any:
        """TensorSpec per leaf (None where a size varies), read off the first element."""
        if "spec" not in self._memo:
            first = self.peek()
            if first is None:
                raise InputError("element_spec of an empty dataset is unknown.")
            spec = structure.spec_of(first)
            batch_op = _batch_op(self)
            if batch_op is not None and not batch_op._args["drop"]:
                spec = structure.map_structure(
                    lambda s: structure.TensorSpec((None, *s.shape[1:]), s.dtype), spec)
            self._memo["spec"] = spec
        return self._memo["spec"]

    def __iter__(self) -> Iterator:
        return self._iterator()

    def as_numpy_iterator(self) -> Iterator:
        return self._iterator()

    def _iterator(self, workers: bool = True) -> Any:
        from podkit.data.iterator import DatasetIterator

        return DatasetIterator(self, iteration=self._next_iteration(), workers=workers)

    def _next_iteration(self) -> int:
        self._iterations += 1
        return self._iterations - 1

    def peek(self) -> Any:
        """The first element of the next iteration, in this process, without using that
        iteration up: looking (element_spec, fit()'s build) never changes a shuffle's order."""
        from podkit.data.iterator import DatasetIterator

        with DatasetIterator(self, iteration=self._iterations, workers=False) as it:
            return next(it, None)

    def fingerprint(self) -> str:
        """Identifies the pipeline's structure and arguments (not drawn seeds)."""
        h = hashlib.sha256()
        for node in self._walk():
            h.update(node._describe().encode())
        return h.hexdigest()[:16]

    def _walk(self) -> list[Dataset]:
        """Nodes in a fixed depth-first order (parents first); positions key drawn seeds."""
        out: list[Dataset] = []

        def visit(node: Dataset) -> None:
            for p in node._parents:
                visit(p)
            out.append(node)
        visit(self)
        return out

    def _describe(self) -> str:
        def show(v: Any) -> str:
            if callable(v) and not isinstance(v, batching.Stack | batching.Pad):
                return fn_name(v)
            if isinstance(v, sources.Slices):
                return f"slices{structure.describe(v.tensors)}"
            if isinstance(v, sources.TextLines):
                return f"text{v.files}"
            if isinstance(v, batching.Pad):
                return f"pad({v.padded_shapes!r},{v.padding_values!r})"
            if isinstance(v, batching.Stack):
                return "stack"
            if hasattr(v, "__len__") and not isinstance(v, str | list | tuple | dict):
                return f"{type(v).__name__}[{len(v)}]"
            return repr(v)
        args = {k: (None if k == "seed" and self._args.get("auto_seed") else v)
                for k, v in self._args.items()}
        return f"{self._op}({', '.join(f'{k}={show(v)}' for k, v in sorted(args.items()))})|"

    def __repr__(self) -> str:
        return f"<Dataset {self._op} cardinality={self.cardinality()}>"

    def shuffle_seeds(self) -> list[int]:
        """The seeds of the pipeline's shuffles, in plan order (drawn ones included)."""
        return [n._args["seed"] for n in self._walk() if n._op == "shuffle"]

    def adopt_shuffle_seeds(self, seeds: Sequence[int]) -> None:
        """Use these seeds for the shuffles (plan order): processes of one job must agree."""
        nodes = [n for n in self._walk() if n._op == "shuffle"]
        for node, seed in zip(nodes, seeds, strict=True):
            node._args["seed"] = int(seed)

    def in_memory_plan(self) -> InMemoryPlan | None:
        """For a plan that only reorders and batches in-memory arrays — from_tensor_slices,
        then shuffle/take/skip/shard/repeat, then batch, then prefetch — the arrays, the batch
        size and `epoch_rows(e)`: the source rows of epoch e's elements in this dataset's
        order (as `ds.repeat()` gives them, each epoch reshuffled). fit() keeps such arrays on
        the devices and sends row ids. None for any other plan (or an empty one)."""
        from podkit.data.random_access import staged_rows

        plan = staged_rows(self) if self.cardinality() > 0 else None
        return None if plan is None else InMemoryPlan(*plan)

    # -- distribution --------------------------------------------------------------------------
    def for_process(self, num_processes: int, index: int) -> Dataset:
        """This process's share for fit(): shard just below the last batch, batch / processes.

        Global batch k (the union of every process's batch k) holds exactly the elements of
        this dataset's batch k, so a multi-process job sees the same batches as one process.
        """
        if num_processes == 1:
            return self
        if self._op in ("batch", "padded_batch"):
            size = self._args["size"]
            if size % num_processes:
                raise ConfigError(
                    f"batch size {size} is not divisible by the {num_processes} processes; "
                    f"batch to a multiple of {num_processes} (the global batch).")
            return Dataset(self._op, [self._parents[0].shard(num_processes, index)],
                           **{**self._args, "size": size // num_processes})
        if self._op in ("map", "prefetch", "take", "skip", "repeat", "shuffle", "enumerate",
                        "cache") and len(self._parents) == 1:
            return Dataset(self._op, [self._parents[0].for_process(num_processes, index)],
                           **self._args)
        raise InputError(
            f"fit() shards a dataset across processes below its last batch(), but found "
            f"{self._op}() above it (or no batch at all); batch the dataset last, e.g. "
            "ds.map(...).batch(global_batch_size).prefetch(AUTOTUNE).")


def TextLineDataset(filenames: str | os.PathLike | Sequence[str | os.PathLike]) -> Dataset:
    """Lines of text files (bytes, without the line end), file after file."""
    return Dataset("text", source=sources.TextLines(
        sources.expand_files(filenames, "TextLineDataset")))


def ArrayRecordDataset(filenames: str | os.PathLike | Sequence[str | os.PathLike]) -> Dataset:
    """Records (bytes) of ArrayRecord files, file after file, with random access."""
    files = sources.expand_files(filenames, "ArrayRecordDataset")
    return Dataset("array_record", source=sources.ArrayRecords(files))


def _batch_op(ds: Dataset) -> Dataset | None:
    node = ds
    while node._op in ("prefetch", "take", "skip", "shard", "repeat", "shuffle", "cache"):
        node = node._parents[0]
    return node if node._op in ("batch", "padded_batch") else None


def _cardinality(ds: Dataset) -> int:
    op, a = ds._op, ds._args
    if op in ("slices", "range", "sequence", "text", "array_record"):
        return len(a["source"])
    if op in ("generator", "filter", "interleave", "unbatch", "bucket"):
        return UNKNOWN_CARDINALITY
    parents = [_cardinality(p) for p in ds._parents]
    n = parents[0] if parents else UNKNOWN_CARDINALITY
    if op in ("map", "prefetch", "enumerate", "shuffle", "cache"):
        return n
    if op in ("batch", "padded_batch"):
        if n < 0:
            return n
        return n // a["size"] if a["drop"] else -(-n // a["size"])
    if op == "repeat":
        if a["count"] == 0:
            return 0
        if n == 0:
            return 0
        if a["count"] is None or n == INFINITE_CARDINALITY:
            return INFINITE_CARDINALITY
        return n * a["count"] if n >= 0 else UNKNOWN_CARDINALITY
    if op == "take":
        if a["count"] == -1:
            return n
        if n == INFINITE_CARDINALITY:
            return a["count"]
        return min(n, a["count"]) if n >= 0 else UNKNOWN_CARDINALITY
    if op == "skip":
        if a["count"] == -1:
            return 0 if n >= 0 else n
        return max(n - a["count"], 0) if n >= 0 else n
    if op == "shard":
        if n < 0:
            return n
        return len(range(a["index"], n, a["num"]))
    if op == "zip":
        if any(p == UNKNOWN_CARDINALITY for p in parents):
            return UNKNOWN_CARDINALITY
        finite = [p for p in parents if p >= 0]
        return min(finite) if finite else INFINITE_CARDINALITY
    if op == "concatenate":
        if INFINITE_CARDINALITY in parents:
            return INFINITE_CARDINALITY
        if UNKNOWN_CARDINALITY in parents:
            return UNKNOWN_CARDINALITY
        return sum(parents)
    raise AssertionError(op)
