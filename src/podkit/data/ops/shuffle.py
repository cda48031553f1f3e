"""shuffle: a seed-determined order, new on each iteration unless told otherwise.

With random access the order is a seeded permutation (window by window when the buffer is
smaller than the dataset); as a stream it is tf.data's buffer shuffle. The seed is part of the
plan; a drawn one (seed=None) is drawn once when the node is made, and a plan with other seeds
is a new plan (Node.with_shuffle_seeds), never this one changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np

from podkit.data.ops.base import Node, PassesBatches, SplitsBelow, Unary
from podkit.data.stream import Context, Replaying, Stream

if TYPE_CHECKING:
    from podkit.data._grain import grain


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Shuffle(PassesBatches, SplitsBelow, Unary):
    buffer: int
    seed: int
    auto_seed: bool = False  # drawn, not given: left out of the fingerprint
    reshuffle: bool = True
    name = "shuffle"
    keeps_random_access = True

    def describe_args(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "seed": None if self.auto_seed else self.seed,
                "auto_seed": self.auto_seed, "reshuffle": self.reshuffle}

    def shuffle_seed(self) -> int | None:
        return self.seed

    def with_shuffle_seed(self, seed: int) -> Node:
        return dataclasses.replace(self, seed=int(seed))

    def varies(self) -> bool:
        return self.reshuffle or super().varies()

    def _path_seed(self, path: tuple[int, ...]) -> int:
        return derive_seed(self.seed, path if self.reshuffle else ())

    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        from podkit.data import random_access  # Grain loads with the first build (_grain.py)

        seed = self._path_seed(path)
        parent = self.parent.build(ctx, path)
        n = len(parent)
        if n == 0:
            return parent
        return random_access.Remap(parent, n,
                                   random_access.Permutation(seed, n, self.buffer))

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        seed = self._path_seed(path)
        return ShuffleStream(self.parent.stream(ctx, path), self.buffer, seed)


def derive_seed(seed: int, path: tuple[int, ...]) -> int:
    """The seed of one iteration path: each iteration (and repetition) reshuffles."""
    return int(np.random.SeedSequence([seed, *path]).generate_state(1)[0] >> 1)


class ShuffleStream(Replaying):
    """tf.data's buffer shuffle: fill `buffer` elements, emit a random one, refill."""

    def __init__(self, parent: Stream, buffer: int, seed: int) -> None:
        self._size, self._seed = buffer, seed
        super().__init__(parent)

    def _reset(self) -> None:
        self._buf: list = []
        self._done = False
        self._rng = np.random.default_rng([self._seed, *self._mark_key()])

    def _mark_key(self) -> list[int]:
        # The random stream restarts at each mark, keyed by where the mark is.
        digest = hashlib.sha256(repr(self._mark).encode()).digest()
        return [int.from_bytes(digest[:8], "little")]

    def _buffer_empty(self) -> bool:
        return not self._buf and self._done

    def _produce(self) -> Any:
        while not self._done and len(self._buf) < self._size:
            try:
                self._buf.append(self._parent.next())
            except StopIteration:
                self._done = True
        if not self._buf:
            raise StopIteration
        i = int(self._rng.integers(len(self._buf)))
        self._buf[i], self._buf[-1] = self._buf[-1], self._buf[i]
        return self._buf.pop()


