"""AUTOTUNE: choose worker processes and buffer sizes from measured rates.

The first elements of the random-access part are timed in this process. Elements that take
milliseconds of Python each are worth shipping from worker processes (one per usable core);
cheap ones are not, since the hand-off itself costs tens of microseconds per element. Buffers
hold about 0.1 s of output per worker, within a memory budget.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data import structure
from podkit.data.dataset import AUTOTUNE

if TYPE_CHECKING:
    from podkit.data.dataset import Dataset
    from podkit.data.stream import Parallelism

PROBE_S = 0.25  # time spent measuring, once per pipeline
WORKER_MIN_COST_S = 0.002  # below this per element, workers cost more than they give
THREAD_MIN_COST_S = 0.0002  # below this, a prefetch thread's hand-off costs more than it saves
BUFFER_S = 0.1
MEMORY_BUDGET = 256 << 20


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _segment(node: Dataset) -> list[Dataset]:
    """The random-access nodes that one reader computes (not through a materialized cache)."""
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        out.append(n)
        if n._op != "cache":
            todo.extend(p for p in n._parents if p._random_access)
    return out


def _nbytes(tree: Any) -> int:
    return sum(np.asarray(x).nbytes if not isinstance(x, bytes) else len(x)
               for x in structure.leaves(tree))


def measure(ds: Any) -> tuple[float, int]:
    """Seconds and bytes per element of a Grain MapDataset, from its first elements."""
    n = min(len(ds), 64)
    start, count, size = time.perf_counter(), 0, 0
    while count < n and (count < 2 or time.perf_counter() - start < PROBE_S):
        size = max(size, _nbytes(ds[count]))
        count += 1
    return (time.perf_counter() - start) / max(count, 1), size


def plan(node: Dataset, ds: Any) -> Parallelism:
    from podkit.data.stream import Parallelism

    segment = _segment(node)
    asked = [n._args["parallel"] for n in segment if n._op == "map"
             and n._args["parallel"] not in (None, 1)]
    prefetch = [n._args["buffer"] for n in segment if n._op == "prefetch"]
    if not asked and not prefetch:
        return Parallelism()
    if AUTOTUNE in asked or AUTOTUNE in prefetch:
        if "tuned" not in node._memo:
            node._memo["tuned"] = measure(ds)
        cost, size = node._memo["tuned"]
    else:
        cost, size = WORKER_MIN_COST_S, 0
    explicit = [p for p in asked if p != AUTOTUNE]
    if explicit:
        workers = max(explicit)
    elif asked:
        workers = usable_cores() if cost >= WORKER_MIN_COST_S and usable_cores() > 1 else 0
    else:
        workers = 0
    workers = min(workers, max(len(ds), 1))
    explicit_buffer = [p for p in prefetch if p != AUTOTUNE]
    if explicit_buffer:
        buffer = max(explicit_buffer)
    else:
        buffer = min(8, max(2, math.ceil(BUFFER_S / max(cost, 1e-6))))
        if size:
            buffer = max(1, min(buffer, MEMORY_BUDGET // (size * max(workers, 1))))
    # In-process, one Grain thread computes ahead when prefetch asks for it explicitly, or
    # under AUTOTUNE when elements are slow enough for the hand-off to pay.
    threads = 0
    if not workers and prefetch:
        threads = 1 if explicit_buffer or cost >= THREAD_MIN_COST_S else 0
    return Parallelism(workers=workers, threads=threads, buffer=buffer)
