"""podkit.checkpoint.manager: what the loop and the callbacks rely on without a model."""

from pathlib import Path

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
