"""RandomAccessStream: reads the random-access part of a plan, a Grain MapDataset, in index
order — in this process, in a Grain read thread, or in worker processes (podkit.data.pool)
that compute runs of it. Its state is the progress through the indices, which does not depend
on who computed them.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from podkit.data import autotune, pool, transfer
from podkit.data._grain import grain
from podkit.data.stream import Context, Stream
from podkit.errors import InputError


class RandomAccessStream(Stream):
    """Reads a Grain MapDataset in index order: in this process, or in worker processes
    (podkit.data.pool) that compute runs of it. The state is the progress through the
    indices, which does not depend on who computed them."""

    def __init__(self, ds: grain.MapDataset, ctx: Context, plan: autotune.Parallelism) -> None:
        self._ds = ds
        self._n = len(self._ds)
        self._ctx = ctx
        self._progress = pool.Progress()
        self._it: Any = None
        self.plan = plan
        if self.plan.workers:  # the server starts now; its first items are computed here
            pool.Server.get()

    def _open(self) -> None:
        p = self.plan
        todo = self._progress.todo(self._n)
        if p.workers:
            plan = self._portable()
            if plan is not None:
                workers = pool.WorkerPool(
                    plan, None, p.workers, depth=p.depth, ordered=p.ordered, item_s=p.item_s,
                    item_bytes=p.item_bytes, progress=self._progress)
                self._ctx.pools.append(workers)
                self._it = _WarmingUp(_Direct(self._ds, todo, self._progress), workers,
                                      self._progress, self._n)
                return
        if p.threads and len(todo) == 1:
            rest = self._ds[todo[0][0]:].to_iter_dataset(grain.ReadOptions(
                num_threads=p.threads, prefetch_buffer_size=p.buffer))
            self._it = _Counted(iter(rest), todo[0][0], self._progress)
            return
        self._it = _Direct(self._ds, todo, self._progress)

    def _portable(self) -> bytes | None:
        """The plan as bytes for the workers; None (after a warning) when AUTOTUNE chose
        workers for a pipeline that cannot travel, so it runs here as it would without."""
        try:
            return transfer.dumps_plan(self._ds)
        except Exception as e:  # pickling can fail in many ways
            cause = f"{type(e).__name__}: {e}"
        fix = ("Make the map function and what it uses picklable (module-level objects, "
               "no open files, locks or sockets; create those inside the function), or compute "
               "the pipeline in this process with num_parallel_calls=None.")
        if not self.plan.tuned:
            raise InputError(f"the pipeline cannot be sent to its input worker processes "
                             f"({cause}). {fix}")
        warnings.warn(f"pk.data: AUTOTUNE would compute this pipeline in worker processes, but "
                      f"it cannot be sent to them ({cause}); computing it in this process "
                      f"instead. {fix}", stacklevel=2)
        self.plan = dataclasses.replace(self.plan, workers=0, tuned=False)
        return None

    def next(self) -> Any:
        if self._it is None:
            if self._progress.low >= self._n:
                raise StopIteration
            self._open()
        return next(self._it)

    def get_state(self) -> dict:
        return self._progress.state()

    def set_state(self, state: dict) -> None:
        self.close()
        self._progress = pool.Progress(int(state["index"]), state.get("done", ()))

    def close(self) -> None:
        it, self._it = self._it, None
        if it is not None and hasattr(it, "close"):
            it.close()


class _Direct:
    """Sequential reads in this process: the cheapest reader for light pipelines."""

    def __init__(self, ds: grain.MapDataset, todo: list[tuple[int, int]],
                 progress: pool.Progress) -> None:
        self._ds, self._todo, self._progress = ds, list(todo), progress

    def __next__(self) -> Any:
        while self._todo and self._todo[0][0] >= self._todo[0][1]:
            self._todo.pop(0)
        if not self._todo:
            raise StopIteration
        i, stop = self._todo[0]
        item = self._ds[i]
        self._todo[0] = (i + 1, stop)
        self._progress.add(i)
        return item


class _WarmingUp:
    """Items from this process until a worker is ready, then from the workers: the first
    batches never wait for worker start-up, and the order is the same either way."""

    def __init__(self, here: _Direct, workers: pool.WorkerPool, progress: pool.Progress,
                 n: int) -> None:
        self._here, self._workers, self._progress, self._n = here, workers, progress, n
        self._begun = False

    def __next__(self) -> Any:
        if not self._begun and self._workers.started():
            self._workers.begin(self._progress.todo(self._n))
            self._begun = True
        return next(self._workers) if self._begun else next(self._here)

    def close(self) -> None:
        self._workers.close()


class _Counted:
    """A Grain iterator from index `start` on, recording progress as items are taken."""

    def __init__(self, it: Any, start: int, progress: pool.Progress) -> None:
        self._it, self._i, self._progress = it, start, progress

    def __next__(self) -> Any:
        item = next(self._it)
        self._progress.add(self._i)
        self._i += 1
        return item

    def close(self) -> None:
        if hasattr(self._it, "close"):
            self._it.close()
