"""cache: the elements of the first complete pass, kept in memory or in a file.

Whatever its parent is, a cache has random access: the first iteration materializes the parent
(in parallel where the parent allows), later ones read by index.

A file cache (`cache("c")`, `cache("gs://b/c")`) is one ArrayRecord file,
`c.podkit_cache.array_record`: a header record (the format, its version, the fingerprint of
the pipeline above the cache, the element count), then one record per element in
podkit.data.codec's format, which holds data only (arrays as dtype, shape and bytes), so a
cache file from elsewhere cannot run code when read. It is written locally and renamed or
uploaded when complete, so it is whole or absent. A file written by another pipeline (another
fingerprint) is refused; tf.data reuses any cache file and errs only when its tensors do not
match the dataset's spec (docs/data.md).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from podkit import paths
from podkit.data import codec, sources
from podkit.data.constants import INFINITE_CARDINALITY
from podkit.data.ops.base import Node, PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context
from podkit.errors import InputError

if TYPE_CHECKING:
    from podkit.data._grain import grain

SUFFIX = ".podkit_cache.array_record"
FORMAT, VERSION = "podkit.data.cache", 1


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Cache(PassesBatches, SplitsBelow, Unary):
    filename: str = ""  # "": in memory
    name = "cache"
    materialized = True

    def describe_args(self) -> dict[str, Any]:
        return {"filename": self.filename}

    def varies(self) -> bool:
        return False  # the first pass is kept: later iterations see the same elements

    def for_process(self, num_processes: int, index: int) -> Node:
        """The cache of this process's share; a file cache in a file of its own, so that the
        processes of one job never read each other's share."""
        share = self.parent.for_process(num_processes, index)
        name = (f"{self.filename}.process-{index:05d}-of-{num_processes:05d}"
                if self.filename else "")
        return dataclasses.replace(self, parent=share, filename=name)

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        file = self.filename + SUFFIX if self.filename else ""
        memo = self.runtime.memo
        if "cache" not in memo:
            if file and paths.exists(file):
                memo["cache"] = _open(file, self.parent.fingerprint())
            else:
                elements = drain(self.parent, ctx, "cache()")
                if file:
                    _write(file, elements, self.parent.fingerprint())
                    memo["cache"] = _open(file, self.parent.fingerprint())
                else:
                    memo["cache"] = sources.Elements(elements)
        ds = random_access.Source(memo["cache"])
        return ds.map(codec.Decode()) if file else ds


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


def _write(file: str, elements: list[Any], fingerprint: str) -> None:
    # Every element is encoded before anything is written: an element the format cannot hold
    # is an error that leaves no file.
    records = [codec.encode(e) for e in elements]
    header = codec.encode_header({"format": FORMAT, "version": VERSION,
                                  "fingerprint": fingerprint, "elements": len(records)})
    with paths.staged(file) as local:
        from array_record.python.array_record_module import ArrayRecordWriter

        writer = ArrayRecordWriter(local, "group_size:1")
        try:
            writer.write(header)
            for r in records:
                writer.write(r)
        finally:
            writer.close()


def _open(file: str, fingerprint: str) -> sources.ArrayRecords:
    """The cache file's elements as a source, once its header says this pipeline wrote it."""
    from array_record.python.array_record_module import ArrayRecordReader

    fix = "delete it, or pass cache() another filename"
    local = sources.local_file(file)
    reader = ArrayRecordReader(local, "readahead_buffer_size:0")
    try:
        count = reader.num_records()
        header = codec.decode_header(reader.read([0])[0]) if count else None
    except Exception as e:  # the reader's own message does not say which file
        raise InputError(f"cache(): could not read {file!r} ({e}); {fix}.") from e
    finally:
        reader.close()
    if header is None or header.get("format") != FORMAT:
        raise InputError(f"cache(): {file!r} is not a podkit cache file (an older podkit wrote "
                         f"caches as pickles, which podkit no longer reads); {fix}.")
    if header.get("version") != VERSION:
        raise InputError(f"cache(): {file!r} is a podkit cache of format version "
                         f"{header.get('version')!r}, this podkit reads {VERSION}; {fix}.")
    if header.get("fingerprint") != fingerprint:
        raise InputError(
            f"cache(): {file!r} was written by another pipeline (fingerprint "
            f"{header.get('fingerprint')}, this one's is {fingerprint}); its elements are not "
            f"this dataset's. {fix[0].upper()}{fix[1:]}.")
    if header.get("elements") != count - 1:
        raise InputError(f"cache(): {file!r} holds {count - 1} elements but its header says "
                         f"{header.get('elements')}; {fix}.")
    return sources.ArrayRecords([file], skip=1)
