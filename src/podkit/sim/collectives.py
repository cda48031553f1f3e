"""Closed-form costs of collectives, and where a mesh's axes land on a pod's links.

    pod = hardware.pod("tpu-v4:128")                        # 4x4x8, every dim wrapped
    gs = collectives.groups(pod, {"data": 8, "fsdp": 16})   # per mesh axis: its physical dims
    collectives.collective_time("all-reduce", 2e9, gs["fsdp"])        # Cost(latency_s, bandwidth_s)
    collectives.collective_time("all-reduce", 2e9, collectives.group(pod, mesh, "data", "fsdp"))

Sizes: `nbytes` is the full array per device: an all-reduce's operand, an all-gather's gathered
output, a reduce-scatter's input before scattering, the array each device holds for an
all-to-all, the array each device sends for a collective-permute. Bandwidths are per link (TPU)
or per device (GPU, CPU) in one direction, latencies per step.

The models (derivations in each function; the standard forms, as in the JAX scaling book's
"How to Scale Your Model" and NCCL's performance notes, where bus bandwidth = algorithm
bandwidth x 2(n-1)/n for an all-reduce and x (n-1)/n for the others):

- a ring of n (one direction): n-1 steps of B/n per link for a reduce-scatter or all-gather,
  twice that for an all-reduce; a bidirectional ring sends half each way (B/2n a step);
- a dimension without wraparound is a line: the same n-1 steps of B/n per link (each device
  forwards both ways), half the bandwidth of a wrapped bidirectional ring;
- a group over several torus dimensions splits the data in k parts, one per dimension, each
  part going through the dimensions in a rotated order, so every phase keeps all the group's
  links busy (the scaling book's "bytes / (bidirectional bandwidth x axes)");
- an all-to-all routes every device's B/n to each other device along the dimensions in order,
  the shortest way round: the busiest link sets the time;
- GPUs: inside an NVLink domain a ring over NVLink; across domains the hierarchical algorithm:
  reduce-scatter inside, all-reduce across domains on 1/local of the data (each GPU on its own
  NIC), all-gather inside.

A mesh axis lands on physical dimensions as `jax.experimental.mesh_utils.create_device_mesh`
lays it on a TPU slice (`assign_axes`, a port of `_create_device_mesh_for_nd_torus`, with the
splitting of a physical dimension that `jax.make_mesh` allows on v5e); on GPUs and CPUs devices
are in id order, the last mesh axis fastest.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence

from podkit.errors import ConfigError
from podkit.sim.hardware import Pod
from podkit.strategy import DCN  # the mesh axis over a multislice pod's slices

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_ALIASES = {k.replace("-", ""): k for k in KINDS} | {"permute": "collective-permute"}


@dataclasses.dataclass(frozen=True)
class Cost:
    """A collective's time as a latency term (steps x per-step latency) and a bandwidth term
    (bytes over the busiest link)."""

    latency_s: float = 0.0
    bandwidth_s: float = 0.0

    @property
    def total(self) -> float:
        return self.latency_s + self.bandwidth_s

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.latency_s + other.latency_s, self.bandwidth_s + other.bandwidth_s)

    def __radd__(self, other: Cost | int) -> Cost:  # sum(costs) starts from 0
        return self if other == 0 else self + other  # type: ignore[operator]

    def __mul__(self, times: float) -> Cost:  # the same collective `times` over
        return Cost(self.latency_s * times, self.bandwidth_s * times)

    __rmul__ = __mul__


ZERO = Cost()


@dataclasses.dataclass(frozen=True)
class TorusDim:
    """The part of one physical torus dimension a group spans: `size` members, `stride`
    physical hops apart (a mesh axis that shares a physical dimension with another takes every
    stride-th chip; the stride groups interleaved on a line share its links)."""

    dim: int  # the physical dimension
    size: int
    stride: int
    length: int  # the physical dimension's length
    wrap: bool  # the physical dimension has wraparound links
    bandwidth: float  # per link, one direction
    latency: float  # per hop

    @property
    def ring(self) -> bool:
        """The members close a ring through the wraparound link; otherwise they sit on a line."""
        return self.wrap and self.size * self.stride == self.length and self.length > 2

    @property
    def step_bandwidth(self) -> float:
        return self.bandwidth / self.stride  # `stride` interleaved groups share every link

    @property
    def step_latency(self) -> float:
        return self.latency * self.stride  # a step crosses `stride` links


@dataclasses.dataclass(frozen=True)
class Tier:
    """One level of a switched fabric: `size` members of the group, each with `bandwidth`."""

    size: int
    bandwidth: float  # per device, one direction
    latency: float  # per step


@dataclasses.dataclass(frozen=True)
class Group:
    """The devices a collective runs over, as the links see them: torus `dims` (TPU) or
    switched `tiers` (GPU, CPU: inside a domain, then across domains)."""

    axes: tuple[str, ...]
    size: int
    dims: tuple[TorusDim, ...] = ()
    tiers: tuple[Tier, ...] = ()
    dcn: Tier | None = None  # multislice: the slices the group spans, over the DCN

    @property
    def fabric(self) -> str:
        inner = "torus" if self.dims else "switched" if self.tiers else "none"
        return inner if self.dcn is None else f"{inner}+dcn"


def ring_group(n: int, bandwidth: float, latency: float, wrap: bool = True) -> Group:
    """A group of n devices on one torus dimension of length n (a ring, or a line)."""
    return Group(("ring",), n, (TorusDim(0, n, 1, n, wrap, bandwidth, latency),) if n > 1 else ())


# -- closed forms ----------------------------------------------------------------------------


def canonical_kind(kind: str) -> str:
    """all-reduce, all_reduce, AllReduce -> all-reduce; ConfigError listing the kinds."""
    key = str(kind).strip().lower().replace("_", "").replace("-", "")
    if key not in _ALIASES:
        raise ConfigError(f"unknown collective {kind!r}; valid: {', '.join(KINDS)}.")
    return _ALIASES[key]


def _check_bytes(nbytes: float) -> float:
    if not isinstance(nbytes, (int, float)) or not math.isfinite(nbytes) or nbytes < 0:
        raise ConfigError(f"collective size nbytes={nbytes!r} must be a finite number of bytes "
                          ">= 0 (the full array per device).")
    return float(nbytes)


def ring_cost(kind: str, nbytes: float, n: int, bandwidth: float, latency: float,
              bidirectional: bool = False) -> Cost:
    """A ring of n devices, `bandwidth` per link one way, `latency` per step.

    One direction: a reduce-scatter (or all-gather) is n-1 steps in which every device passes
    a 1/n chunk to its neighbour: (n-1)(latency + B/(n bw)); an all-reduce is both, twice
    that: 2(n-1)/n B/bw + 2(n-1) latency (NCCL's bus bandwidth: B/t x 2(n-1)/n). An
    all-to-all sends B/n from every device to every other: n(n-1)/2 such flows cross each link,
    (n-1) B/2 bytes, over n-1 hops. A collective-permute is one hop of B.

    Bidirectional: the data splits in two halves, one round each way, so each link direction
    carries B/2n a step: half the bandwidth term. An all-to-all goes the shortest way round:
    floor(n^2/4)/2 flows of B/n cross each link direction (n^2/8 for even n), over floor(n/2)
    hops (the scaling book: a quarter of an all-gather's time). A ring of 2 (every second chip
    of a wrapped dimension of 4) reaches its peer both ways round, so a permute halves too.
    """
    kind, b = canonical_kind(kind), _check_bytes(nbytes)
    if n <= 1:
        return ZERO
    if kind == "collective-permute":  # a ring of 2 reaches its peer both ways round
        return Cost(latency, b / bandwidth / (2 if bidirectional and n == 2 else 1))
    if kind == "all-to-all":
        if bidirectional:
            return Cost((n // 2) * latency, (n * n // 4) / 2 * b / (n * bandwidth))
        return Cost((n - 1) * latency, (n - 1) * b / (2 * bandwidth))
    steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    chunk = b / n / (2 if bidirectional else 1)
    return Cost(steps * latency, steps * chunk / bandwidth)


def line_cost(kind: str, nbytes: float, n: int, bandwidth: float, latency: float) -> Cost:
    """n devices on a line (a torus dimension without wraparound).

    A reduce-scatter or all-gather forwards chunks both ways along the line: n-1 steps, each
    link direction carrying one B/n chunk a step, (n-1)(latency + B/(n bw)) - a one-way
    ring's time, half a wrapped bidirectional ring's bandwidth. An all-reduce is both. An
    all-to-all's busiest link is the middle one: floor(n/2) ceil(n/2) flows of B/n, n-1 hops.
    A collective-permute (a cyclic shift) sends the last device's B back across the line.
    """
    kind, b = canonical_kind(kind), _check_bytes(nbytes)
    if n <= 1:
        return ZERO
    if kind == "collective-permute":
        return Cost((n - 1) * latency, b / bandwidth)
    if kind == "all-to-all":
        return Cost((n - 1) * latency, (n * n // 4) * b / (n * bandwidth))
    steps = 2 * (n - 1) if kind == "all-reduce" else n - 1
    return Cost(steps * latency, steps * b / (n * bandwidth))


def dim_cost(kind: str, nbytes: float, d: TorusDim) -> Cost:
    """One torus dimension: a bidirectional ring where it wraps, else a line."""
    if d.ring:
        return ring_cost(kind, nbytes, d.size, d.step_bandwidth, d.step_latency, True)
    return line_cost(kind, nbytes, d.size, d.step_bandwidth, d.step_latency)


def torus_cost(kind: str, nbytes: float, dims: Sequence[TorusDim]) -> Cost:
    """A group over several torus dimensions.

    Reduce-scatter, all-gather, all-reduce: k parts of B/k, part p taking the dimensions in
    the order p, p+1, ... (mod k), the data shrinking by each dimension's size (growing, for an
    all-gather); in every phase the parts use different dimensions, so all links work at once.
    The cost is the slowest part's (equal dimensions: all parts alike), or, on unequal
    dimensions where the parts meet on the long one, that dimension's total load. All-to-all:
    routed
    dimension by dimension, the busiest link of each dimension carries its 1D load of the whole
    B (every flow crosses each dimension once), all dimensions at once: the largest of the
    per-dimension bandwidth terms, the sum of their hop counts. Collective-permute: a cyclic
    shift along the innermost dimension.
    """
    kind, b = canonical_kind(kind), _check_bytes(nbytes)
    dims = [d for d in dims if d.size > 1]
    if not dims:
        return ZERO
    if len(dims) == 1:
        return dim_cost(kind, b, dims[0])
    if kind == "collective-permute":
        return dim_cost(kind, b, dims[-1])
    if kind == "all-to-all":
        per = [dim_cost(kind, b, d) for d in dims]
        return Cost(sum(c.latency_s for c in per), max(c.bandwidth_s for c in per))
    k, worst = len(dims), ZERO
    load = [0.0] * k  # each dimension's busy time, summed over the parts that pass through it
    phase_kind = "reduce-scatter" if kind == "all-reduce" else kind
    for p in range(k):
        data, part = b / k, ZERO
        for j in range(k):
            phase = dim_cost(phase_kind, data, dims[(p + j) % k])
            load[(p + j) % k] += phase.bandwidth_s
            part = part + phase
            data /= dims[(p + j) % k].size
        if part.total > worst.total:
            worst = part
    # Unequal dimensions: the parts reach a dimension at different times and share its links;
    # no schedule beats that dimension's total load (equal dimensions: it equals each part's).
    worst = Cost(worst.latency_s, max(worst.bandwidth_s, max(load)))
    return worst + worst if kind == "all-reduce" else worst  # the all-gather retraces it


def switched_cost(kind: str, nbytes: float, tiers: Sequence[Tier]) -> Cost:
    """A switched fabric: `tiers[0]` = the group's members inside one domain (NVLink, or one
    process's devices), `tiers[1]` = the domains it spans (InfiniBand, gloo), each device on its
    own link.

    Inside one domain: a ring (the switch connects every pair at full per-GPU bandwidth).
    Across domains, hierarchically: reduce-scatter inside ((L-1)/L B over the domain link),
    all-reduce across the m domains on B/L (each of the L devices on its own NIC, in parallel),
    all-gather inside: 2(L-1)/L B/bw_domain + 2(m-1)/m B/L/bw_net, 2(L-1) + 2(m-1) steps (or,
    across more than 2 domains, NCCL's tree where it is cheaper: `tree_cost`). An
    all-gather (reduce-scatter) is the second (first) half of that. An all-to-all sends
    (L-1)/n of B inside and (n-L)/n across, at once: the slower of the two. A collective-permute
    crosses the network when the group spans domains.
    """
    kind, b = canonical_kind(kind), _check_bytes(nbytes)
    local, nodes = (tuple(tiers) + (Tier(1, 1.0, 0.0), Tier(1, 1.0, 0.0)))[:2]
    n = local.size * nodes.size
    if n <= 1:
        return ZERO
    if kind == "collective-permute":
        t = nodes if nodes.size > 1 else local
        return Cost(t.latency, b / t.bandwidth)
    if kind == "all-to-all":
        inside = (local.size - 1) * b / (n * local.bandwidth)
        across = (n - local.size) * b / (n * nodes.bandwidth)
        return Cost(nodes.latency if nodes.size > 1 else local.latency, max(inside, across))
    inner = ring_cost("reduce-scatter", b, local.size, local.bandwidth, local.latency)
    outer_kind = "all-reduce" if kind == "all-reduce" else "reduce-scatter"
    outer = ring_cost(outer_kind, b / local.size, nodes.size, nodes.bandwidth, nodes.latency)
    if kind == "all-reduce" and nodes.size > 2:
        outer = min(outer, tree_cost(b / local.size, nodes.size, nodes.bandwidth,
                                     nodes.latency), key=lambda c: c.total)
    return inner + outer + (inner if kind == "all-reduce" else ZERO)


def tree_cost(nbytes: float, n: int, bandwidth: float, latency: float) -> Cost:
    """An all-reduce over n nodes on NCCL's double binary tree: a reduce up and a broadcast
    down a tree of depth ceil(log2 n), 2 ceil(log2 n) steps of latency; pipelined in chunks,
    every byte crosses each node's link twice (up, down): 2 B/bw, at the 0.92 of the link that
    NCCL's tuning model gives a tree all-reduce (src/graph/tuning.cc) -- a little slower than
    the ring's 2(n-1)/n B/bw. NCCL picks it where the ring's 2(n-1) latency steps dominate
    (small messages across many nodes); `switched_cost` takes the cheaper of the two likewise."""
    if n <= 1:
        return ZERO
    return Cost(2 * math.ceil(math.log2(n)) * latency,
                2 * _check_bytes(nbytes) / (TREE_BANDWIDTH * bandwidth))


TREE_BANDWIDTH = 0.92


def multislice_cost(kind: str, nbytes: float, group: Group) -> Cost:
    """A group that spans slices: its in-slice part (`dims`, L devices) on ICI, the m slices
    over the DCN, each chip on its own share of its host's NICs (`group.dcn`), hierarchically
    as XLA decomposes a cross-slice collective: an all-reduce is a reduce-scatter inside, an
    all-reduce across the slices on B/L, an all-gather inside; an all-gather (reduce-scatter)
    moves B/L across and B inside. An all-to-all sends (n-L)/n of B across; a
    collective-permute crosses the DCN."""
    kind, b = canonical_kind(kind), _check_bytes(nbytes)
    dcn = group.dcn
    assert dcn is not None
    local = math.prod(d.size for d in group.dims) if group.dims else 1
    n = local * dcn.size
    if kind == "collective-permute":
        return Cost(dcn.latency, b / dcn.bandwidth)
    if kind == "all-to-all":
        return Cost(dcn.latency, (n - local) * b / (n * dcn.bandwidth))
    inside = dataclasses.replace(group, dcn=None)
    if kind == "all-reduce":
        across = ring_cost("all-reduce", b / local, dcn.size, dcn.bandwidth, dcn.latency)
        if dcn.size > 2:
            across = min(across, tree_cost(b / local, dcn.size, dcn.bandwidth, dcn.latency),
                         key=lambda c: c.total)
        return (collective_time("reduce-scatter", b, inside) + across
                + collective_time("all-gather", b, inside))
    across = ring_cost(kind, b / local, dcn.size, dcn.bandwidth, dcn.latency)
    return collective_time(kind, b, inside) + across


def collective_time(kind: str, nbytes: float, group: Group) -> Cost:
    """The closed-form time of one collective over `group` (from `groups`/`group`)."""
    kind = canonical_kind(kind)
    if group.dcn is not None:
        return multislice_cost(kind, nbytes, group)
    if group.dims:
        return torus_cost(kind, nbytes, group.dims)
    if group.tiers:
        return switched_cost(kind, nbytes, group.tiers)
    _check_bytes(nbytes)
    return ZERO


def bus_factor(kind: str, n: int) -> float:
    """NCCL's bus bandwidth = algorithm bandwidth (bytes/time) x this: 2(n-1)/n for an
    all-reduce, (n-1)/n for the others, 1 for a point-to-point permute."""
    kind = canonical_kind(kind)
    if kind == "collective-permute" or n <= 1:
        return 1.0
    return (2 if kind == "all-reduce" else 1) * (n - 1) / n


# -- mesh axes on physical dimensions ---------------------------------------------------------


def _prime_factors(x: int) -> list[int]:
    out, p = [], 2
    while p * p <= x:
        while x % p == 0:
            out.append(p)
            x //= p
        p += 1
    return out + ([x] if x > 1 else [])


def assign_axes(physical: Sequence[int], sizes: Sequence[int], allow_split: bool = True
                ) -> tuple[tuple[int, ...], ...]:
    """JAX's assignment of mesh axes to a torus: `out[d][j]` is the part of physical dimension
    d that mesh axis j takes (prod over j = the dimension's length; over d = the axis size).

    Axes are placed from the last (the most traffic: podkit's `model`) to the first, each on
    the largest set of whole physical dimensions whose product is its size (jax's
    `_create_device_mesh_for_nd_torus`). When one does not fit whole dimensions, jax (on v5e,
    where `jax.make_mesh` allows it) starts again splitting dimensions, preferring whole
    dimensions, then more of them, then ones not already split
    (`_create_device_mesh_for_nd_torus_splitting_axes`); `allow_split=False` raises instead,
    as `jax.make_mesh` does on the other TPU kinds.
    """
    # jax's physical TPU mesh is 3D (x, y, z); a 2D slice has z = 1. The trailing 1 decides
    # ties of the whole-dimension search, so it is kept while searching.
    ndims = len(physical)
    physical = list(physical) + [1] * max(0, 3 - ndims)
    free = list(physical)
    whole: list[tuple[int, ...] | None] = [None] * len(sizes)
    for j in reversed(range(len(sizes))):
        for count in range(len(physical), 0, -1):
            for combo in itertools.combinations(enumerate(free), count):
                idx, lengths = zip(*combo, strict=True)
                if math.prod(lengths) == sizes[j]:
                    whole[j] = idx
                    free = [0 if i in idx else v for i, v in enumerate(free)]
                    break
            if whole[j] is not None:
                break
    if all(w is not None or s == 1 for w, s in zip(whole, sizes, strict=True)):
        out = [[physical[d] if w and d in w else 1 for w in whole] for d in range(len(physical))]
    elif not allow_split:
        raise ConfigError(
            f"mesh axis sizes {tuple(sizes)} do not each fit whole physical dimensions of "
            f"{'x'.join(map(str, physical[:ndims]))}: each axis must be the product of some "
            "of them (jax.make_mesh splits a dimension only on v5e); choose such sizes, or "
            "allow splitting.")
    else:
        out = _assign_splitting(physical, sizes)
    return tuple(tuple(row) for row in out[:ndims])


def _assign_splitting(physical: list[int], sizes: Sequence[int]) -> list[list[int]]:
    out = [[1] * len(sizes) for _ in physical]
    for j in reversed(range(len(sizes))):
        used = [math.prod(row) for row in out]
        free = [p // u for p, u in zip(physical, used, strict=True)]
        need = Counter(_prime_factors(sizes[j]))
        choices = []
        for factor, count in need.items():
            holders = [d for d, f in enumerate(free) for q in _prime_factors(f) if q == factor]
            choices.append([(factor, c) for c in set(itertools.combinations(holders, count))])
        best = None
        for pick in itertools.product(*choices):
            cand = [1] * len(physical)
            for factor, dims in pick:
                for d in dims:
                    cand[d] *= factor
            key = _split_preference(cand, physical, used)
            if best is None or key > best[0]:
                best = (key, cand)
        if best is None:
            raise ConfigError(f"mesh axis {j} of size {sizes[j]} cannot be laid on the torus "
                              f"(its free parts {free}); "
                              "choose axis sizes whose factors the physical dimensions have.")
        for d, part in enumerate(best[1]):
            out[d][j] = part
    return out


def _split_preference(cand: list[int], physical: list[int], used: list[int]) -> tuple:
    """jax's `_prefer_first_logical_axis_assignment` as a sort key (larger is preferred)."""
    whole = [s for s, p in zip(cand, physical, strict=True) if s == p]
    shared = math.prod(s for s, u in zip(cand, used, strict=True) if u > 1)
    return (math.prod(whole), sum(1 for s in whole if s > 1), shared, tuple(cand))


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh laid on a pod: which physical links each mesh axis uses."""

    pod: Pod
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...] = ()  # torus: parts[d][j] (assign_axes)

    def strides(self, d: int) -> tuple[int, ...]:
        """Physical hops between neighbours of each axis along dimension d (last axis minor)."""
        row = self.parts[d]
        return tuple(math.prod(row[j + 1:]) for j in range(len(row)))

    def group(self, *axes: str) -> Group:
        """The group of one or several mesh axes (e.g. "data", "fsdp": a gradient reduction
        over both). `dcn`, the slices of a multislice pod, adds the data-center network."""
        known = (*self.axes, *((DCN,) if self.pod.slices > 1 else ()))
        unknown = [a for a in axes if a not in known]
        if not axes or unknown:
            raise ConfigError(f"group axes {axes!r}: {unknown[0] if unknown else 'none given'!r}"
                              f" is not an axis of the mesh; its axes: {', '.join(known)}.")
        if DCN in axes:
            rest = tuple(a for a in axes if a != DCN)
            inner = self.group(*rest) if rest else Group((), 1)
            chip = self.pod.chip
            return dataclasses.replace(
                inner, axes=(DCN, *inner.axes), size=inner.size * self.pod.slices,
                dcn=Tier(self.pod.slices, chip.dcn_bandwidth, chip.dcn_latency))
        idx = sorted({self.axes.index(a) for a in axes})
        size = math.prod(self.sizes[j] for j in idx)
        names = tuple(self.axes[j] for j in idx)
        chip = self.pod.chip
        if chip.torus:
            dims = []
            for d, length in enumerate(self.pod.shape):
                mine = [(self.parts[d][j], self.strides(d)[j]) for j in idx if self.parts[d][j] > 1]
                if mine:
                    dims.append(TorusDim(d, math.prod(s for s, _ in mine), min(t for _, t in mine),
                                         length, self.pod.wrap[d], chip.ici_bandwidth,
                                         chip.hop_latency))
            return Group(names, size, tuple(dims))
        if size == 1:
            return Group(names, 1)
        # Devices in id order, the last mesh axis fastest; a domain is `per` consecutive ids.
        per = self.pod.shape[1]
        mstride = [math.prod(self.sizes[j + 1:]) for j in range(len(self.sizes))]
        members = [sum(c * mstride[j] for c, j in zip(combo, idx, strict=True))
                   for combo in itertools.product(*(range(self.sizes[j]) for j in idx))]
        nodes = len({m // per for m in members})
        local = sum(1 for m in members if m // per == 0)
        return Group(names, size, tiers=(Tier(local, chip.domain_bandwidth, chip.domain_latency),
                                         Tier(nodes, chip.network_bandwidth, chip.network_latency)))

    def logical(self, coord: Sequence[int]) -> tuple[int, ...]:
        """A torus device's mesh coordinates (jax's logical mesh index of physical `coord`)."""
        out = [0] * len(self.axes)
        for d, x in enumerate(coord):
            strides = self.strides(d)
            for j, part in enumerate(self.parts[d]):
                out[j] = out[j] * part + (x // strides[j]) % part
        return tuple(out)


def layout(pod: Pod, mesh: Mapping[str, int], allow_split: bool = True) -> Layout:
    """Lay `mesh` (axis -> size, in order of increasing traffic, as podkit's data, fsdp,
    model) on `pod`; ConfigError for sizes that are not positive integers or whose product is
    not the pod's chip count. On a multislice pod the `dcn` axis (outermost) is the slices and
    the other axes are laid on each slice alike."""
    mesh = dict(mesh)
    if pod.slices > 1 or DCN in mesh:
        if mesh.get(DCN, 1) != pod.slices:
            raise ConfigError(f"mesh={mesh} on {pod.spec}: the dcn axis is the slices, "
                              f"dcn = {pod.slices}" + (" (a pod of one slice has no dcn axis)"
                                                       if pod.slices == 1 else "") + ".")
        rest = {a: n for a, n in mesh.items() if a != DCN} or {"data": 1}
        inner = layout(pod.one_slice(), rest, allow_split)
        return dataclasses.replace(inner, pod=pod)
    if not mesh:
        raise ConfigError("mesh={} has no axes; give e.g. mesh={'data': N} with N the chips.")
    for axis, size in mesh.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"mesh axis {axis!r} has size {size!r}; sizes are positive integers"
                              f" whose product is the pod's {pod.chips} chips.")
    if math.prod(mesh.values()) != pod.chips:
        raise ConfigError(f"mesh={mesh} has {math.prod(mesh.values())} devices but pod "
                          f"{pod.spec} has {pod.chips} chips; make the sizes multiply to "
                          f"{pod.chips}.")
    axes, sizes = tuple(mesh), tuple(mesh.values())
    if not pod.chip.torus:
        return Layout(pod, axes, sizes)
    try:
        parts = assign_axes(pod.shape, sizes, allow_split)
    except ConfigError as e:
        raise ConfigError(f"mesh={mesh} on {pod.spec}: {e}") from None
    return Layout(pod, axes, sizes, parts)


def groups(pod: Pod, mesh: Mapping[str, int], allow_split: bool = True) -> dict[str, Group]:
    """Each mesh axis's group on `pod`."""
    lay = layout(pod, mesh, allow_split)
    return {a: lay.group(a) for a in ((DCN,) if pod.slices > 1 else ()) + lay.axes}


def group(pod: Pod, mesh: Mapping[str, int], *axes: str, allow_split: bool = True) -> Group:
    """The group of several mesh axes at once (a gradient all-reduce over data and fsdp)."""
    return layout(pod, mesh, allow_split).group(*axes)
