"""The numbers tf.data puts in place of AUTOTUNE where the number decides the elements' order.

tf.data turns `cycle_length=AUTOTUNE` (and `None`, its default) into a number when the dataset
is made, from the cores the process may run on (`port::MaxParallelism()`, which is
`sched_getaffinity`'s count on Linux and the processor count elsewhere), and the number is
the interleave's order: elements come `block_length` at a time from that many open datasets.
podkit resolves the same way, from the same source, when its dataset is made, so that a
pipeline gives TensorFlow's order on the machine it runs on (tests/test_data_tf.py compares
them live). Numbers that only change speed (map's workers, prefetch buffers) are autotune.py's.
"""

from __future__ import annotations

import os

from podkit.data.constants import AUTOTUNE

# tensorflow/core/kernels/data/parallel_interleave_dataset_op.cc: each open dataset of a
# parallel interleave is read by one thread and `kDefaultCyclePrefetchFactor` (2) more open
# the next inputs ahead, so an autotuned cycle keeps ~one thread per core.
THREADS_PER_CYCLE_ELEMENT = 3


def schedulable_cores() -> int:
    """The cores this process may run on, as TensorFlow counts them (`NumSchedulableCPUs`:
    the affinity mask's count on Linux, so `taskset` and container CPU sets count; the
    processor count where there is no affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux: TF asks std::thread::hardware_concurrency()
        return os.cpu_count() or 1


def interleave_cycle(cycle_length: int | None, num_parallel_calls: int | None) -> int:
    """interleave's cycle length as tf.data 2.21 resolves it when the dataset is made.

    An explicit cycle_length is itself. AUTOTUNE (or None): without num_parallel_calls, the
    schedulable cores (InterleaveDatasetOp); with num_parallel_calls=k, min(k, cores); with
    num_parallel_calls=AUTOTUNE, ceil(cores / 3) (ParallelInterleaveDatasetOp's
    ComputeCycleLength). TFRecordDataset(num_parallel_reads=AUTOTUNE) is such an interleave
    with both AUTOTUNE, so on a 2-core machine it reads its files one after the other.
    """
    if cycle_length is not None and cycle_length != AUTOTUNE:
        return int(cycle_length)
    cores = schedulable_cores()
    if num_parallel_calls is None:
        return cores
    if num_parallel_calls != AUTOTUNE:
        return min(int(num_parallel_calls), cores)
    return -(-cores // THREADS_PER_CYCLE_ELEMENT)
