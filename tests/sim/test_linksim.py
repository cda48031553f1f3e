"""The link-level simulation of small tori (podkit.sim.linksim) against the closed forms
(podkit.sim.collectives): exact (1e-9) where they must agree - a ring on a wrapped axis, a
line, tori of equal dimensions dimension by dimension, the all-to-all, interleaved groups on a
split dimension, two axes on disjoint links - and the measured disagreement where links are
shared in ways the closed forms do not count, or a ring is laid where its neighbours are not
physical neighbours. The sizes of those effects are in docs/sim-hardware.md."""

import pytest

from podkit.errors import ConfigError
from podkit.sim import collectives as col
from podkit.sim import hardware as hw
from podkit.sim import linksim as ls
from podkit.sim.hardware import BUILTIN, Pod

B, W, A = 1e8, 4.5e10, 1e-6
EXACT = 1e-9
RINGS = ("reduce-scatter", "all-gather", "all-reduce")


def agree(sim, closed):
    return (sim.latency_s == pytest.approx(closed.latency_s, rel=EXACT)
            and sim.bandwidth_s == pytest.approx(closed.bandwidth_s, rel=EXACT))


def torus_pod(shape, wrap):
    return Pod(BUILTIN["tpu-v4" if len(shape) == 3 else "tpu-v5e"], shape, (wrap,) * len(shape))


def setup(shape, wrap, mesh):
    pod = torus_pod(shape, wrap)
    return ls.Torus.of(pod), col.layout(pod, mesh)


def test_a_step_lasts_its_busiest_link_plus_its_longest_route():
    t = ls.Torus((4,), (True,), W, A)
    # 0 -> 2 on a 4-ring: half each way round, 2 hops: each link carries B/2
    assert ls.step_cost(t, [((0,), (2,), B, 0)]) == col.Cost(2 * A, B / 2 / W)
    # plus 1 -> 2 (+): link 1->2 now carries B/2 + B
    assert ls.step_cost(t, [((0,), (2,), B, 0), ((1,), (2,), B, 0)]) == col.Cost(
        2 * A, 1.5 * B / W)
    # one chain through run_chains is the plain sum of its steps
    steps = ls.ring_steps([(i,) for i in range(4)], "all-reduce", B, bidirectional=True)
    assert agree(ls.run_chains(t, [steps]), ls.run(t, steps))


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_one_ring_on_a_wrapped_axis_is_exact(n):
    t = ls.Torus((n,), (True,), W, A)
    members = [[(i,) for i in range(n)]]
    for kind in RINGS + ("all-to-all",):
        assert agree(ls.simulate(t, kind, B, members, "unidirectional"),
                     col.ring_cost(kind, B, n, W, A)), kind
        assert agree(ls.simulate(t, kind, B, members), col.ring_cost(kind, B, n, W, A, True)), kind
    assert agree(ls.simulate(t, "collective-permute", B, members),
                 col.ring_cost("collective-permute", B, n, W, A))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_a_line_is_exact(n):
    t = ls.Torus((n,), (False,), W, A)
    for kind in col.KINDS:
        assert agree(ls.simulate(t, kind, B, [[(i,) for i in range(n)]]),
                     col.line_cost(kind, B, n, W, A)), kind


@pytest.mark.parametrize("shape", [(4, 4), (4, 4, 4), (3, 3)])
@pytest.mark.parametrize("wrap", [True, False])
def test_tori_dimension_by_dimension_are_exact(shape, wrap):
    """Equal dimensions: in every phase the k parts use different dimensions and finish
    together, as the closed form assumes."""
    pod = torus_pod(shape, wrap)
    t, lay = ls.Torus.of(pod), col.layout(pod, {"all": pod.chips})
    for kind in col.KINDS:
        assert agree(ls.simulate(t, kind, B, ls.mesh_groups(lay, "all")),
                     col.collective_time(kind, B, lay.group("all"))), kind


@pytest.mark.parametrize("wrap", [True, False])
def test_every_group_of_a_mesh_axis_at_once_is_exact(wrap):
    """All 16 data groups (dim 2) and all 4 fsdp groups (dims 0, 1) of a 4x4x4, and a split
    dimension's interleaved groups, whose sharing of every link the closed form counts
    (bandwidth / stride)."""
    t, lay = setup((4, 4, 4), wrap, {"data": 4, "fsdp": 16})
    for axis in ("data", "fsdp"):
        for kind in col.KINDS:
            assert agree(ls.simulate(t, kind, B, ls.mesh_groups(lay, axis)),
                         col.collective_time(kind, B, lay.group(axis))), (axis, kind)
    t, lay = setup((4, 4), wrap, {"a": 2, "b": 8})
    assert lay.group("a").dims[0].stride == 2
    for kind in col.KINDS:
        assert agree(ls.simulate(t, kind, B, ls.mesh_groups(lay, "a")),
                     col.collective_time(kind, B, lay.group("a"))), kind


def test_two_axes_on_disjoint_links_do_not_slow_each_other():
    t, lay = setup((4, 4, 4), True, {"data": 4, "fsdp": 16})
    for kind in RINGS + ("all-to-all",):
        both = ls.simulate_many(t, [(kind, B, ls.mesh_groups(lay, "data")),
                                    (kind, B, ls.mesh_groups(lay, "fsdp"))])
        slower = max((col.collective_time(kind, B, lay.group(a)) for a in ("data", "fsdp")),
                     key=lambda c: c.total)
        assert agree(both, slower), kind


def test_two_axes_splitting_one_wrapped_dimension_contend_2x():
    """4x4x4 with mesh {a: 2, b: 2, c: 16}: c takes dims 0 and 1; a and b split dim 2 (b
    neighbours, a every second chip round the wrap). Each alone is exact, and next to c too;
    a and b at once share dim 2's links: the closed forms (each axis alone) are 2.0x too
    fast (1.997x for the all-reduce, whose hop latency does not double). On the same mesh
    without wraparound a's interleaved line already needs its middle links twice, and b's
    traffic fits beside it: no slowdown."""
    t, lay = setup((4, 4, 4), True, {"a": 2, "b": 2, "c": 16})
    for kind, ratio in (("all-reduce", 1.99686), ("all-gather", 1.99730),
                        ("all-to-all", 1.99730)):
        closed = [col.collective_time(kind, B, lay.group(a)) for a in ("a", "b")]
        for a, c in zip(("a", "b"), closed, strict=True):
            assert agree(ls.simulate(t, kind, B, ls.mesh_groups(lay, a)), c)
            assert agree(ls.simulate_many(t, [(kind, B, ls.mesh_groups(lay, a)),
                                              (kind, B, ls.mesh_groups(lay, "c"))]),
                         max(c, col.collective_time(kind, B, lay.group("c")),
                             key=lambda x: x.total))
        both = ls.simulate_many(t, [(kind, B, ls.mesh_groups(lay, "a")),
                                    (kind, B, ls.mesh_groups(lay, "b"))])
        assert both.total / max(c.total for c in closed) == pytest.approx(ratio, abs=1e-5), kind
        assert both.bandwidth_s / max(c.bandwidth_s for c in closed) == pytest.approx(2, abs=1e-3)
    t, lay = setup((4, 4, 4), False, {"a": 2, "b": 2, "c": 16})
    both = ls.simulate_many(t, [("all-reduce", B, ls.mesh_groups(lay, a)) for a in "ab"])
    assert agree(both, max((col.collective_time("all-reduce", B, lay.group(a)) for a in "ab"),
                           key=lambda c: c.total))


@pytest.mark.parametrize("shape, ratio", [((4, 4), 32 / 15), ((4, 4, 4), 192 / 63),
                                          ((8, 8), 256 / 63)])
def test_all_to_all_on_a_torus_is_bisection_bound(shape, ratio):
    """Flows share links: the closed form counts every flow on the busiest link (dimension
    order routing) and agrees exactly; the switched-network formula, (N-1)/N B over the
    chip's 2 x dims links (NCCL's bus bandwidth), is 2.13x (4x4), 3.05x (4x4x4), 4.06x (8x8)
    too fast on a torus."""
    pod = torus_pod(shape, True)
    t, lay = ls.Torus.of(pod), col.layout(pod, {"all": pod.chips})
    sim = ls.simulate(t, "all-to-all", B, ls.mesh_groups(lay, "all"))
    assert agree(sim, col.collective_time("all-to-all", B, lay.group("all")))
    n = pod.chips
    injection = (n - 1) / n * B / (2 * len(shape) * W)
    assert sim.bandwidth_s / injection == pytest.approx(ratio, rel=EXACT)


@pytest.mark.parametrize("n", [4, 8])
def test_a_ring_laid_over_a_line_pays_the_long_way_back(n):
    """A ring over a line in device order: the last device's logical neighbour is the first,
    n-1 hops away. Each link direction still carries one chunk a step (the bandwidth term
    agrees with the line algorithm's), but every step waits n-1 hops: the latency term is
    (n-1)x, 3x for n = 4, 7x for n = 8."""
    t = ls.Torus((n,), (False,), W, A)
    members = [[(i,) for i in range(n)]]
    for algorithm in ("ring", "unidirectional"):
        for kind in RINGS:
            sim, line = ls.simulate(t, kind, B, members, algorithm), col.line_cost(kind, B, n, W, A)
            assert sim.bandwidth_s == pytest.approx(line.bandwidth_s, rel=EXACT)
            assert sim.latency_s == pytest.approx((n - 1) * line.latency_s, rel=EXACT)


@pytest.mark.parametrize("shape, wrap, mesh, axis, ratio", [
    ((4, 4, 8), True, {"all": 128}, "all", 1.05599),  # v4 / v5p's 128-chip slice
    ((4, 4, 8), False, {"all": 128}, "all", 1.06734),
    ((4, 8), True, {"all": 32}, "all", 0.99838),
    ((4, 4), True, {"a": 2, "b": 8}, "b", 1.26740),  # a ring of 4 and a line of 2
])
def test_unequal_dimensions_overlap_unevenly(shape, wrap, mesh, axis, ratio):
    """The torus algorithm's parts reach the long (or slow) dimension at different times and
    share its links. The closed form takes the slowest part or that dimension's total load,
    whichever is more; the simulation, sharing links max-min fairly, measures the all-reduce
    at 1.056x that on a wrapped 4x4x8, 1.067x unwrapped, 0.998x on 4x8 (the parts' hop
    latency overlaps), 1.267x for a ring of 4 with a line of 2."""
    t, lay = setup(shape, wrap, mesh)
    sim = ls.simulate(t, "all-reduce", B, ls.mesh_groups(lay, axis))
    assert sim.total / col.collective_time("all-reduce", B, lay.group(axis)).total == \
        pytest.approx(ratio, abs=1e-5)


def test_bad_inputs_name_the_value():
    with pytest.raises(ConfigError, match="h100:1x8 is a switched fabric"):
        ls.Torus.of(hw.pod("h100:8"))
    t, lay = setup((4, 4), True, {"data": 16})
    with pytest.raises(ConfigError, match="algorithm='tree'.*auto, ring, unidirectional"):
        ls.simulate(t, "all-reduce", B, ls.mesh_groups(lay, "data"), "tree")
    with pytest.raises(ConfigError, match="'model'"):
        ls.mesh_groups(lay, "model")
