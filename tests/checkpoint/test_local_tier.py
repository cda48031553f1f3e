"""The local checkpoint tier in one process: shards packed and rebuilt, saves, damage, choice.

The two-process behaviour (the peer's copy, the reverse transfer, a lost tier after SIGKILL)
is in tests/test_checkpoint_tiers.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import podkit as pk
from podkit import config as config_lib
from podkit.checkpoint import CheckpointManager, peer, shards, tiers
from podkit.checkpoint.local_tier import DATA, DONE, LocalTier


def _tree():
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
    return {
        "w": jax.device_put(jnp.arange(32, dtype=jnp.float32).reshape(8, 4),
                            NamedSharding(mesh, P("a", "b"))),
        "h": jax.device_put(jnp.arange(6, dtype=jnp.bfloat16), NamedSharding(mesh, P())),
        "m": jax.device_put(jnp.array([True, False, True]), NamedSharding(mesh, P())),
        "i": jax.device_put(jnp.arange(4, dtype=jnp.int8), NamedSharding(mesh, P("b"))),
        "k": jax.random.key_data(jax.random.key(3)),
        "s": jnp.float32(2.5),
    }


def _abstract(tree):
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
            for k, v in tree.items()}


def test_shards_are_packed_once_each_and_rebuilt_bit_for_bit():
    tree = _tree()
    plan = shards.layout(tree)[0]
    # w: 4 distinct shards; h, m, k, s replicated on 4 devices: one copy each; i: 2 shards
    assert [len(plan["arrays"][n]["shards"]) for n in ("w", "h", "m", "i", "k", "s")] == \
        [4, 1, 1, 2, 1, 1]
    data = np.asarray(shards.pack(tree, plan, peer.padded(plan["length"]))).tobytes()
    assert shards.check(_abstract(tree), plan, 0) is None
    back = shards.rebuild(_abstract(tree), plan, data)
    for name, a in tree.items():
        assert back[name].dtype == a.dtype and back[name].sharding == a.sharding, name
        np.testing.assert_array_equal(np.asarray(back[name]), np.asarray(a), err_msg=name)


def test_check_names_what_does_not_fit():
    tree = _tree()
    plan = shards.layout(tree)[0]
    wrong = dict(_abstract(tree), w=jax.ShapeDtypeStruct((8, 2), jnp.float32,
                                                           sharding=tree["w"].sharding))
    assert "w was (8, 4) float32" in shards.check(wrong, plan, 0)
    fewer = {k: v for k, v in _abstract(tree).items() if k != "s"}
    assert "unexpected ['s']" in shards.check(fewer, plan, 0)
    more = dict(_abstract(tree), extra=jax.ShapeDtypeStruct((2,), jnp.float32,
                                                          sharding=tree["h"].sharding))
    assert "missing ['extra']" in shards.check(more, plan, 0)
    assert shards.check(more, plan, 0, optional=("ext",)) is None  # read as zeros


def _saved(tmp_path, steps, keep=2):
    manager = CheckpointManager(tmp_path / "ck", local_every_steps=1, local_dir=tmp_path / "lt",
                                local_keep=keep)
    tree = _tree()
    for step in steps:
        manager.local.save(step, {"state": tree}, meta={"note": step},
                           data_state={"pos": step})
    manager.wait()
    return manager, tree


def test_a_local_save_is_whole_and_keeps_the_newest(tmp_path):
    manager, tree = _saved(tmp_path, [3, 5, 7])
    local = manager.local
    assert local.steps() == [5, 7]  # local_keep = 2
    record, data = local.read_part(7, 0)
    assert (record["step"], record["processes"], record["meta"]["note"],
            record["data_state"]) == (7, 1, 7, {"pos": 7})
    restored, tier = tiers.restore_newest(manager, {"state": _abstract(tree)})
    assert (tier, restored.step, restored.data_states) == ("local", 7, [{"pos": 7}])
    for name, a in tree.items():
        np.testing.assert_array_equal(np.asarray(restored.tree["state"][name]), np.asarray(a))


def test_a_damaged_or_incomplete_local_step_gives_way_to_the_previous(tmp_path, capsys):
    manager, tree = _saved(tmp_path, [5, 7, 9], keep=3)
    part = manager.local.root / "step_0000000009" / "part_0"
    blob = bytearray((part / DATA).read_bytes())
    blob[3] ^= 1
    (part / DATA).write_bytes(bytes(blob))
    (manager.local.root / "step_0000000007" / "part_0" / DONE).unlink()
    restored, tier = tiers.restore_newest(manager, {"state": _abstract(tree)})
    assert (tier, restored.step) == ("local", 5)
    said = capsys.readouterr().out
    assert "local step 9 is not usable" in said and "does not match its size or checksum" in said
    assert "local step 7 is not usable" in said and "incomplete" in said


def test_the_newer_persistent_step_wins(tmp_path, capsys):
    manager, tree = _saved(tmp_path, [4])
    manager.save(6, {"state": tree}, meta={}, data_state=None)
    manager.wait()
    restored, tier = tiers.restore_newest(manager, {"state": _abstract(tree)})
    assert (tier, restored.step) == ("persistent", 6)
    said = capsys.readouterr().out
    assert "restoring from the persistent tier" in said
    assert "the persistent tier's step 6 is newer than the local tier's step 4" in said


def test_local_tier_arguments_are_checked(tmp_path):
    with pytest.raises(pk.ConfigError, match="local_every_steps=0"):
        CheckpointManager(tmp_path, local_every_steps=0)
    with pytest.raises(pk.ConfigError, match="local_keep=0"):
        CheckpointManager(tmp_path, local_every_steps=2, local_keep=0)
    with pytest.raises(pk.ConfigError, match="not a URL"):
        LocalTier("gs://b/x", every_steps=2)
    default = CheckpointManager(tmp_path / "a", local_every_steps=2).local.directory
    assert default == CheckpointManager(tmp_path / "a", local_every_steps=3).local.directory
    assert default != CheckpointManager(tmp_path / "b", local_every_steps=2).local.directory
    for key, value, said in (("local_every_steps", -1, r"use 0 \(off\)"),
                             ("local_keep", 0, "keep at least 1 local"),
                             ("local_dir", "s3://b/x", "URLs are for checkpoint.dir")):
        cfg = config_lib.Config()
        setattr(cfg.checkpoint, key, value)
        with pytest.raises(pk.ConfigError, match=said):
            config_lib.validate(cfg)
    assert config_lib.Config().checkpoint.local_keep == 2


def test_a_resume_may_turn_the_local_tier_on():
    from podkit import runs

    notes = runs.resume_changes(config_lib.to_toml(config_lib.from_dict({})),
                                config_lib.from_dict({"checkpoint": {"local_every_steps": 50}}),
                                40, lambda t: 100)
    assert "checkpoint.local_every_steps: 0 -> 50 (applied from step 40)" in notes
