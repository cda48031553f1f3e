"""podkit.data: tf.data's Dataset API on Grain — parallel, autotuned, exactly resumable.

    ds = (pk.data.Dataset.from_tensor_slices((x, y))
          .shuffle(10_000).map(augment, num_parallel_calls=pk.data.AUTOTUNE)
          .batch(256).prefetch(pk.data.AUTOTUNE))
    model.fit(ds, epochs=3)
"""

from absl import flags as _flags

# Grain reads absl flags; a program that did not run absl.app has not parsed them.
if not _flags.FLAGS.is_parsed():
    _flags.FLAGS.mark_as_parsed()

from podkit.data.dataset import (  # noqa: E402
    AUTOTUNE,
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    ArrayRecordDataset,
    Dataset,
    TextLineDataset,
)
from podkit.data.iterator import DatasetIterator, IteratorStats  # noqa: E402
from podkit.data.sources import write_array_record  # noqa: E402
from podkit.data.structure import TensorSpec  # noqa: E402

__all__ = [
    "AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY", "ArrayRecordDataset", "Dataset",
    "DatasetIterator", "IteratorStats", "TensorSpec", "TextLineDataset", "write_array_record",
]
