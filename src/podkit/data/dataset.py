"""pk.data.Dataset: tf.data's verbs over a frozen plan, run on Grain.

A Dataset holds one node of a plan (podkit.data.ops): an op, its parents and its arguments,
all frozen. Each verb checks its arguments and returns a new Dataset over a new node; nothing
runs until it is iterated. Ops that keep random access (sources, map, batch, shuffle, repeat,
take, skip, shard, enumerate, zip, concatenate, cache) build a Grain MapDataset, which worker
processes can compute in parallel by index and which resumes from one number. Ops that need
the stream in order (filter, interleave, unbatch, bucketing, generators) run as resumable
streams on top; each op says which it is and how (podkit.data.ops).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from podkit import paths
from podkit.data import batching, cores, ops, sources, structure, tfrecords
from podkit.data.constants import AUTOTUNE, INFINITE_CARDINALITY, UNKNOWN_CARDINALITY
from podkit.data.iterator import DatasetIterator
from podkit.data.ops.errors import IgnoreErrors
from podkit.data.stream import Context
from podkit.errors import ConfigError, InputError
from podkit.io import tfrecord

__all__ = ["AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "ArrayRecordDataset",
           "Dataset", "InMemoryPlan", "TFRecordDataset", "TextLineDataset"]


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
    """A tf.data-style input pipeline. Build one with a constructor, chain verbs, iterate.

    Frozen: a verb returns a new Dataset and never changes this one.
    """

    def __init__(self, plan: ops.Node) -> None:
        object.__setattr__(self, "_plan", plan)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a pk.data.Dataset is frozen; {name!r} cannot be set. Verbs "
                             "return new datasets.")

    @property
    def plan(self) -> ops.Node:
        """The node of the plan this dataset is (podkit.data.ops)."""
        return self._plan

    # -- constructors ------------------------------------------------------------------------
    @staticmethod
    def from_tensor_slices(tensors: Any) -> Dataset:
        """Elements are the rows of `tensors` (arrays, or tuples/dicts of them)."""
        return Dataset(ops.Source("slices", sources.Slices(tensors)))

    @staticmethod
    def range(*args: int) -> Dataset:
        """range(stop), range(start, stop) or range(start, stop, step) of int64 scalars."""
        if not 1 <= len(args) <= 3 or not all(isinstance(a, int | np.integer) for a in args):
            raise ConfigError(f"range{args!r}; pass 1 to 3 ints: (stop), (start, stop) or "
                              "(start, stop, step).")
        if len(args) == 3 and args[2] == 0:
            raise ConfigError("range() step must not be 0.")
        r = range(*args)
        return Dataset(ops.Source("range", sources.Range(r.start, r.stop, r.step)))

    @staticmethod
    def from_sequence(sequence: Any) -> Dataset:
        """Any object with __len__ and __getitem__ (a list, a Grain data source, ...)."""
        if not (hasattr(sequence, "__len__") and hasattr(sequence, "__getitem__")):
            raise InputError(f"from_sequence needs __len__ and __getitem__; a "
                             f"{type(sequence).__name__} has not. Use from_generator for "
                             "iterables.")
        return Dataset(ops.Source("sequence", sequence))

    @staticmethod
    def from_generator(generator: Callable[..., Any], output_signature: Any = None,
                       args: Sequence[Any] | None = None) -> Dataset:
        """Elements of `generator(*args)`, called anew for each iteration.

        Resuming replays the generator up to the saved position, so it must be deterministic.
        """
        if not callable(generator):
            raise InputError(f"from_generator needs a callable that returns an iterator, got "
                             f"a {type(generator).__name__}; pass e.g. `lambda: my_gen()`.")
        return Dataset(ops.Generator(generator, tuple(args or ()), output_signature))

    @staticmethod
    def list_files(file_pattern: str | os.PathLike | Sequence[str | os.PathLike],
                   shuffle: bool | None = None, seed: int | None = None) -> Dataset:
        """The paths that glob patterns match (local, `gs://`, `s3://`), as tf.data's: a
        dataset of names as bytes, sorted over all patterns (a path two patterns match comes
        twice), then shuffled (a new order each iteration) unless shuffle=False; a seed fixes
        the orders. As tf.io.matching_files, a wildcard matches names that start with '.'
        and matching directories are listed. No match at all is an InputError."""
        if shuffle is not None and not isinstance(shuffle, bool):
            raise ConfigError(f"list_files(shuffle={shuffle!r}); pass True, False or None.")
        patterns = sources.file_patterns(file_pattern, "list_files")
        found = sorted(m for p in patterns for m in paths.glob(p, include_hidden=True))
        if not found:
            raise InputError(f"list_files: no files matched pattern: {', '.join(patterns)}; "
                             "check the paths (a URL needs its gs:// or s3:// prefix).")
        names = np.empty(len(found), dtype=object)
        names[:] = [f.encode() for f in found]
        ds = Dataset.from_tensor_slices(names)
        return ds if shuffle is False else ds.shuffle(len(found), seed=seed)

    @staticmethod
    def zip(*datasets: Any) -> Dataset:
        """Elements of several datasets side by side (a tuple, or the structure given)."""
        structure_ = datasets[0] if len(datasets) == 1 and not isinstance(
            datasets[0], Dataset) else tuple(datasets)
        parts = structure.leaves(structure_)
        if not parts or not all(isinstance(d, Dataset) for d in parts):
            raise InputError("zip takes datasets, or a tuple/dict of datasets.")
        return Dataset(ops.Zip(tuple(d.plan for d in parts),
                               structure.map_structure(lambda _: None, structure_)))

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
        return Dataset(ops.Map(self._plan, map_func, _parallel(num_parallel_calls),
                               _deterministic(deterministic)))

    def filter(self, predicate: Callable) -> Dataset:
        if not callable(predicate):
            raise ConfigError(f"filter needs a predicate function, got {predicate!r}.")
        return Dataset(ops.Filter(self._plan, predicate))

    def batch(self, batch_size: int, drop_remainder: bool = False,
              num_parallel_calls: int | None = None, deterministic: bool | None = None,
              ) -> Dataset:
        """Stack `batch_size` consecutive elements. num_parallel_calls and deterministic act
        as map's: batches are assembled in worker processes, with the elements."""
        _positive("batch_size", batch_size)
        return Dataset(ops.Batch(self._plan, int(batch_size), bool(drop_remainder),
                                 batching.Stack(), _parallel(num_parallel_calls),
                                 _deterministic(deterministic)))

    def padded_batch(self, batch_size: int, padded_shapes: Any = None,
                     padding_values: Any = None, drop_remainder: bool = False) -> Dataset:
        _positive("batch_size", batch_size)
        return Dataset(ops.Batch(self._plan, int(batch_size), bool(drop_remainder),
                                 batching.Pad(padded_shapes, padding_values)))

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
        return Dataset(ops.Bucket(
            self._plan, element_length_func, bounds, sizes, padded_shapes, padding_values,
            to_boundary=bool(pad_to_bucket_boundary), no_padding=bool(no_padding),
            drop=bool(drop_remainder)))

    def unbatch(self) -> Dataset:
        return Dataset(ops.Unbatch(self._plan))

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
        return Dataset(ops.Shuffle(self._plan, int(buffer_size), int(seed), auto_seed=auto,
                                   reshuffle=bool(reshuffle_each_iteration)))

    def repeat(self, count: int | None = None) -> Dataset:
        if count is not None:
            count = _count("count", count)
        return Dataset(ops.Repeat(self._plan, None if count in (None, -1) else count))

    def take(self, count: int) -> Dataset:
        return Dataset(ops.Take(self._plan, _count("count", count)))

    def skip(self, count: int) -> Dataset:
        return Dataset(ops.Skip(self._plan, _count("count", count)))

    def shard(self, num_shards: int, index: int) -> Dataset:
        _positive("num_shards", num_shards)
        if not isinstance(index, int | np.integer) or not 0 <= index < num_shards:
            raise ConfigError(f"shard index={index!r}; pass 0 <= index < num_shards="
                              f"{num_shards}.")
        return Dataset(ops.Shard(self._plan, int(num_shards), int(index)))

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
        if cycle_length is not None:
            _positive("cycle_length", cycle_length, allow_autotune=True)
        block = 1 if block_length is None else block_length
        _positive("block_length", block)
        parallel = _parallel(num_parallel_calls)
        # The cycle is the order, so AUTOTUNE becomes TF's number now, as TF's op does.
        cycle = cores.interleave_cycle(cycle_length, parallel)
        if parallel not in (None, AUTOTUNE) and parallel > cycle:
            made = "" if cycle_length not in (None, AUTOTUNE) else (
                f": cycle_length={'None' if cycle_length is None else 'AUTOTUNE'} is "
                f"min(num_parallel_calls, "
                f"{cores.schedulable_cores()} schedulable cores)")
            raise ConfigError(
                f"interleave(num_parallel_calls={parallel}) is more than its cycle_length "
                f"({cycle}{made}); tf.data refuses this too (InvalidArgumentError). Pass "
                f"num_parallel_calls <= {cycle} or AUTOTUNE, or a cycle_length >= {parallel}.")
        return Dataset(ops.Interleave(self._plan, map_func, cycle, int(block), parallel,
                                      _deterministic(deterministic), _plan_of))

    def cache(self, filename: str | os.PathLike = "") -> Dataset:
        """Keep the elements of the first complete pass, in memory or (filename: a path or a
        `gs://`/`s3://` URL) in a file that later runs of this pipeline reuse. The file is
        written whole or not at all, holds arrays, never pickles, and is refused when another
        pipeline wrote it (docs/data.md, Cache files)."""
        return Dataset(ops.Cache(self._plan, os.fspath(filename)))

    def prefetch(self, buffer_size: int) -> Dataset:
        _positive("buffer_size", buffer_size, allow_autotune=True)
        return Dataset(ops.Prefetch(self._plan, int(buffer_size)))

    def enumerate(self, start: int = 0) -> Dataset:
        return Dataset(ops.Enumerate(self._plan, int(start)))

    def ignore_errors(self, log_warning: bool = False) -> Dataset:
        """The elements whose production raised left out (a corrupt TFRecord record, a map
        function that failed), as tf.data's; log_warning logs each one dropped. A stream:
        its cardinality is unknown."""
        if not isinstance(log_warning, bool):
            raise ConfigError(f"ignore_errors(log_warning={log_warning!r}); pass True or False.")
        return Dataset(IgnoreErrors(self._plan, log_warning))

    def concatenate(self, dataset: Dataset) -> Dataset:
        if not isinstance(dataset, Dataset):
            raise InputError(f"concatenate needs a Dataset, got {type(dataset).__name__}.")
        return Dataset(ops.Concatenate((self._plan, dataset.plan)))

    # -- inspection --------------------------------------------------------------------------
    def cardinality(self) -> int:
        """Number of elements; INFINITE_CARDINALITY (-1) or UNKNOWN_CARDINALITY (-2)."""
        return self._plan.cardinality()

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
        memo = self._plan.runtime.memo
        if "spec" not in memo:
            first = self.peek()
            if first is None:
                raise InputError("element_spec of an empty dataset is unknown.")
            memo["spec"] = self._plan.element_spec(first)
        return memo["spec"]

    def __iter__(self) -> Iterator:
        return self._iterator()

    def as_numpy_iterator(self) -> Iterator:
        return self._iterator()

    def _iterator(self, workers: bool = True) -> DatasetIterator:
        # Each iteration is a new epoch for shuffles that reshuffle.
        return DatasetIterator(self._plan, iteration=self._plan.runtime.next_iteration(),
                               workers=workers)

    def peek(self) -> Any:
        """The first element of the next iteration, in this process, without using that
        iteration up: looking (element_spec, fit()'s build) never changes a shuffle's order."""
        with DatasetIterator(self._plan, iteration=self._plan.runtime.iterations,
                             workers=False) as it:
            return next(it, None)

    def fingerprint(self) -> str:
        """Identifies the pipeline's structure and arguments (not drawn seeds)."""
        return self._plan.fingerprint()

    def __repr__(self) -> str:
        return f"<Dataset {self._plan.name} cardinality={self.cardinality()}>"

    def shuffle_seeds(self) -> list[int]:
        """The seeds of the pipeline's shuffles, in plan order (drawn ones included)."""
        return self._plan.shuffle_seeds()

    def with_shuffle_seeds(self, seeds: Sequence[int]) -> Dataset:
        """This pipeline with these seeds for its shuffles (plan order), e.g. the seeds that
        process 0 drew, so that the processes of one job agree. This dataset is unchanged;
        with the seeds it already has, it is returned as it is."""
        plan = self._plan.with_shuffle_seeds(seeds)
        return self if plan is self._plan else Dataset(plan)

    def in_memory_plan(self) -> InMemoryPlan | None:
        """For a plan that only reorders and batches in-memory arrays — from_tensor_slices,
        then shuffle/take/skip/shard/repeat, then batch, then prefetch — the arrays, the batch
        size and `epoch_rows(e)`: the source rows of epoch e's elements in this dataset's
        order (as `ds.repeat()` gives them, each epoch reshuffled). fit() keeps such arrays on
        the devices and sends row ids. None for any other plan (or an empty one)."""
        return _staged(self._plan) if self.cardinality() > 0 else None

    # -- distribution --------------------------------------------------------------------------
    def for_process(self, num_processes: int, index: int) -> Dataset:
        """This process's share for fit(): shard just below the last batch, batch / processes.

        Global batch k (the union of every process's batch k) holds exactly the elements of
        this dataset's batch k, so a multi-process job sees the same batches as one process.
        """
        if num_processes == 1:
            return self
        return Dataset(self._plan.for_process(num_processes, index))


def _plan_of(made: Any) -> ops.Node | None:
    """What interleave's function returned, as a plan (None when it is not a Dataset)."""
    return made.plan if isinstance(made, Dataset) else None


# The ops between a batch and in-memory arrays that only pick and order rows.
_ROW_PICKERS = (ops.Shuffle, ops.Take, ops.Skip, ops.Shard, ops.Repeat)


def _staged(node: ops.Node) -> InMemoryPlan | None:
    """See Dataset.in_memory_plan."""
    top = node
    while isinstance(top, ops.Prefetch):
        top = top.parent
    if not isinstance(top, ops.Batch) or not top.stacks:
        return None
    below = top.parent
    while isinstance(below, _ROW_PICKERS):
        below = below.parent
    tensors = below.in_memory_tensors() if isinstance(below, ops.Source) else None
    if tensors is None:
        return None
    # Epoch after epoch, as fit() iterates ds.repeat(): each repetition reshuffles.
    endless = ops.Repeat(node, None)
    ds = endless.build(Context(workers=False), (node.runtime.next_iteration(),))
    return InMemoryPlan(tensors, top.size, ds.epoch_rows)


def TextLineDataset(filenames: str | os.PathLike | Sequence[str | os.PathLike],
                    compression_type: str | None = None, buffer_size: int | None = None,
                    num_parallel_reads: int | None = None) -> Dataset:
    """Lines of text files (bytes, without the line end), file after file, as tf.data's.

    filenames: paths, `gs://` / `s3://` URLs or glob patterns, or a Dataset of file names
    (e.g. `Dataset.list_files`). Plain files (compression_type None or "") have random access:
    one scan finds the line offsets. "GZIP" and "ZLIB" files are read in order, a stream
    (cardinality unknown); buffer_size is then the bytes of one read. num_parallel_reads=k > 1
    reads k files at once and interleaves their lines one by one, tf.data's order; AUTOTUNE
    reads as many as tf.data would on this machine (ceil(schedulable cores / 3),
    podkit.data.cores), in the same order.
    """
    compression = sources.compression_type(compression_type, "TextLineDataset")
    if buffer_size is not None:
        _positive("buffer_size", buffer_size)
    if num_parallel_reads is not None:
        _positive("num_parallel_reads", num_parallel_reads, allow_autotune=True)
    if isinstance(filenames, Dataset):
        return filenames.interleave(_TextFile(compression, buffer_size),
                                    cycle_length=num_parallel_reads or 1, block_length=1,
                                    num_parallel_calls=num_parallel_reads)
    files = sources.expand_files(filenames, "TextLineDataset")
    cycle = _files_cycle(num_parallel_reads)
    if cycle == 1 or len(files) == 1:
        return _text_lines(files, compression, buffer_size)
    names = np.empty(len(files), dtype=object)
    names[:] = files
    return Dataset.from_tensor_slices(names).interleave(
        _TextFile(compression, buffer_size), cycle_length=cycle, block_length=1,
        num_parallel_calls=cycle)


def _files_cycle(num_parallel_reads: int | None) -> int:
    """How many files tf.data's readers (TextLineDataset, TFRecordDataset) read in turn:
    None reads them one after another (flat_map), k reads k (its legacy parallel
    interleave), AUTOTUNE is `interleave(num_parallel_calls=AUTOTUNE)` with its cycle left
    to AUTOTUNE too (tensorflow/python/data/ops/readers.py), resolved as tf.data does."""
    if num_parallel_reads is None:
        return 1
    return cores.interleave_cycle(AUTOTUNE, AUTOTUNE) if num_parallel_reads == AUTOTUNE \
        else int(num_parallel_reads)


def _text_lines(files: list[str], compression: str, buffer_size: int | None) -> Dataset:
    if compression:
        return Dataset(ops.CompressedText(tuple(files), compression, buffer_size))
    return Dataset(ops.Source("text", sources.TextLines(files)))


class _TextFile:
    """TextLineDataset's reader of one file, for num_parallel_reads' interleave."""

    def __init__(self, compression: str, buffer_size: int | None) -> None:
        self.compression, self.buffer_size = compression, buffer_size

    def __call__(self, name: Any) -> Dataset:
        return _text_lines([sources.as_path(name)], self.compression, self.buffer_size)


def ArrayRecordDataset(filenames: str | os.PathLike | Sequence[str | os.PathLike]) -> Dataset:
    """Records (bytes) of ArrayRecord files, file after file, with random access."""
    files = sources.expand_files(filenames, "ArrayRecordDataset")
    return Dataset(ops.Source("array_record", sources.ArrayRecords(files)))


def TFRecordDataset(filenames: Any, compression_type: str | None = None,
                    buffer_size: int | None = None, num_parallel_reads: int | None = None,
                    ) -> Dataset:
    """Records (bytes) of TFRecord files, as tf.data's: the same records in the same order,
    each record's length and data CRCs checked (a bad one is a DataError naming the file and
    the byte offset; `ignore_errors()` drops it).

    filenames: a path, `gs://`/`s3://` URL or glob pattern, a list of them, or a Dataset of
    file names (e.g. `Dataset.list_files`). Uncompressed files have random access through an
    index of record offsets built when the dataset is made and cached (podkit.data.tfrecords), so
    shuffle, shard, exact resume and fit()'s per-process split are as on ArrayRecord (the
    cardinality is known, unless a file is damaged: then unknown, as tf.data's always is).
    compression_type "GZIP"/"ZLIB" files are read in order (a stream). buffer_size: the bytes
    of one read (the index scan, a remote block, a compressed stream). num_parallel_reads=k > 1
    gives tf.data's interleaved order (k files open, one record from each in turn; AUTOTUNE:
    k = ceil(schedulable cores / 3), what tf.data resolves it to, podkit.data.cores): for
    plain files as an index order, keeping random access (the reads themselves run where the
    elements are computed, e.g. map's workers); for compressed files and a Dataset of names,
    k files read on k threads (a stream).
    """
    compression = tfrecord.compression_of(compression_type)
    if buffer_size is not None:
        _positive("buffer_size", buffer_size)
    if num_parallel_reads is not None:
        _positive("num_parallel_reads", num_parallel_reads, allow_autotune=True)
    reader = _TFRecordFile(compression, buffer_size)
    if isinstance(filenames, Dataset):
        return filenames.interleave(reader, cycle_length=num_parallel_reads or 1,
                                    block_length=1, num_parallel_calls=num_parallel_reads)
    files = sources.expand_files(filenames, "TFRecordDataset")
    cycle = _files_cycle(num_parallel_reads)
    if cycle == 1 or len(files) == 1:
        return _tfrecord_files(files, compression, buffer_size)
    if not compression:  # tf.data's interleaved order, kept as random access
        return Dataset(tfrecords.TFRecordSource(
            "tfrecord", tfrecords.TFRecords(files, buffer_size, cycle)))
    names = np.empty(len(files), dtype=object)
    names[:] = files
    return Dataset.from_tensor_slices(names).interleave(
        reader, cycle_length=cycle, block_length=1, num_parallel_calls=cycle)


def _tfrecord_files(files: list[str], compression: str, buffer_size: int | None) -> Dataset:
    if compression:
        return Dataset(tfrecords.CompressedTFRecords(tuple(files), compression))
    return Dataset(tfrecords.TFRecordSource("tfrecord", tfrecords.TFRecords(files, buffer_size)))


class _TFRecordFile:
    """TFRecordDataset's reader of one file, for interleave (num_parallel_reads, a Dataset
    of file names)."""

    def __init__(self, compression: str, buffer_size: int | None) -> None:
        self.compression, self.buffer_size = compression, buffer_size

    def __call__(self, name: Any) -> Dataset:
        return _tfrecord_files([sources.as_path(name)], self.compression, self.buffer_size)
