"""Closed-form collective costs (podkit.sim.collectives) against hand-computed cases, the
placement of mesh axes on torus dimensions against jax's own, and the errors that name the bad
value.

Units in the hand computations: B bytes, W bytes/s per link one way, a seconds per hop."""

import itertools
import math

import numpy as np
import pytest

from podkit.errors import ConfigError
from podkit.sim import collectives as col
from podkit.sim import hardware as hw
from podkit.sim.hardware import BUILTIN, Pod

B, W, A = 1e9, 1e10, 1e-6


def close(cost, latency, bandwidth):
    return cost.latency_s == pytest.approx(latency, rel=1e-12) and \
        cost.bandwidth_s == pytest.approx(bandwidth, rel=1e-12)


def torus(shape, wrap, chip="tpu-v5e"):
    """A torus pod of any shape (the catalog's slices are in test_hardware)."""
    return Pod(BUILTIN[chip], shape, (wrap,) * len(shape))


def dim(d, size, stride=1, length=None, wrap=True):
    return col.TorusDim(d, size, stride, length or size * stride, wrap, W, A)


def test_one_way_ring_by_hand():
    n = 8
    # reduce-scatter: 7 steps of B/8 a link: 7 * 1.25e8 / 1e10 = 0.0875 s, 7 us
    assert close(col.ring_cost("reduce-scatter", B, n, W, A), 7e-6, 0.0875)
    assert close(col.ring_cost("all-gather", B, n, W, A), 7e-6, 0.0875)
    # all-reduce = 2(n-1)/n B/W + 2(n-1) a = 1.75 * 0.1 s, 14 us
    assert close(col.ring_cost("all-reduce", B, n, W, A), 14e-6, 0.175)
    # all-to-all: n(n-1)/2 = 28 flows of B/8 on each link = 3.5e9 bytes: 0.35 s, 7 hops
    assert close(col.ring_cost("all-to-all", B, n, W, A), 7e-6, 0.35)
    assert close(col.ring_cost("collective-permute", B, n, W, A), 1e-6, 0.1)
    assert col.ring_cost("all-reduce", B, 1, W, A) == col.ZERO


def test_bidirectional_ring_halves_the_bandwidth_term():
    n = 8
    # half of each chunk each way: 7 steps of B/16 a link direction = 0.04375 s
    assert close(col.ring_cost("reduce-scatter", B, n, W, A, True), 7e-6, 0.04375)
    assert close(col.ring_cost("all-reduce", B, n, W, A, True), 14e-6, 0.0875)
    # all-to-all the shortest way: n^2/8 = 8 flows of B/8 per link direction = 0.1 s, 4 hops
    # (the scaling book: a quarter of an all-gather's B/W... of the global array n*B)
    assert close(col.ring_cost("all-to-all", B, n, W, A, True), 4e-6, 0.1)
    # odd n = 5: (25 - 1)/8 = 3 flows of B/5: 0.06 s, 2 hops
    assert close(col.ring_cost("all-to-all", B, 5, W, A, True), 2e-6, 0.06)


def test_line_has_a_one_way_rings_bandwidth_and_one_hop_steps():
    n = 4
    # n-1 = 3 steps, each link direction carrying one B/4 chunk: 3 * 2.5e8 / 1e10 = 0.075 s
    assert close(col.line_cost("reduce-scatter", B, n, W, A), 3e-6, 0.075)
    assert close(col.line_cost("all-reduce", B, n, W, A), 6e-6, 0.15)
    assert col.line_cost("all-reduce", B, n, W, A) == col.ring_cost("all-reduce", B, n, W, A)
    # all-to-all: the middle link carries 2 x 2 flows of B/4 = B: 0.1 s, 3 hops end to end
    assert close(col.line_cost("all-to-all", B, n, W, A), 3e-6, 0.1)
    # a cyclic shift: B on every link direction, the last device's crossing 3 hops back
    assert close(col.line_cost("collective-permute", B, n, W, A), 3e-6, 0.1)
    # a non-wrapped axis: twice a wrapped (bidirectional) ring's bandwidth term
    wrapped, line = col.ring_group(n, W, A, True), col.ring_group(n, W, A, False)
    assert col.collective_time("all-reduce", B, line).bandwidth_s == pytest.approx(
        2 * col.collective_time("all-reduce", B, wrapped).bandwidth_s, rel=1e-12)


def test_nccl_bus_bandwidth_of_a_ring_is_the_link_bandwidth():
    assert col.bus_factor("all-reduce", 8) == 1.75 and col.bus_factor("all-gather", 8) == 0.875
    assert col.bus_factor("collective-permute", 8) == col.bus_factor("all-reduce", 1) == 1.0
    for n in (2, 4, 8, 64):
        for kind in ("all-reduce", "all-gather", "reduce-scatter"):
            t = col.ring_cost(kind, B, n, W, A).bandwidth_s
            assert B / t * col.bus_factor(kind, n) == pytest.approx(W, rel=1e-12)


def test_2d_torus_by_hand_wrapped_and_not():
    dims = (dim(0, 4), dim(1, 4))
    # Two parts of B/2, one per dimension first. Part: reduce-scatter over a bidirectional
    # ring of 4 on 5e8 (3 steps of 5e8/8: 0.01875 s), then on 1.25e8 (0.0046875 s):
    # 15B/64W = 0.0234375 s, 6 hops; all-reduce twice: 15B/32W, 12 hops.
    assert close(col.torus_cost("reduce-scatter", B, dims), 6e-6, 0.0234375)
    assert close(col.torus_cost("all-reduce", B, dims), 12e-6, 0.046875)
    # The scaling book's all-reduce over 2 axes, 2 * B / (2W * 2), less its (n-1)/n = 15/16
    assert col.torus_cost("all-reduce", B, dims).bandwidth_s == pytest.approx(
        2 * B / (2 * W * 2) * 15 / 16, rel=1e-12)
    lines = (dim(0, 4, wrap=False), dim(1, 4, wrap=False))
    # Lines: 3 * (5e8/4)/1e10 + 3 * (1.25e8/4)/1e10 = 0.046875 s; all-reduce 0.09375 s
    assert close(col.torus_cost("all-reduce", B, lines), 12e-6, 0.09375)
    # all-to-all, 4x4x4 wrapped: each dimension's busiest link carries 2 flows of B/4 = B/2
    # (0.05 s), all dimensions at once; 2 hops per dimension: 6 us
    assert close(col.torus_cost("all-to-all", B, dims + (dim(2, 4),)), 6e-6, 0.05)
    # ... and on 4x4 lines: the middle link carries 4 flows of B/4 = B: 0.1 s, 3 + 3 hops
    assert close(col.torus_cost("all-to-all", B, lines), 6e-6, 0.1)
    # a permute shifts along the innermost dimension: one hop of B
    assert close(col.torus_cost("collective-permute", B, dims), 1e-6, 0.1)


def test_scaling_book_worked_answers_within_their_n_minus_1_over_n():
    """Part 3, question 2: TPU v4 4x4x4, mesh X, Y, Z of 4, bf16[1024, 4096]."""
    pod = hw.pod("tpu-v4:64")
    gs = col.groups(pod, {"X": 4, "Y": 4, "Z": 4})
    w_bidi = 9e10
    v = 2 * 1024 * 4096  # bytes of the array
    # (1) AllGather_X of [B_X, D_Y]: V/Y bytes over one axis: the book's V/(Y W_bidi) = 23 us
    ag_x = col.collective_time("all-gather", v / 4, gs["X"])
    assert ag_x.bandwidth_s == pytest.approx(v / 4 / w_bidi * 3 / 4, rel=1e-12)
    assert ag_x.latency_s == pytest.approx(3e-6)
    # (2) AllGather_XY: V over two axes, the book's V / (2 W_bidi) = 46 us
    ag_xy = col.collective_time("all-gather", v, col.group(pod, {"X": 4, "Y": 4, "Z": 4},
                                                             "X", "Y"))
    assert ag_xy.bandwidth_s == pytest.approx(v / (2 * w_bidi) * 15 / 16, rel=1e-12)


def test_a_split_dimension_shares_its_links_between_interleaved_groups():
    pod = torus((4, 4), True)
    gs = col.groups(pod, {"a": 2, "b": 8})
    # jax places b (the last axis) first: dim 0 whole and half of dim 1 (neighbours); a takes
    # the other half of dim 1: every second chip, 2 hops apart, its ring closing round the wrap
    assert [(d.dim, d.size, d.stride, d.ring) for d in gs["b"].dims] == [
        (0, 4, 1, True), (1, 2, 1, False)]
    assert [(d.dim, d.size, d.stride, d.ring) for d in gs["a"].dims] == [(1, 2, 2, True)]
    a, w = gs["a"].dims[0], 4.5e10  # v5e's link
    # a's all-reduce: a bidirectional ring of 2, two groups sharing every dim-1 link (w/2),
    # 2 hops a step: 2 steps of (B/2/2) / (w/2) = B/w, 2 * 2 us
    assert close(col.dim_cost("all-reduce", B, a), 4e-6, B / w)
    # both axes at once: the whole torus, one ring per dimension
    both = col.group(pod, {"a": 2, "b": 8}, "a", "b")
    assert [(d.dim, d.size, d.stride, d.ring) for d in both.dims] == [
        (0, 4, 1, True), (1, 4, 1, True)]


def test_the_last_mesh_axis_gets_the_most_links():
    pod = hw.pod("tpu-v5p:128")  # 4x4x8
    gs = col.groups(pod, {"data": 8, "fsdp": 16})
    assert [d.dim for d in gs["fsdp"].dims] == [0, 1] and [d.dim for d in gs["data"].dims] == [2]
    gs = col.groups(pod, {"data": 16, "model": 8})
    assert [d.dim for d in gs["model"].dims] == [2] and [d.dim for d in gs["data"].dims] == [0, 1]
    assert all(d.ring and d.bandwidth == 9e10 for g in gs.values() for d in g.dims)


def test_hierarchical_nvlink_infiniband_by_hand():
    pod = hw.pod("h100:16")  # 2 NVLink domains of 8
    g = col.groups(pod, {"data": 16})["data"]
    assert [(t.size, t.bandwidth) for t in g.tiers] == [(8, 450e9), (2, 50e9)]
    # reduce-scatter inside over NVLink: 7/8 B / 450e9 = 1.9444 ms (7 steps of 0.6 us);
    # all-reduce across the 2 domains on B/8 over each GPU's NIC: 2 * 1/2 * 1.25e8 / 50e9 =
    # 2.5 ms (2 steps of 2.7 us); all-gather inside: 1.9444 ms again.
    cost = col.collective_time("all-reduce", B, g)
    assert close(cost, 14 * 0.6e-6 + 2 * 2.7e-6, 2 * 7 / 8 * B / 450e9 + 2.5e-3)
    # the network part is a plain ring all-reduce of 1/8 of the data over the domains
    net = col.ring_cost("all-reduce", B / 8, 2, 50e9, 2.7e-6)
    inner = col.ring_cost("reduce-scatter", B, 8, 450e9, 0.6e-6)
    assert cost.total == pytest.approx((inner + net + inner).total, rel=1e-12)
    # one domain: a ring over NVLink, its bus bandwidth the NVLink bandwidth, 450 GB/s
    one = col.groups(hw.pod("h100:8"), {"data": 8})["data"]
    t = col.collective_time("all-reduce", B, one).bandwidth_s
    assert B / t * col.bus_factor("all-reduce", 8) == pytest.approx(450e9, rel=1e-12)
    # all-to-all across 2 domains: 7/16 of B inside, 8/16 over the NIC, at once
    assert col.collective_time("all-to-all", B, g).bandwidth_s == pytest.approx(
        max(7 / 16 * B / 450e9, 8 / 16 * B / 50e9), rel=1e-12)


def test_small_all_reduces_across_many_domains_take_nccls_tree():
    tiers = (col.Tier(8, 450e9, 0.6e-6), col.Tier(256, 50e9, 2.7e-6))
    small = col.switched_cost("all-reduce", 8 * 1024, tiers)
    inner = col.ring_cost("reduce-scatter", 8 * 1024, 8, 450e9, 0.6e-6)
    # across the 256 domains: a tree of depth 8 (16 steps) instead of a ring's 510
    tree = col.Cost(16 * 2.7e-6, 2 * 1024 / (0.92 * 50e9))
    assert small.total == pytest.approx((inner + tree + inner).total, rel=1e-12)
    ring = col.ring_cost("all-reduce", 1024, 256, 50e9, 2.7e-6)
    assert tree.total < ring.total / 20
    # large messages keep the ring: its bandwidth term is the smaller
    big = col.switched_cost("all-reduce", 8 << 30, tiers)
    inner = col.ring_cost("reduce-scatter", 8 << 30, 8, 450e9, 0.6e-6)
    assert big.total == pytest.approx(
        (inner + col.ring_cost("all-reduce", 1 << 30, 256, 50e9, 2.7e-6) + inner).total)


def test_gpu_mesh_axes_follow_device_order():
    pod = hw.pod("a100:2048")  # 256 domains of 8
    gs = col.groups(pod, {"data": 256, "model": 8})
    assert [t.size for t in gs["model"].tiers] == [8, 1]  # model inside each domain
    assert [t.size for t in gs["data"].tiers] == [1, 256]  # data: one GPU per domain
    # data: a ring over the NICs only, 2 * 255/256 * B / 25e9
    assert col.collective_time("all-reduce", B, gs["data"]).bandwidth_s == pytest.approx(
        2 * 255 / 256 * B / 25e9, rel=1e-12)
    gs = col.groups(pod, {"data": 128, "model": 16})
    assert [t.size for t in gs["model"].tiers] == [8, 2]  # model spans two domains
    both = col.group(pod, {"data": 128, "model": 16}, "data", "model")
    assert [t.size for t in both.tiers] == [8, 256] and both.size == 2048


def _divisor_meshes(n, axes):
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return [m for m in itertools.product(divisors, repeat=axes) if math.prod(m) == n]


@pytest.mark.parametrize("shape", [(4, 4), (4, 8), (16, 16), (2, 2, 1), (2, 4, 4), (4, 4, 4),
                                   (4, 4, 8), (8, 16, 16)])
def test_axes_land_where_jax_mesh_utils_puts_them(shape):
    """The assignment and the device order of jax's _create_device_mesh_for_nd_torus (on the
    3D mesh jax builds for a 2D slice, z = 1), splitting allowed as jax.make_mesh does on v5e;
    and jax's refusal where it would have to split but may not."""
    from jax._src import mesh_utils

    padded = tuple(shape) + (1,) * (3 - len(shape))
    physical = np.arange(math.prod(shape)).reshape(padded)
    for axes in (1, 2, 3):
        for mesh in _divisor_meshes(math.prod(shape), axes):
            theirs, matrix = mesh_utils._create_device_mesh_for_nd_torus(
                physical, mesh, allow_split_physical_axes=True)
            ours = col.assign_axes(shape, mesh)
            assert ours == tuple(tuple(int(x) for x in row) for row in matrix[:len(shape)]), mesh
            try:
                mesh_utils._create_device_mesh_for_nd_torus(physical, mesh)
                whole = True
            except NotImplementedError:
                whole = False
            try:
                col.assign_axes(shape, mesh, allow_split=False)
                assert whole, mesh
            except ConfigError:
                assert not whole, mesh
            if math.prod(shape) <= 128:  # the device order too
                lay = col.Layout(torus(shape, False, "tpu-v4" if len(shape) == 3 else
                                       "tpu-v5e"), tuple(f"a{i}" for i in mesh), mesh, ours)
                for c in itertools.product(*(range(n) for n in shape)):
                    assert theirs[lay.logical(c)] == physical[c + (0,) * (3 - len(shape))]


@pytest.mark.parametrize("mesh, names", [
    ({"data": 8, "model": 4}, ["32 devices", "64 chips", "multiply to 64"]),
    ({"data": 0, "model": 64}, ["'data'", "size 0", "positive integers"]),
    ({"data": 2.0, "model": 32}, ["'data'", "2.0"]),
    ({}, ["no axes"]),
])
def test_bad_meshes_name_the_value(mesh, names):
    with pytest.raises(ConfigError) as e:
        col.groups(hw.pod("tpu-v4:64"), mesh)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_a_mesh_jax_would_not_build_without_splitting():
    pod = hw.pod("tpu-v4:64")
    with pytest.raises(ConfigError, match=r"\(2, 32\).*jax.make_mesh.*v5e"):
        col.groups(pod, {"data": 2, "model": 32}, allow_split=False)
    assert col.groups(pod, {"data": 2, "model": 32})["data"].dims[0].stride == 2


def test_bad_collective_arguments_name_the_value():
    g = col.ring_group(4, W, A)
    with pytest.raises(ConfigError, match="'allsum'.*all-reduce, all-gather"):
        col.collective_time("allsum", B, g)
    for bad in (-1.0, float("nan"), "1e9"):
        with pytest.raises(ConfigError, match="nbytes"):
            col.collective_time("all-reduce", bad, g)
    with pytest.raises(ConfigError, match="'expert'.*data, model"):
        col.group(hw.pod("tpu-v4:64"), {"data": 16, "model": 4}, "expert")
    assert col.collective_time("AllReduce", B, g) == col.collective_time("all_reduce", B, g)


def test_costs_add_and_scale():
    c = col.Cost(1e-6, 2e-3)
    assert c + c == 2 * c == c * 2 == sum([c, c]) == col.Cost(2e-6, 4e-3)
    assert c.total == pytest.approx(2.001e-3, rel=1e-12)


def test_size_one_axes_cost_nothing():
    gs = col.groups(hw.pod("tpu-v4:64"), {"data": 1, "fsdp": 64})
    assert gs["data"].fabric == "none" and gs["data"].size == 1
    assert col.collective_time("all-reduce", B, gs["data"]) == col.ZERO
    assert col.collective_time("all-reduce", B, col.groups(hw.pod("h100:8"),
                                                            {"data": 1, "m": 8})["data"]).total == 0
