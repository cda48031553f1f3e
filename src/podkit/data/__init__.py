"""podkit.data: tf.data's Dataset API on Grain — parallel, autotuned, exactly resumable.

    ds = (pk.data.Dataset.from_tensor_slices((x, y))
          .shuffle(10_000).map(augment, num_parallel_calls=pk.data.AUTOTUNE)
          .batch(256).prefetch(pk.data.AUTOTUNE))
    model.fit(ds, epochs=3)
"""

from podkit.data.dataset import (
    AUTOTUNE,
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    ArrayRecordDataset,
    Dataset,
    InMemoryPlan,
    TextLineDataset,
    TFRecordDataset,
)
from podkit.data.sources import write_array_record
from podkit.data.structure import TensorSpec

__all__ = [
    "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "ArrayRecordDataset", "Dataset",
    "DatasetIterator", "InMemoryPlan", "IteratorStats", "TensorSpec", "TextLineDataset",
    "TFRecordDataset",
    "write_array_record",
]


def __getattr__(name: str) -> object:
    # The iterator pulls in Grain; load it when first asked for, not at `import podkit`.
    if name in ("DatasetIterator", "IteratorStats"):
        from podkit.data import iterator

        return getattr(iterator, name)
    raise AttributeError(f"module 'podkit.data' has no attribute {name!r}")
