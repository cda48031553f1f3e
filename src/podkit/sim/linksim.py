"""A link-level simulation of small tori: the collectives run step by step over real links.

    pod = hardware.pod("tpu-v4:64")                        # 4x4x4, wrapped
    lay = collectives.layout(pod, {"data": 4, "fsdp": 16})
    linksim.simulate(linksim.Torus.of(pod), "all-reduce", 1e8, linksim.mesh_groups(lay, "fsdp"))

Every link has `bandwidth` in each direction. A step is a set of transfers that run at once;
each is routed dimension by dimension (dimension 0 first), the shortest way round a wrapped
dimension (half each way when both are as short), and a step alone lasts as long as its busiest
link needs (bytes on it / bandwidth), after `latency` per hop of its longest route. A schedule
is a chain of steps, each starting when the one before ends. Chains run concurrently (the
groups of a mesh axis, the parts of a torus algorithm, two axes' collectives): where their
steps share links, the links are split max-min fairly between the steps that cross them, so
chains on disjoint links do not slow each other and chains that share links do.

The algorithms are the ones the closed forms describe (podkit.sim.collectives): rings
(reduce-scatter then all-gather, n-1 steps each; bidirectional: half the data each way), the
line algorithm on a dimension without wraparound, the dimension-by-dimension torus algorithm
(k parts in rotated orders), and the direct all-to-all. Where they must agree they do exactly;
where links are shared in ways the closed forms do not count (two axes' collectives at once,
the parts of the torus algorithm on unequal dimensions) or a ring is laid where its neighbours
are not physical neighbours, the simulation measures by how much (docs/sim-hardware.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Sequence

from podkit.errors import ConfigError
from podkit.sim.collectives import Cost, Layout, canonical_kind
from podkit.sim.hardware import Pod

Coord = tuple[int, ...]
Transfer = tuple[Coord, Coord, float, int]  # src, dst, bytes, direction (0: shortest; 1: +)
Step = list[Transfer]
ALGORITHMS = ("auto", "ring", "unidirectional")


@dataclasses.dataclass(frozen=True)
class Torus:
    shape: tuple[int, ...]
    wrap: tuple[bool, ...]
    bandwidth: float  # per link, each direction, bytes/s
    latency: float  # per hop, s

    @classmethod
    def of(cls, pod: Pod) -> Torus:
        if not pod.chip.torus:
            raise ConfigError(f"linksim simulates TPU tori; {pod.spec} is a switched fabric.")
        return cls(pod.shape, pod.wrap, pod.chip.ici_bandwidth, pod.chip.hop_latency)


def routes(torus: Torus, src: Coord, dst: Coord, direction: int = 0
           ) -> list[tuple[float, list[tuple[Coord, int, int]]]]:
    """The links a transfer crosses, dimension by dimension: (fraction of its bytes, links),
    a link being (the chip it leaves, dimension, +1 or -1). Both ways round at a tie."""
    paths: list[tuple[float, list, list[int]]] = [(1.0, [], list(src))]
    for d, length in enumerate(torus.shape):
        a, b = src[d], dst[d]
        if a == b:
            continue
        if torus.wrap[d] and length > 2:  # a wrapped pair of chips is one link each way
            fwd = (b - a) % length
            back = length - fwd
            if direction > 0 or fwd < back:
                ways = [(1.0, 1, fwd)]
            elif back < fwd:
                ways = [(1.0, -1, back)]
            else:
                ways = [(0.5, 1, fwd), (0.5, -1, back)]
        else:
            ways = [(1.0, 1 if b > a else -1, abs(b - a))]
        grown = []
        for frac, links, pos in paths:
            for share, sign, hops in ways:
                here, path = list(pos), list(links)
                for _ in range(hops):
                    path.append((tuple(here), d, sign))
                    here[d] = (here[d] + sign) % length
                grown.append((frac * share, path, here))
        paths = grown
    return [(frac, links) for frac, links, _ in paths]


def _loads(torus: Torus, step: Step) -> tuple[int, dict[tuple[Coord, int, int], float]]:
    """(the longest route's hops, the bytes each link carries) of one step."""
    load: dict[tuple[Coord, int, int], float] = defaultdict(float)
    hops = 0
    for src, dst, nbytes, direction in step:
        for frac, links in routes(torus, src, dst, direction):
            hops = max(hops, len(links))
            for link in links:
                load[link] += frac * nbytes
    return hops, load


def step_cost(torus: Torus, step: Step) -> Cost:
    """One step: the busiest link's bytes over the bandwidth, plus latency x the longest route."""
    hops, load = _loads(torus, step)
    return Cost(hops * torus.latency, max(load.values(), default=0.0) / torus.bandwidth)


def run(torus: Torus, steps: Sequence[Step]) -> Cost:
    total = Cost()
    for step in steps:
        total = total + step_cost(torus, step)
    return total


def lockstep(*schedules: Sequence[Step]) -> list[Step]:
    """Schedules merged step by step (step i of each together): lines of one phase, which
    are alike and finish together."""
    return [[t for s in schedules if i < len(s) for t in s[i]]
            for i in range(max((len(s) for s in schedules), default=0))]


def run_chains(torus: Torus, chains: Sequence[Sequence[Step]]) -> Cost:
    """Chains of steps run at once. Each step is a job: alone it runs at full speed, taking
    its busiest link's bytes / bandwidth after its hop latency; jobs that share a link slow
    down together (progressive filling: every job's speed rises equally until a link is full,
    those jobs stop there, the others go on). Returns the finishing time as the latency of
    the chain that finishes last and the rest as the bandwidth term."""
    jobs = [[_compile(torus, step) for step in chain] for chain in chains]
    jobs = [[j for j in chain if j[1]] for chain in jobs]  # a step that moves nothing
    pos = [0] * len(jobs)
    wait = [chain[0][0] if chain else 0.0 for chain in jobs]  # hop latency still to wait
    left = [1.0] * len(jobs)  # fraction of the current step's bytes still to move
    spent = [chain[0][0] if chain else 0.0 for chain in jobs]  # latency so far, per chain
    live = [i for i, chain in enumerate(jobs) if chain]
    now, last = 0.0, (0.0, 0.0)
    while live:
        moving = [i for i in live if wait[i] <= 0]
        speed = dict(zip(moving, _fill([jobs[i][pos[i]][1] for i in moving]), strict=True))
        until = {i: wait[i] if wait[i] > 0 else
                 left[i] * jobs[i][pos[i]][2] / (torus.bandwidth * speed[i]) for i in live}
        dt = min(until.values())
        now += dt
        for i in list(live):
            if until[i] > dt * (1 + 1e-9):  # not this event: progress, snapped ones finish
                if wait[i] > 0:
                    wait[i] -= dt
                else:
                    left[i] -= dt * torus.bandwidth * speed[i] / jobs[i][pos[i]][2]
                continue
            if wait[i] > 0:
                wait[i] = 0.0
                continue
            pos[i] += 1
            if pos[i] == len(jobs[i]):
                live.remove(i)
                last = (now, spent[i])
                continue
            wait[i], left[i] = jobs[i][pos[i]][0], 1.0
            spent[i] += wait[i]
    return Cost(last[1], last[0] - last[1])


def _compile(torus: Torus, step: Step) -> tuple[float, dict, float]:
    """(hop latency, each link's share of the busiest link's load, the busiest load)."""
    hops, load = _loads(torus, step)
    top = max(load.values(), default=0.0)
    return hops * torus.latency, {k: v / top for k, v in load.items() if v > 0}, top


def _fill(jobs: Sequence[dict]) -> list[float]:
    """Max-min fair speeds (1 = as fast as alone) of jobs whose link shares are given."""
    speed, free, room, level = [1.0] * len(jobs), set(range(len(jobs))), defaultdict(
        lambda: 1.0), 0.0
    while free:
        use: dict = defaultdict(float)
        for j in free:
            for link, share in jobs[j].items():
                use[link] += share
        rise = min([1.0 - level] + [room[k] / u for k, u in use.items()])
        level += rise
        for k, u in use.items():
            room[k] -= rise * u
        if level >= 1.0 - 1e-12:
            break
        full = {k for k, u in use.items() if room[k] <= 1e-12}
        stopped = {j for j in free if not full.isdisjoint(jobs[j])}
        for j in stopped:
            speed[j] = level
        free -= stopped
    return speed


# -- the algorithms --------------------------------------------------------------------------


def ring_steps(members: Sequence[Coord], kind: str, nbytes: float, bidirectional: bool = False
               ) -> list[Step]:
    """A ring in the order of `members` (wherever they sit): a reduce-scatter or all-gather is
    n-1 steps of a 1/n chunk to the next member (bidirectional: half to the next, half to the
    previous); an all-reduce is both."""
    kind, n = canonical_kind(kind), len(members)
    if n < 2:
        return []
    if kind not in ("reduce-scatter", "all-gather", "all-reduce"):
        raise ConfigError(f"ring_steps runs reduce-scatter, all-gather, all-reduce; not {kind}.")
    chunk = nbytes / n / (2 if bidirectional else 1)
    step = [(members[i], members[(i + 1) % n], chunk, 0) for i in range(n)]
    if bidirectional:
        step += [(members[i], members[i - 1], chunk, 0) for i in range(n)]
    return [step] * ((2 if kind == "all-reduce" else 1) * (n - 1))


def line_steps(members: Sequence[Coord], kind: str, nbytes: float) -> list[Step]:
    """The line algorithm: every member forwards chunks both ways; at step t the chunk that
    started t-1 places to the left moves right (and mirrored), n-1 steps. A reduce-scatter is
    the same traffic with partial sums; an all-reduce is both."""
    kind, n = canonical_kind(kind), len(members)
    if n < 2:
        return []
    chunk = nbytes / n
    one = [[(members[i], members[i + 1], chunk, 0) for i in range(t - 1, n - 1)]
           + [(members[i], members[i - 1], chunk, 0) for i in range(1, n - t + 1)]
           for t in range(1, n)]
    return one + one if kind == "all-reduce" else one


def all_to_all_steps(members: Sequence[Coord], nbytes: float, direction: int = 0) -> list[Step]:
    """Every member sends nbytes/n to every other, all at once, routed dimension by dimension
    (direction=1: always the + way round, a one-way ring)."""
    n = len(members)
    return [[(a, b, nbytes / n, direction) for a in members for b in members if a != b]] \
        if n > 1 else []


def _closes(torus: Torus, line: Sequence[Coord], d: int) -> bool:
    """Whether members along dimension d, evenly spaced over its whole length, close a ring
    through the wraparound link."""
    xs = [m[d] for m in line]
    gap = xs[1] - xs[0]
    even = all(b - a == gap for a, b in zip(xs, xs[1:], strict=False))
    return torus.wrap[d] and torus.shape[d] > 2 and even and gap * len(xs) == torus.shape[d]


def _one_dim(torus: Torus, line: Sequence[Coord], d: int, kind: str, nbytes: float,
             algorithm: str) -> list[Step]:
    if algorithm == "ring" or (algorithm == "auto" and _closes(torus, line, d)):
        return ring_steps(line, kind, nbytes, bidirectional=True)
    if algorithm == "unidirectional":
        return ring_steps(line, kind, nbytes)
    return line_steps(line, kind, nbytes)


def group_chains(torus: Torus, kind: str, nbytes: float, members: Sequence[Coord],
                 algorithm: str = "auto") -> list[list[Step]]:
    """One group's collective as chains of steps: dimension by dimension in k rotated parts,
    one chain each (reduce-scatter, all-gather, all-reduce); the direct all-to-all; a cyclic
    shift along the innermost dimension (collective-permute). `algorithm`: "auto" (a
    bidirectional ring where the members close one through the wraparound, else the line
    algorithm), "ring" (a bidirectional ring in member order, even on a line),
    "unidirectional" (a one-way ring)."""
    kind = canonical_kind(kind)
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r}; valid: {', '.join(ALGORITHMS)}.")
    dims = [d for d in range(len(torus.shape)) if len({m[d] for m in members}) > 1]
    if not dims:
        return []
    if kind == "all-to-all":
        return [all_to_all_steps(members, nbytes, 1 if algorithm == "unidirectional" else 0)]
    if kind == "collective-permute":
        lines = _lines(members, dims[-1])
        return [[[(line[i], line[(i + 1) % len(line)], nbytes, 0)
                  for line in lines for i in range(len(line))]]]
    k, chains = len(dims), []
    for p in range(k):
        data, phases = nbytes / k, []
        for d in (dims[(p + j) % k] for j in range(k)):  # the data shrinks by each dimension
            lines = _lines(members, d)
            phases.append((d, data, lines))
            data /= len(lines[0])
        rs = [(d, data, lines, "reduce-scatter") for d, data, lines in phases]
        ag = [(d, data, lines, "all-gather") for d, data, lines in reversed(phases)]
        plan = rs if kind == "reduce-scatter" else ag if kind == "all-gather" else rs + ag
        chain: list[Step] = []
        for d, data, lines, phase in plan:
            chain += lockstep(*(_one_dim(torus, line, d, phase, data, algorithm)
                                for line in lines))
        chains.append(chain)
    return chains


def _lines(members: Sequence[Coord], d: int) -> list[list[Coord]]:
    """The members split into lines along dimension d (the other coordinates fixed)."""
    out: dict[Coord, list[Coord]] = defaultdict(list)
    for m in members:
        out[m[:d] + m[d + 1:]].append(m)
    return [sorted(line, key=lambda m: m[d]) for line in out.values()]


def simulate(torus: Torus, kind: str, nbytes: float, groups: Sequence[Sequence[Coord]],
             algorithm: str = "auto") -> Cost:
    """The time of one collective run by every group at once (the groups of a mesh axis)."""
    return simulate_many(torus, [(kind, nbytes, groups, algorithm)])


def simulate_many(torus: Torus, collectives: Sequence[tuple]) -> Cost:
    """Several collectives at once, each (kind, nbytes, groups[, algorithm]): e.g. two mesh
    axes' reductions overlapping in one step."""
    chains = [chain for kind, nbytes, groups, *algorithm in collectives for g in groups
              for chain in group_chains(torus, kind, nbytes, g, *algorithm)]
    return run_chains(torus, chains)


def mesh_groups(lay: Layout, *axes: str) -> list[list[Coord]]:
    """Every group of `axes` in a torus layout, each as its chips' coordinates in mesh order."""
    unknown = [a for a in axes if a not in lay.axes]
    if not axes or unknown or not lay.parts:
        raise ConfigError(f"mesh_groups needs axes of a torus layout ({', '.join(lay.axes)}); "
                          f"got {axes!r}.")
    idx = [lay.axes.index(a) for a in axes]
    out: dict[tuple[int, ...], list[tuple[tuple[int, ...], Coord]]] = defaultdict(list)
    for coord in itertools.product(*(range(n) for n in lay.pod.shape)):
        logical = lay.logical(coord)
        key = tuple(x for j, x in enumerate(logical) if j not in idx)
        out[key].append((tuple(logical[j] for j in idx), coord))
    return [[c for _, c in sorted(g)] for g in out.values()]
