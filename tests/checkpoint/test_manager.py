"""podkit.checkpoint.manager: what the loop and the callbacks rely on without a model."""

from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit.checkpoint import CheckpointManager


def test_coerce_keeps_a_manager_as_it_is(tmp_path):
    manager = CheckpointManager(tmp_path, every_steps=7, keep=1)
    assert CheckpointManager.coerce(manager, every_steps=2, keep=5) is manager
    assert (manager.every_steps, manager.keep) == (7, 1)


@pytest.mark.parametrize("as_given", [str, Path])
def test_coerce_makes_a_manager_for_a_directory(tmp_path, as_given):
    manager = CheckpointManager.coerce(as_given(tmp_path / "c"), every_steps=4, keep=2)
    assert isinstance(manager, CheckpointManager)
    assert (manager.every_steps, manager.keep, manager.every_seconds) == (4, 2, None)
    assert manager.storage.local_dir() == tmp_path / "c"
    fit_default = CheckpointManager.coerce(str(tmp_path / "d"))  # as fit(checkpoint=...)
    assert (fit_default.every_steps, fit_default.keep) == (None, 3)


def test_coerce_names_the_argument_it_refuses():
    with pytest.raises(pk.ConfigError, match=r"^checkpoint=123: pass a directory"):
        CheckpointManager.coerce(123)
    with pytest.raises(pk.ConfigError, match=r"^ModelCheckpoint\(None\): pass a directory"):
        CheckpointManager.coerce(None, said="ModelCheckpoint(None)")
    with pytest.raises(pk.ConfigError, match=r"^BackupAndRestore\(3\.5\): pass a directory"):
        pk.callbacks.BackupAndRestore(3.5)


def _sharded(values, devices):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("x",))
    return jax.device_put(values, NamedSharding(mesh, PartitionSpec("x")))


@pytest.mark.parametrize("how", ["views", "device-copy", "host-copy"])
@pytest.mark.parametrize("ndev", [1, 8])
def test_a_save_keeps_what_it_was_given_while_the_caller_donates_the_buffers(
        tmp_path, monkeypatch, how, ndev):
    """save() returns before the bytes are written; a donating step right after it must not
    change what is saved, whether the save wrote zero-copy views of computed arrays,
    dispatched a device copy of ones still being computed, or (an accelerator's way, taken
    here by saying the devices are not host memory) started a copy into pinned host memory
    that the save thread awaits."""
    import jax

    from podkit.checkpoint import arrays

    monkeypatch.setattr(arrays, "computed", lambda a: how == "views")
    if how == "host-copy":
        monkeypatch.setattr(arrays, "on_host", lambda flat: False)
        started = []
        real = arrays.copy_to_host
        monkeypatch.setattr(arrays, "copy_to_host",
                            lambda flat: started.append(1) or real(flat))
    values = np.arange(8 * 4096 * 64, dtype=np.float32).reshape(8 * 4096, 64)
    tree = {"w": _sharded(values, jax.devices()[:ndev]), "n": jax.numpy.int32(3)}
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                           sharding=a.sharding), tree)
    step = jax.jit(lambda t: jax.tree.map(lambda a: a * 2 + 1, t), donate_argnums=0)
    jax.block_until_ready(step(jax.tree.map(lambda a: a.copy(), tree)))  # compiled: no delay
    manager = CheckpointManager(tmp_path, keep=1)
    manager.save(1, tree, meta={})
    for _ in range(3):
        tree = step(tree)
    jax.block_until_ready(tree)
    manager.wait()
    restored = manager.restore(abstract)
    np.testing.assert_array_equal(np.asarray(restored.tree["w"]), values)
    assert int(restored.tree["n"]) == 3
    assert not np.array_equal(np.asarray(tree["w"]), values)
    assert manager.last_blocking_s < manager.last_commit_s
    if how == "host-copy":
        assert started == [1]
    manager.close()


def test_file_checksums_are_the_same_read_or_mapped(tmp_path):
    from podkit.checkpoint import format as fmt

    rng = np.random.default_rng(0)
    for name, size in (("empty", 0), ("small", 5), ("odd", (16 << 20) + 3)):
        path = tmp_path / name
        data = rng.bytes(size)
        path.write_bytes(data)
        want = fmt.hash_bytes(data)
        assert fmt.hash_file(path) == fmt.hash_file(path, sync=True, mapped=True) == want
