"""Feeds: the one place where fit()/evaluate()/predict() arguments become device inputs.

`make_feed(x, y, ...)` (factory.py) takes what a Keras user passes — arrays (or lists, dicts
and tuples of them), a pk.data.Dataset, any iterable of (x, y[, sample_weight]) batches — and
returns a `Feed` (protocol.py) whose `epoch(i)` yields `Execution`s for the compiled steps
(podkit.train.step says their two forms). The model never looks inside its input; the feed
never looks inside the model: the model hands it a `check(x, y)` that refuses data the model
cannot take. Shaped like Keras's data adapters, one module per kind of input:

  arrays.py     `ArrayFeed`: in-memory arrays, and Keras's conversions and checks of them
                (lists, dtypes, class weights, the global batch)
  in_memory.py  `InMemoryDatasetFeed`: a Dataset that only reorders and batches arrays, fed
                like arrays, in the Dataset's own order
  batches.py    `BatchFeed`: any iterable of batches, local to this process
  datasets.py   a Dataset cut to this process's share for BatchFeed (`dataset_input`)
  staging.py    `StagingCache`: arrays kept on the devices across calls while unchanged
  prefetch.py   the thread that places the next executions while the current one runs
  placement.py  host arrays -> global jax.Arrays on any process count
  position.py   `DataPosition`: how far the input has been read, as checkpoints store it
  inputs.py     `BatchInputs` / `StagedInputs`: what an execution hands the compiled step
"""

from podkit.train.feeds.arrays import ArrayFeed, as_arrays, class_weights, global_batch, is_arrays
from podkit.train.feeds.batches import BatchFeed
from podkit.train.feeds.datasets import dataset_input
from podkit.train.feeds.factory import make_feed
from podkit.train.feeds.in_memory import InMemoryDatasetFeed
from podkit.train.feeds.inputs import BatchInputs, StagedInputs, StepInputs
from podkit.train.feeds.position import DataPosition
from podkit.train.feeds.prefetch import prefetch
from podkit.train.feeds.protocol import Check, Execution, Feed
from podkit.train.feeds.staging import DEFAULT_STAGE_BYTES, StagingCache, fingerprint

__all__ = ["DEFAULT_STAGE_BYTES", "ArrayFeed", "BatchFeed", "BatchInputs", "Check", "DataPosition",
           "Execution", "Feed", "InMemoryDatasetFeed", "StagedInputs", "StagingCache",
           "StepInputs", "as_arrays", "class_weights", "dataset_input", "fingerprint",
           "global_batch", "is_arrays", "make_feed", "prefetch"]
