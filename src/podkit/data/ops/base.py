"""Node: one transformation of a plan, frozen, answering for itself.

A plan is a tree of nodes (a DAG when a dataset is used twice). Each op class says what it
does: its cardinality, whether its elements keep random access and how (build), how it runs as
a stream, how it splits across processes (for_process) and how it is described (the
fingerprint). Nothing dispatches on an op's name.

Nodes are frozen dataclasses: nothing is written into a plan after it is built. What a node
learns while running (a cache's contents, the measured cost of its elements, how many
iterations were handed out) lives in its Runtime, which is not part of the plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from podkit.data import batching, sources, structure
from podkit.data.constants import AUTOTUNE
from podkit.data.functions import fn_name
from podkit.data.stream import Context, Stream
from podkit.errors import InputError

if TYPE_CHECKING:
    from podkit.data import autotune
    from podkit.data._grain import grain


class Runtime:
    """A node's run-time memory: iterations handed out (each is a new epoch for shuffles)
    and values computed once (cache contents, measured costs, the element spec)."""

    def __init__(self) -> None:
        self.iterations = 0
        self.memo: dict[str, Any] = {}

    def next_iteration(self) -> int:
        self.iterations += 1
        return self.iterations - 1


def show(value: Any) -> str:
    """An argument as the fingerprint spells it: functions by name, sources by their shape."""
    if callable(value) and not isinstance(value, batching.Stack | batching.Pad):
        return fn_name(value)
    if isinstance(value, sources.Slices):
        return f"slices{structure.describe(value.tensors)}"
    if isinstance(value, sources.TextLines):
        return f"text{value.files}"
    if isinstance(value, batching.Pad):
        return f"pad({value.padded_shapes!r},{value.padding_values!r})"
    if isinstance(value, batching.Stack):
        return "stack"
    if hasattr(value, "__len__") and not isinstance(value, str | list | tuple | dict):
        return f"{type(value).__name__}[{len(value)}]"
    return repr(value)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Node:
    """Base of every op. Subclasses are frozen dataclasses whose fields are the op's
    arguments (and parents); they override what differs from the defaults here."""

    name: ClassVar[str] = ""  # the tf.data verb, as the fingerprint and errors spell it
    keeps_random_access: ClassVar[bool] = False  # when every parent has random access
    materialized: ClassVar[bool] = False  # random access whatever the parents (cache)

    runtime: Runtime = dataclasses.field(default_factory=Runtime, init=False)
    random_access: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "random_access", self.materialized or (
            self.keeps_random_access and all(p.random_access for p in self.parents)))

    # -- the plan ----------------------------------------------------------------------------
    @property
    def parents(self) -> tuple[Node, ...]:
        return ()

    def with_parents(self, parents: Sequence[Node]) -> Node:
        """This op over other parents (a new node; this one is unchanged)."""
        return self

    def walk(self) -> list[Node]:
        """Nodes in a fixed depth-first order (parents first); a shared node appears once per
        use. Positions in this order key the shuffle seeds."""
        out: list[Node] = []

        def visit(node: Node) -> None:
            for p in node.parents:
                visit(p)
            out.append(node)
        visit(self)
        return out

    def describe_args(self) -> dict[str, Any]:
        """The op's arguments as the fingerprint records them."""
        return {}

    def describe(self) -> str:
        args = self.describe_args()
        return f"{self.name}({', '.join(f'{k}={show(v)}' for k, v in sorted(args.items()))})|"

    def fingerprint(self) -> str:
        """Identifies the plan's structure and arguments (not drawn seeds)."""
        h = hashlib.sha256()
        for node in self.walk():
            h.update(node.describe().encode())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    # -- seeds -------------------------------------------------------------------------------
    def shuffle_seed(self) -> int | None:
        """The seed of a shuffle; None for every other op."""
        return None

    def with_shuffle_seed(self, seed: int) -> Node:
        return self

    def shuffle_seeds(self) -> list[int]:
        """The seeds of the plan's shuffles, in plan order (drawn ones included)."""
        return [s for s in (n.shuffle_seed() for n in self.walk()) if s is not None]

    def with_shuffle_seeds(self, seeds: Sequence[int]) -> Node:
        """The same plan with these shuffle seeds (plan order); nodes whose seeds and parents
        are unchanged are reused, so their run-time memory (a cache's contents) is kept."""
        given = [int(s) for s in seeds]
        if len(given) != len(self.shuffle_seeds()):
            raise InputError(f"the plan has {len(self.shuffle_seeds())} shuffles but "
                             f"{len(given)} seeds were given.")
        todo: Iterator[int] = iter(given)

        def rebuild(node: Node) -> Node:
            parents = [rebuild(p) for p in node.parents]
            if any(new is not old for new, old in zip(parents, node.parents, strict=True)):
                node = node.with_parents(parents)
            if node.shuffle_seed() is not None:
                seed = next(todo)
                if seed != node.shuffle_seed():
                    node = node.with_shuffle_seed(seed)
            return node
        return rebuild(self)

    # -- what it holds -----------------------------------------------------------------------
    def cardinality(self) -> int:
        raise NotImplementedError(type(self).__name__)

    def batch_dim_varies(self) -> bool:
        """Whether the leading dim of its elements varies: a batch() that keeps its remainder,
        seen through the ops that pass batches on unchanged."""
        return False

    def element_spec(self, first: Any) -> Any:
        """TensorSpec per leaf of `first` (an element of this node), None where a size
        varies."""
        spec = structure.spec_of(first)
        if self.batch_dim_varies():
            spec = structure.map_structure(
                lambda s: structure.TensorSpec((None, *s.shape[1:]), s.dtype), spec)
        return spec

    def varies(self) -> bool:
        """Whether its elements depend on the iteration path (a reshuffling shuffle below)."""
        memo = self.runtime.memo
        if "varies" not in memo:
            memo["varies"] = any(p.varies() for p in self.parents)
        return memo["varies"]

    def for_process(self, num_processes: int, index: int) -> Node:
        """This process's share, for fit(): see Dataset.for_process."""
        raise InputError(
            f"fit() shards a dataset across processes below its last batch(), but found "
            f"{self.name}() above it (or no batch at all); batch the dataset last, e.g. "
            "ds.map(...).batch(global_batch_size).prefetch(AUTOTUNE).")

    # -- how it runs -------------------------------------------------------------------------
    def build(self, ctx: Context, path: tuple[int, ...]) -> grain.MapDataset:
        """The random-access form (for a node with random_access): a Grain MapDataset whose
        element i is a pure function of i and `path` (the iteration, then repetitions)."""
        raise NotImplementedError(type(self).__name__)

    def own_stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        """The op as a stream over its parents' streams (for a node without random access)."""
        raise NotImplementedError(type(self).__name__)

    def stream(self, ctx: Context, path: tuple[int, ...]) -> Stream:
        """The node's elements, read in order and resumable."""
        if not self.random_access:
            return self.own_stream(ctx, path)
        # Grain, and the worker pool under the reader, load with the first random-access read.
        from podkit.data import autotune
        from podkit.data.reader import RandomAccessStream

        ds = self.build(ctx, path)
        plan = autotune.Parallelism() if ctx.nested or not ctx.workers else autotune.plan(
            self.demand(), ds, self.runtime.memo)
        return RandomAccessStream(ds, ctx, plan)

    # -- what it asks of its reader ------------------------------------------------------------
    def parallel_calls(self) -> int | None:
        """num_parallel_calls of a map or batch: computed in worker processes."""
        return None

    def reorders(self) -> bool:
        """Whether it lets parallel elements come as they finish (deterministic=False)."""
        return False

    def prefetch_buffer(self) -> int | None:
        return None

    def batch_size(self) -> int | None:
        return None

    def segment(self) -> list[Node]:
        """The random-access nodes one reader computes (not through a materialized cache)."""
        out, todo = [], [self]
        while todo:
            n = todo.pop()
            out.append(n)
            if not n.materialized:
                todo.extend(p for p in n.parents if p.random_access)
        return out

    def elements_per_item(self) -> int:
        """How many elements (as a map below the batches sees them) one item holds."""
        count, node = 1, self
        while node.parents and not node.materialized:
            count *= node.batch_size() or 1
            node = node.parents[0]
        return count

    def demand(self) -> autotune.Demand:
        from podkit.data import autotune

        segment = self.segment()
        parallel = [n for n in segment if n.parallel_calls() is not None]
        return autotune.Demand(
            asked=tuple(n.parallel_calls() for n in parallel),  # type: ignore[misc]
            ordered=not any(n.reorders() for n in parallel),
            prefetch=tuple(b for b in (n.prefetch_buffer() for n in segment) if b is not None),
            elements_per_item=self.elements_per_item())

    def asks_for_workers(self, whole_plan: bool = False, explicitly: bool = False) -> bool:
        """Whether the reader may start workers: num_parallel_calls set in its random-access
        part (or anywhere in the plan); `explicitly`: set to a number, which starts workers
        whatever the cost (AUTOTUNE decides later, from the cost)."""
        nodes = self.walk() if whole_plan else self.segment()
        asked = [n.parallel_calls() for n in nodes if n.parallel_calls() is not None]
        return any(a != AUTOTUNE for a in asked) if explicitly else bool(asked)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Unary(Node):
    """An op over one parent."""

    parent: Node

    @property
    def parents(self) -> tuple[Node, ...]:
        return (self.parent,)

    def with_parents(self, parents: Sequence[Node]) -> Node:
        (parent,) = parents
        return dataclasses.replace(self, parent=parent)

    def cardinality(self) -> int:
        return self.parent.cardinality()


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Nary(Node):
    """An op over several parents, `inputs`, in order (zip, concatenate)."""

    inputs: tuple[Node, ...]

    @property
    def parents(self) -> tuple[Node, ...]:
        return self.inputs

    def with_parents(self, parents: Sequence[Node]) -> Node:
        return dataclasses.replace(self, inputs=tuple(parents))


class PassesBatches:
    """Mixin of the ops that hand their parent's batches on unchanged (prefetch, take, skip,
    shard, repeat, shuffle, cache): a batch below still shapes their elements."""

    parent: Node

    def batch_dim_varies(self) -> bool:
        return self.parent.batch_dim_varies()

    def element_spec(self, first: Any) -> Any:
        # their elements are the parent's: so is the spec (padded_batch's None dims included)
        return self.parent.element_spec(first)


class SplitsBelow:
    """Mixin of the ops fit() can split below them: the share of each process is the op over
    the parent's share (map, prefetch, take, skip, repeat, shuffle, enumerate, cache)."""

    parent: Node

    def for_process(self, num_processes: int, index: int) -> Node:
        return self.with_parents(  # type: ignore[attr-defined]
            [self.parent.for_process(num_processes, index)])


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Counted(PassesBatches, SplitsBelow, Unary):
    """An op over the first `count` elements of its parent (-1: all of them): take keeps
    them, skip drops them. Either hands batches on and splits below it."""

    count: int

    def describe_args(self) -> dict[str, Any]:
        return {"count": self.count}
