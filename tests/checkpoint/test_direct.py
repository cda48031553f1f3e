"""podkit.checkpoint.direct: the zarr files podkit writes, read without Orbax -- the same
arrays Orbax reads, into any sharding; anything else is left to Orbax (read returns None)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from podkit.checkpoint import arrays, direct


def _mesh(shape, names):
    return jax.make_mesh(shape, names, devices=jax.devices()[:int(np.prod(shape))])


def _saved(tmp_path, mesh):
    """Arrays of several dtypes and ranks, sharded over `mesh` (8 devices: the files hold one
    chunk per shard), written the way podkit's checkpoints write them."""
    rng = np.random.default_rng(0)
    sh = lambda *spec: NamedSharding(mesh, P(*spec))
    tree = {
        "w": jax.device_put(rng.standard_normal((16, 12), np.float32), sh("a", "b")),
        "h": jax.device_put(jnp.asarray(rng.standard_normal((8, 6)), jnp.bfloat16), sh("a")),
        "i": jax.device_put(np.arange(24, dtype=np.int32).reshape(2, 12), sh(None, "b")),
        "s": jax.device_put(np.float32(3.5), sh()),
        "k": jax.device_put(jax.random.key_data(jax.random.key(3)), sh()),
    }
    checkpointer = arrays.async_checkpointer()
    checkpointer.save((tmp_path / "state").absolute(), args=ocp.args.PyTreeSave(tree))
    checkpointer.wait_until_finished()
    return tree


def _targets(tree, mesh, specs):
    return {name: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                       sharding=NamedSharding(mesh, P(*specs.get(name, ()))))
            for name, a in tree.items()}


def test_reads_what_orbax_reads_into_another_mesh(tmp_path):
    tree = _saved(tmp_path, _mesh((4, 2), ("a", "b")))
    other = _mesh((2,), ("x",))  # 2 devices, split the other way
    targets = _targets(tree, other, {"w": (None, "x"), "h": ("x",), "i": ("x",)})
    got = direct.read(tmp_path / "state", targets)
    assert got is not None
    for name, want in tree.items():
        assert got[name].dtype == want.dtype and got[name].sharding == targets[name].sharding
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want), err_msg=name)
    via_orbax = ocp.PyTreeCheckpointer().restore(
        (tmp_path / "state").absolute(), args=ocp.args.PyTreeRestore(
            item=targets, restore_args=ocp.checkpoint_utils.construct_restore_args(targets)))
    for name in tree:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(via_orbax[name]))


def test_leaves_compressed_or_incomplete_files_to_orbax(tmp_path):
    tree = _saved(tmp_path, _mesh((4, 2), ("a", "b")))
    targets = _targets(tree, _mesh((1,), ("x",)), {})
    header = tmp_path / "state" / "w" / ".zarray"
    meta = json.loads(header.read_text())
    header.write_text(json.dumps({**meta, "compressor": {"id": "zstd", "level": 1}}))
    assert direct.read(tmp_path / "state", targets) is None
    header.write_text(json.dumps(meta))
    (tmp_path / "state" / "h" / "1.0").unlink()  # a chunk zarr would fill with its fill value
    assert direct.read(tmp_path / "state", targets) is None
    # read_flat still reads them (Orbax): the remaining files are whole
    del targets["h"]
    flat = arrays.read_flat(tmp_path / "state", targets, partial=True)
    np.testing.assert_array_equal(np.asarray(flat["w"]), np.asarray(tree["w"]))
