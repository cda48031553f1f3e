"""podkit.checkpoint.arrays: a pytree as named flat arrays, on disk and back, checked first."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk
from podkit.checkpoint import arrays


def _tree():
    return {"params": {"layers": [{"kernel": jnp.arange(6.0).reshape(2, 3)},
                                  {"bias": jnp.ones(3, jnp.bfloat16)}],
                       "a.b": jnp.zeros((), jnp.int32)},
            "rng": jax.random.key(7)}


def _abstract(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        tree)


def test_flatten_names_leaves_by_path_and_stores_keys_as_raw_data():
    flat = arrays.flatten(_tree())
    assert sorted(flat) == ["params.a%2Eb", "params.layers.0.kernel", "params.layers.1.bias",
                            "rng"]
    assert flat["rng"].dtype == jnp.uint32  # a typed key is stored as its raw data
    np.testing.assert_array_equal(flat["rng"], jax.random.key_data(jax.random.key(7)))


def test_unflatten_inverts_flatten_with_typed_keys():
    tree = _tree()
    back = arrays.unflatten(_abstract(tree), arrays.flatten(tree))
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    np.testing.assert_array_equal(back["params"]["layers"][0]["kernel"],
                                  tree["params"]["layers"][0]["kernel"])
    assert back["params"]["layers"][1]["bias"].dtype == jnp.bfloat16
    assert jax.dtypes.issubdtype(back["rng"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(back["rng"]),
                                  jax.random.key_data(tree["rng"]))


def test_abstract_targets_turn_typed_keys_into_their_data_and_keep_shardings():
    tree = _tree()
    targets, keys = arrays.abstract_targets(_abstract(tree))
    assert set(targets) == set(arrays.flatten(tree))
    assert set(keys) == {"rng"}
    data = jax.random.key_data(tree["rng"])
    assert (targets["rng"].shape, targets["rng"].dtype) == (data.shape, data.dtype)
    assert targets["params.layers.0.kernel"].shape == (2, 3)
    assert targets["params.layers.0.kernel"].sharding == tree["params"]["layers"][0][
        "kernel"].sharding


def test_write_then_read_round_trip(tmp_path):
    tree = _tree()
    arrays.write_arrays(tmp_path / "a", tree)
    saved = arrays.saved_arrays(tmp_path / "a")
    assert set(saved) == set(arrays.flatten(tree))
    back = arrays.read_arrays(tmp_path / "a", _abstract(tree))
    for got, want in zip(jax.tree.leaves(arrays.flatten(back)),
                         jax.tree.leaves(arrays.flatten(tree)), strict=True):
        np.testing.assert_array_equal(got, want)


def test_partial_read_leaves_the_rest_unread(tmp_path):
    tree = _tree()
    arrays.write_arrays(tmp_path / "a", tree)
    part = {"params": {"layers": [{"kernel": tree["params"]["layers"][0]["kernel"]}]}}
    with pytest.raises(pk.InputError, match=r"unexpected \['params.a%2Eb'"):
        arrays.read_arrays(tmp_path / "a", _abstract(part))
    back = arrays.read_arrays(tmp_path / "a", _abstract(part), partial=True)
    np.testing.assert_array_equal(back["params"]["layers"][0]["kernel"],
                                  part["params"]["layers"][0]["kernel"])


def test_a_shape_or_dtype_mismatch_names_the_array(tmp_path):
    tree = _tree()
    arrays.write_arrays(tmp_path / "a", tree)
    abstract = _abstract(tree)
    k = abstract["params"]["layers"][0]["kernel"]
    abstract["params"]["layers"][0]["kernel"] = jax.ShapeDtypeStruct((3, 2), k.dtype,
                                                                      sharding=k.sharding)
    with pytest.raises(pk.InputError, match=r"params.layers.0.kernel .* has shape \(2, 3\).*"
                                            r"needs \(3, 2\)"):
        arrays.read_arrays(tmp_path / "a", abstract)
    abstract = _abstract(tree)
    abstract["params"]["layers"][1]["bias"] = jax.ShapeDtypeStruct((3,), jnp.float32)
    with pytest.raises(pk.InputError, match=r"params.layers.1.bias .*needs \(3,\) float32"):
        arrays.read_arrays(tmp_path / "a", abstract)


def test_a_missing_array_and_an_unreadable_directory_are_input_errors(tmp_path):
    tree = _tree()
    arrays.write_arrays(tmp_path / "a", tree)
    bigger = dict(_abstract(tree), extra=jax.ShapeDtypeStruct((1,), jnp.float32))
    with pytest.raises(pk.InputError, match=r"missing \['extra'\]"):
        arrays.read_arrays(tmp_path / "a", bigger)
    (tmp_path / "empty").mkdir()
    with pytest.raises(pk.InputError, match="does not hold readable podkit arrays"):
        arrays.saved_arrays(tmp_path / "empty")


def test_digest_covers_the_prefixed_arrays_only(tmp_path):
    state = {"state": {"params": {"w": jnp.arange(4.0)}, "opt_state": {"m": jnp.zeros(4)},
                       "step": jnp.array(3)}}
    arrays.write_arrays(tmp_path / "a", state)
    state["state"]["step"] = jnp.array(9)  # not under the digest's prefixes
    arrays.write_arrays(tmp_path / "b", state)
    state["state"]["params"]["w"] = jnp.arange(4.0) + 1
    arrays.write_arrays(tmp_path / "c", state)
    a, b, c = (arrays.digest_arrays(tmp_path / d) for d in "abc")
    assert a == b != c
    assert len(a) == 32  # xxh3-128, hex


def test_a_snapshot_of_computed_arrays_is_their_buffers_kept_alive():
    """On CPU devices a computed array is pinned in place (no copy); the snapshot outlives
    the original being deleted."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ("x",))
    w = jax.device_put(jnp.arange(8 * 1024.0), NamedSharding(mesh, PartitionSpec("x")))
    flat = jax.block_until_ready({"w": w, "n": jnp.int32(3), "host": np.ones(2)})
    kept = arrays.snapshot(flat)
    assert kept["host"] is flat["host"]
    assert kept["w"].sharding == w.sharding
    assert [s.data.unsafe_buffer_pointer() for s in kept["w"].addressable_shards] == \
        [s.data.unsafe_buffer_pointer() for s in w.addressable_shards]
    w.delete()
    np.testing.assert_array_equal(np.asarray(kept["w"]), np.arange(8 * 1024.0))
    assert int(kept["n"]) == 3


def test_a_snapshot_copies_what_is_still_being_computed(monkeypatch):
    monkeypatch.setattr(arrays, "computed", lambda a: False)
    x = jnp.arange(4.0)
    kept = arrays.snapshot({"x": x})["x"]
    assert kept.unsafe_buffer_pointer() != x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(kept), np.arange(4.0))


def test_optional_arrays_an_older_checkpoint_lacks_read_as_zeros(tmp_path):
    # A checkpoint written before the train step kept its own sums (`sums._steps`): a resume
    # reads them as zeros; any other missing array is still an error.
    arrays.write_arrays(tmp_path / "s", {"sums": {"loss": jnp.ones(())}})
    targets = arrays.abstract_targets(_abstract(
        {"sums": {"loss": jnp.ones(()), "_steps": {"count": jnp.ones(())}}}))[0]
    flat = arrays.read_flat(tmp_path / "s", targets, optional=("sums._steps.",))
    assert float(flat["sums.loss"]) == 1.0 and float(flat["sums._steps.count"]) == 0.0
    with pytest.raises(pk.errors.InputError, match=r"missing \['sums._steps.count'\]"):
        arrays.read_flat(tmp_path / "s", targets)
