"""train/feeds/position.py: DataPosition, and its round trip through a checkpoint's stored form
(the meta record's "position" and each manifest's "data_state", unchanged since issue 9)."""

import json

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.checkpoint import format as fmt
from podkit.checkpoint.manager import CheckpointManager
from podkit.train.feeds import DataPosition


def test_the_stored_form_is_the_one_checkpoints_have_always_held():
    pos = DataPosition(epoch=2, execution=5, steps_in_epoch=20, iterator={"pass": 1})
    assert pos.stored() == {"epoch": 2, "execution": 5, "steps_in_epoch": 20}
    assert DataPosition.from_checkpoint(pos.stored(), [{"pass": 1}]) == pos
    # arrays need no iterator: every saving process stored None
    assert DataPosition.from_checkpoint({"epoch": 1, "execution": 0, "steps_in_epoch": 0},
                                        [None]) == DataPosition(1)
    assert DataPosition() == DataPosition(0, 0, 0, None)


def test_iterator_states_resume_on_the_same_process_count_only():
    stored = {"epoch": 0, "execution": 1, "steps_in_epoch": 1}
    with pytest.raises(pk.ConfigError, match="input positions of 2 processes"):
        DataPosition.from_checkpoint(stored, [{"a": 1}, {"a": 2}])
    # without iterator states (arrays, in-memory datasets) any process count resumes
    assert DataPosition.from_checkpoint(stored, [None, None, None]).iterator is None


def test_a_position_round_trips_through_a_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path / "ckpt", async_save=False)
    pos = DataPosition(epoch=3, execution=2, steps_in_epoch=8,
                       iterator={"source": {"index": 17}, "epoch": 3})
    tree = {"w": jax.device_put(np.arange(4.0, dtype=np.float32))}
    manager.save(7, tree, meta={"position": pos.stored()}, data_state=pos.iterator)
    # on storage: exactly the fields checkpoints held before DataPosition
    step_dir = tmp_path / "ckpt" / fmt.step_dir(7)
    meta = json.loads((step_dir / fmt.META).read_text())
    assert meta["position"] == {"epoch": 3, "execution": 2, "steps_in_epoch": 8}
    manifest = json.loads((step_dir / fmt.manifest_name(0)).read_text())
    assert manifest["data_state"] == {"source": {"index": 17}, "epoch": 3}
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                           sharding=a.sharding), tree)
    restored = manager.restore(abstract)
    assert DataPosition.from_checkpoint(restored.meta["position"], restored.data_states) == pos


def test_a_resumed_fit_continues_from_the_stored_position(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    y = (x.sum(1) > 0).astype(np.int32)

    def model():
        m = pk.Sequential([pk.layers.Dense(2, activation="softmax")])
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return m

    ckpt = CheckpointManager(tmp_path / "run", every_steps=3, async_save=False)
    model().fit(x, y, batch_size=16, epochs=1, checkpoint=ckpt, verbose=0)
    step3 = json.loads((tmp_path / "run" / fmt.step_dir(3) / fmt.META).read_text())
    assert step3["position"] == {"epoch": 0, "execution": 3, "steps_in_epoch": 3}
    final = json.loads((tmp_path / "run" / fmt.step_dir(4) / fmt.META).read_text())
    assert final["position"] == {"epoch": 1, "execution": 0, "steps_in_epoch": 0}
