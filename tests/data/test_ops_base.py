"""Node: frozen plans, plan order, fingerprints, shuffle seeds as new plans."""

import dataclasses

import pytest

import podkit as pk
from podkit.data import ops

D = pk.data.Dataset


def test_nodes_and_datasets_are_frozen():
    ds = D.range(10).shuffle(10, seed=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.plan.seed = 2
    with pytest.raises(AttributeError, match="frozen"):
        ds.anything = 1
    assert ds.shuffle_seeds() == [1]


def test_walk_is_parents_first_and_repeats_shared_nodes():
    a = D.range(3)
    ds = a.concatenate(a).map(abs)
    names = [n.name for n in ds.plan.walk()]
    assert names == ["range", "range", "concatenate", "map"]


def test_with_shuffle_seeds_returns_a_new_plan_and_keeps_the_old_one():
    base = D.range(20).map(abs)
    ds = base.shuffle(20, seed=1).batch(5).shuffle(4, seed=2)
    other = ds.with_shuffle_seeds([7, 8])
    assert ds.shuffle_seeds() == [1, 2] and other.shuffle_seeds() == [7, 8]
    assert other.fingerprint() != ds.fingerprint()  # given seeds are part of the pipeline
    assert other.plan.parent.parent.parent is base.plan  # below the shuffles: shared
    assert ds.with_shuffle_seeds([1, 2]) is ds  # the seeds it has: nothing new
    with pytest.raises(pk.errors.InputError, match="2 shuffles but 1 seeds"):
        ds.with_shuffle_seeds([3])


def test_drawn_seeds_stay_out_of_the_fingerprint_and_change_the_order():
    a, b = D.range(50).shuffle(50), D.range(50).shuffle(50)
    assert a.fingerprint() == b.fingerprint()
    same = b.with_shuffle_seeds(a.shuffle_seeds())
    assert [int(x) for x in same] == [int(x) for x in a]
    assert same.fingerprint() == a.fingerprint()


def test_every_op_describes_itself_and_nothing_dispatches_on_names():
    ds = D.range(4).map(abs, num_parallel_calls=2).batch(2)
    assert ds.plan.describe() == ("batch(deterministic=None, drop=False, fn=stack, "
                                  "parallel=None, size=2)|")
    assert ds.plan.parent.describe() == "map(deterministic=None, fn=abs, parallel=2)|"
    assert repr(ds.plan).startswith("<Batch batch(")
    assert isinstance(ds.plan, ops.Batch) and isinstance(ds.plan.parent, ops.Map)


def test_demand_reads_the_random_access_segment_only():
    ds = (D.range(64).map(abs, num_parallel_calls=3, deterministic=False).batch(4).batch(2)
          .prefetch(5))
    demand = ds.plan.demand()
    assert demand.asked == (3,) and not demand.ordered and demand.prefetch == (5,)
    assert demand.elements_per_item == 8
    assert ds.plan.asks_for_workers(explicitly=True)
    cached = D.range(8).map(abs, num_parallel_calls=2).cache().batch(2)
    assert not cached.plan.asks_for_workers()  # the cache's reader is another segment
    assert cached.plan.asks_for_workers(whole_plan=True)
