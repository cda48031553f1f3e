"""One class per transformation (or family), each answering for itself; see ops/base.py."""

from podkit.data.ops.base import Node, Runtime
from podkit.data.ops.batch import Batch, Bucket, Unbatch
from podkit.data.ops.cache import Cache
from podkit.data.ops.combine import Concatenate, Zip
from podkit.data.ops.interleave import Interleave
from podkit.data.ops.map import Filter, Map
from podkit.data.ops.prefetch import Prefetch
from podkit.data.ops.repeat import Repeat
from podkit.data.ops.shuffle import Shuffle
from podkit.data.ops.slicing import Enumerate, Shard, Skip, Take
from podkit.data.ops.source import CompressedText, Generator, Source

__all__ = [
    "Batch", "Bucket", "Cache", "CompressedText", "Concatenate", "Enumerate", "Filter",
    "Generator", "Interleave", "Map", "Node", "Prefetch", "Repeat", "Runtime", "Shard",
    "Shuffle", "Skip", "Source", "Take", "Unbatch", "Zip",
]
