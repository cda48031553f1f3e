"""AUTOTUNE: choose worker processes and their buffers from measured costs.

The first items of the random-access part are timed in this process; an item's cost divided
by the elements it holds (the product of the batch sizes above the map) is the cost of one
element. AUTOTUNE starts one worker process per usable core (one fewer from 4 cores up: the
consuming process -- a training loop's feed stacking and placing the batches -- needs a core
of its own at those rates; on the 13-core TPU host 12 workers gave the ImageNet pipeline
3,155 images/s and 13 gave 2,861) when

  * one element costs at least WORKER_MIN_ELEMENT_S (50 us) of Python, and
  * the pass holds at least WORKER_MIN_WORK_S (0.5 s) of such work (always true of repeat()),

since below either the workers' start-up and hand-off cost more than they give. The batch
size never enters the decision, and the decision never changes the elements: workers compute
exactly what this process would, in the same order (see podkit.data.pool).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from podkit.data import cores, pool, structure
from podkit.data.constants import AUTOTUNE

PROBE_S = 0.25  # time spent measuring, once per pipeline
WORKER_MIN_ELEMENT_S = 50e-6  # below this per element, a worker gives less than it costs
WORKER_MIN_WORK_S = 0.5  # a pass shorter than this ends before workers pay their start-up
THREAD_MIN_COST_S = 0.0002  # below this per item, a prefetch thread's hand-off costs more
BUFFER_S = 0.2  # work in flight per worker: rides out a consumer that takes items in bursts
MAX_DEPTH = 16
CONSUMER_CORE_FROM = 4  # from this many cores up, AUTOTUNE leaves one to the consumer
MEMORY_BUDGET = 256 << 20  # bytes of elements in flight across all workers


@dataclasses.dataclass
class Parallelism:
    """How one reader computes the random-access part of a pipeline."""

    workers: int = 0  # worker processes (podkit.data.pool); 0: this process
    threads: int = 0  # Grain read threads in this process, when there are no workers
    buffer: int = 2  # items a read thread keeps ready
    depth: int = 2  # chunks in flight per worker
    ordered: bool = True  # False: items may come as workers finish them (deterministic=False)
    tuned: bool = False  # AUTOTUNE chose the workers (so it may choose this process instead)
    item_s: float | None = None  # measured seconds per item, when measured
    item_bytes: int = 0


def usable_cores() -> int:
    return cores.schedulable_cores()


def worker_count() -> int:
    """The workers AUTOTUNE starts: a core each, less one for the consumer from 4 cores up."""
    cores_ = usable_cores()
    return cores_ - 1 if cores_ >= CONSUMER_CORE_FROM else cores_


def _nbytes(tree: Any) -> int:
    return sum(np.asarray(x).nbytes if not isinstance(x, bytes) else len(x)
               for x in structure.leaves(tree))


def measure(ds: Any) -> tuple[float, int]:
    """Seconds and bytes per item of a Grain MapDataset, from its first items."""
    n = min(len(ds), 64)
    start, count, size = time.perf_counter(), 0, 0
    while count < n and (count < 2 or time.perf_counter() - start < PROBE_S):
        size = max(size, _nbytes(ds[count]))
        count += 1
    return (time.perf_counter() - start) / max(count, 1), size


@dataclasses.dataclass(frozen=True)
class Demand:
    """What the random-access part of a plan asks of its reader (read off its ops)."""

    asked: tuple[int, ...] = ()  # num_parallel_calls of its maps and batches
    ordered: bool = True  # False when one of them passed deterministic=False
    prefetch: tuple[int, ...] = ()  # buffer sizes of its prefetches
    elements_per_item: int = 1  # elements (as a map below the batches sees them) per item


def plan(demand: Demand, ds: Any, memo: dict) -> Parallelism:
    """How to read `ds`, a Grain MapDataset built for a plan's segment asking `demand`;
    `memo` (the segment's run-time memory) keeps the measured cost for the next reader."""
    asked, ordered, prefetch = list(demand.asked), demand.ordered, list(demand.prefetch)
    if not asked and not prefetch:
        return Parallelism()
    items = len(ds)
    cost = size = None
    if AUTOTUNE in asked or AUTOTUNE in prefetch:
        if "tuned" not in memo:
            memo["tuned"] = measure(ds)
        cost, size = memo["tuned"]
    explicit = [p for p in asked if p != AUTOTUNE]
    tuned = False
    if explicit:
        workers = max(explicit)
    elif asked:
        element_s = cost / demand.elements_per_item
        work_s = cost * items
        tuned = True
        workers = worker_count() if (usable_cores() > 1 and element_s >= WORKER_MIN_ELEMENT_S
                                     and work_s >= WORKER_MIN_WORK_S) else 0
    else:
        workers = 0
    workers = min(workers, max(items, 1))
    explicit_buffer = [p for p in prefetch if p != AUTOTUNE]
    depth = 2
    if cost:  # about BUFFER_S of work in flight per worker, within the memory budget
        depth = max(depth, min(MAX_DEPTH, math.ceil(BUFFER_S / max(cost, pool.CHUNK_S))))
    if explicit_buffer and workers:
        depth = max(depth, min(MAX_DEPTH, math.ceil(max(explicit_buffer) / workers)))
    if size and cost and workers:
        chunk_bytes = min(pool.CHUNK_BYTES, size * max(1, round(pool.CHUNK_S / cost)))
        depth = max(1, min(depth, MEMORY_BUDGET // (chunk_bytes * workers)))
    buffer = max(explicit_buffer) if explicit_buffer else min(
        8, max(2, math.ceil(BUFFER_S / max(cost or 0, 1e-6))))
    if size and not explicit_buffer:
        buffer = max(1, min(buffer, MEMORY_BUDGET // size))
    # In-process, one Grain thread computes ahead when prefetch asks for it explicitly, or
    # under AUTOTUNE when items are slow enough for the hand-off to pay.
    threads = 0
    if not workers and prefetch:
        threads = 1 if explicit_buffer or (cost or 0) >= THREAD_MIN_COST_S else 0
    return Parallelism(workers=workers, threads=threads, buffer=buffer, depth=depth,
                       ordered=ordered, tuned=tuned, item_s=cost, item_bytes=size or 0)
