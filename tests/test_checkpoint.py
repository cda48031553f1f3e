"""Checkpoints in one process: exact resume, integrity, retention, NaN handling, Keras faces."""

import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

import podkit as pk
from helpers import StepLosses, StopAt, seed_model
from podkit.checkpoint import CheckpointManager

ONE = jax.devices()[:1]


def learned(history):
    """History without its timing entry (input_wait is wall-clock)."""
    return {k: v for k, v in history.history.items() if k != "input_wait"}


def params_of(model):
    return [np.asarray(a) for a in jax.tree.leaves(model.state.params)]


def train(digits, epochs=3, checkpoint=None, callbacks=(), **kwargs):
    (x, y), _ = digits
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = seed_model(steps_per_execution=4)
    rec = StepLosses()
    history = model.fit(x[:1024], y[:1024], batch_size=64, epochs=epochs, verbose=0,
                        callbacks=[rec, *callbacks], log_every=4, checkpoint=checkpoint,
                        **kwargs)
    return model, history, rec.losses


def interrupted(digits, directory, stop, **manager_kwargs):
    with pytest.raises(KeyboardInterrupt):
        train(digits, checkpoint=CheckpointManager(directory, **manager_kwargs),
              callbacks=[StopAt(stop)])


def test_resume_mid_epoch_is_bitwise_exact(digits, tmp_path):
    """Interrupted at step 28 (epoch 2 of 3, 16 steps per epoch), resumed from step 24: the
    same parameters bit for bit, the same losses, the same History as an uninterrupted run."""
    whole, whole_history, whole_losses = train(digits)
    interrupted(digits, tmp_path / "ck", stop=28, every_steps=8)
    steps = [i.step for i in CheckpointManager(tmp_path / "ck").steps() if i.valid]
    assert 24 in steps and max(steps) < 32
    resumed, history, losses = train(digits, checkpoint=tmp_path / "ck")
    assert int(resumed.state.step) == 48
    assert all(np.array_equal(a, b) for a, b in zip(params_of(whole), params_of(resumed),
                                                    strict=True))
    assert learned(history) == learned(whole_history)
    assert losses == whole_losses[-len(losses):] and len(losses) >= 5


def test_a_finished_run_resumes_at_its_end(digits, tmp_path):
    model, history, _ = train(digits, epochs=2, checkpoint=tmp_path / "ck")
    again, again_history, losses = train(digits, epochs=2, checkpoint=tmp_path / "ck")
    assert losses == []  # nothing left to train
    assert learned(again_history) == learned(history)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(model), params_of(again),
                                                    strict=True))
    # Without its own checkpoint, a run can start from another's (resume=PATH).
    more, _, losses = train(digits, epochs=3, resume=tmp_path / "ck")
    assert int(more.state.step) == 48 and len(losses) == 4


def _newest_data_file(step_dir: Path) -> Path:
    """The biggest array file of a step (a kernel's or its optimizer moment's chunk)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["flip", "truncate", "no_commit", "bad_commit"])
def test_a_damaged_newest_checkpoint_is_reported_and_skipped(digits, tmp_path, damage):
    interrupted(digits, tmp_path / "ck", stop=20, every_steps=8)
    manager = CheckpointManager(tmp_path / "ck")
    assert manager.latest() == 16
    newest = tmp_path / "ck" / "step_0000000016"
    if damage == "flip":
        f = _newest_data_file(newest)
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "truncate":
        f = _newest_data_file(newest)
        f.write_bytes(f.read_bytes()[:-7])
    elif damage == "no_commit":
        (newest / "COMMIT.json").unlink()
    else:
        (newest / "COMMIT.json").write_text("{not json")
    infos = {i.step: i for i in manager.steps()}
    expected = "incomplete" if damage == "no_commit" else "corrupt"
    assert infos[16].status == expected and infos[8].valid
    if damage == "flip":
        assert "checksum" in infos[16].reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, _, losses = train(digits, checkpoint=tmp_path / "ck")
    # resumed from step 8: the executions after it are trained (8 steps left in epoch 1)
    assert len(losses) == (48 - 8) // 4
    if damage in ("flip", "truncate", "bad_commit"):
        assert any("skipping checkpoint step 16" in str(w.message) for w in caught)


def test_restore_never_unpickles(digits, tmp_path, monkeypatch):
    interrupted(digits, tmp_path / "ck", stop=12, every_steps=8)

    def refuse(*a, **k):
        raise AssertionError("a checkpoint read called pickle")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    model, _, _ = train(digits, checkpoint=tmp_path / "ck")
    assert int(model.state.step) == 48


def test_keep_and_keep_every(digits, tmp_path):
    train(digits, epochs=3, checkpoint=CheckpointManager(tmp_path / "ck", every_steps=4, keep=2,
                                                         keep_every=16))
    manager = CheckpointManager(tmp_path / "ck")
    assert [i.step for i in manager.steps()] == [16, 32, 44, 48]
    digests = {manager.digest(step) for step in (16, 32, 48)}
    assert len(digests) == 3 and manager.digest() == manager.digest(48)


def test_cli_digest_of_a_missing_step_names_the_steps_there_are(digits, tmp_path):
    """`podkit checkpoint digest DIR --step N` for a step DIR does not hold: an error naming
    the steps it does hold (the valid ones, the incomplete one apart), not "interrupted"; a
    step directory without its commit record is still reported as incomplete."""
    interrupted(digits, tmp_path / "ck", stop=20, every_steps=8)  # steps 8 and 16
    (tmp_path / "ck" / "step_0000000016" / "COMMIT.json").unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODKIT_")}

    def digest(*args):
        return subprocess.run([sys.executable, "-m", "podkit.cli", "checkpoint", "digest",
                               str(tmp_path / "ck"), *args],
                              capture_output=True, text=True, env=env, timeout=120)

    missing = digest("--step", "5")
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert missing.stderr.startswith("podkit: error: "), missing.stderr
    assert "Traceback" not in missing.stderr and "interrupted" not in missing.stderr
    assert (f"{tmp_path / 'ck'} has no checkpoint step 5; its steps are 8 (valid); "
            "16 (incomplete). Pass a valid one, or leave --step out for the newest valid "
            "one.") in missing.stderr
    incomplete = digest("--step", "16")
    assert incomplete.returncode == 2, incomplete.stdout + incomplete.stderr
    assert f"checkpoint step 16 in {tmp_path / 'ck'} is incomplete: no commit record: the " \
        "save was interrupted" in incomplete.stderr
    valid = digest("--step", "8")
    assert valid.returncode == 0, valid.stderr
    assert len(valid.stdout.splitlines()[-1]) == 32
    assert valid.stdout.splitlines()[-1] == CheckpointManager(tmp_path / "ck").digest(8)[1]


def test_digest_of_a_missing_step_in_python(tmp_path):
    manager = CheckpointManager(tmp_path / "empty")
    with pytest.raises(pk.InputError, match=r"has no checkpoint step 5; it holds no "
                                            r"checkpoints\.$"):
        manager.digest(5)


def test_on_nan_stop_names_the_step(digits, tmp_path):
    (x, y), _ = digits
    x = x[:1024].copy()
    x[320:384] = np.nan  # batch 5 of epoch 0 under no shuffle
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = seed_model(steps_per_execution=4)
    with pytest.raises(pk.errors.TrainingError, match=r"steps 5-8 \(epoch 1"):
        model.fit(x, y[:1024], batch_size=64, epochs=2, verbose=0, shuffle=False,
                  on_nan="stop")


def test_on_nan_rollback_skips_the_bad_batches(digits, tmp_path):
    (x, y), _ = digits
    x = x[:1024].copy()
    x[320:384] = np.nan
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = seed_model(steps_per_execution=4)
    with pytest.warns(UserWarning, match="rolled back to step 4"):
        history = model.fit(x, y[:1024], batch_size=64, epochs=2, verbose=0, shuffle=False,
                            on_nan="rollback",
                            checkpoint=CheckpointManager(tmp_path / "ck", every_steps=4))
    assert all(np.isfinite(a).all() for a in params_of(model))
    # epoch 0 skipped one execution (4 steps) that second epoch's same rows skip again? No:
    # the skip is by (epoch, execution), so epoch 1 meets the NaN rows and rolls back too.
    assert np.isfinite(history.history["loss"]).all()
    assert int(model.state.step) == 32 - 8


def test_rollback_needs_a_checkpoint():
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = seed_model()
    x = np.zeros((64, 64), np.float32)
    with pytest.raises(pk.ConfigError, match="rollback"):
        model.fit(x, np.zeros(64, np.int32), on_nan="rollback", verbose=0)
    with pytest.raises(pk.ConfigError, match="on_nan='skip'"):
        model.fit(x, np.zeros(64, np.int32), on_nan="skip", verbose=0)


def test_model_checkpoint_saves_the_best_only(digits, tmp_path):
    (x, y), (vx, vy) = digits
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = seed_model()
    best = pk.callbacks.ModelCheckpoint(tmp_path / "best", monitor="val_accuracy",
                                        save_best_only=True)
    history = model.fit(x, y, batch_size=64, epochs=4, verbose=0, validation_data=(vx, vy),
                        callbacks=[best])
    acc = history.history["val_accuracy"]
    best_epoch = int(np.argmax(acc))
    (only,) = CheckpointManager(tmp_path / "best").steps()
    assert only.valid and only.step == (best_epoch + 1) * -(-len(x) // 64)
    meta = json.loads((tmp_path / "best" / f"step_{only.step:010d}" / "meta.json").read_text())
    assert meta["history"]["history"]["val_accuracy"][-1] == max(acc)


def test_backup_and_restore_resumes_and_cleans_up(digits, tmp_path):
    backup = tmp_path / "backup"
    with pytest.raises(KeyboardInterrupt):
        train(digits, callbacks=[pk.callbacks.BackupAndRestore(backup), StopAt(20)])
    assert CheckpointManager(backup).latest() == 16  # epoch 1's end
    model, history, losses = train(digits, callbacks=[pk.callbacks.BackupAndRestore(backup)])
    assert len(losses) == 8 and len(history.history["loss"]) == 3
    assert not any(p.is_file() for p in backup.rglob("*"))  # deleted after success


@pytest.mark.parametrize("bad, match", [
    (dict(every_steps=0), "every_steps=0"),
    (dict(keep=-1), "keep=-1"),
    (dict(every_steps=2.5), "every_steps=2.5"),
    (dict(every_seconds="1"), "every_seconds='1'"),
])
def test_bad_manager_arguments(tmp_path, bad, match):
    with pytest.raises(pk.ConfigError, match=match):
        CheckpointManager(tmp_path, **bad)


def test_bad_checkpoint_arguments(digits, tmp_path):
    with pytest.raises(pk.ConfigError, match="checkpoint=123"):
        train(digits, checkpoint=123)
    with pytest.raises(pk.InputError, match="holds no valid checkpoint"):
        train(digits, resume=tmp_path / "nothing")
    with pytest.raises(pk.ConfigError, match="directory"):
        pk.callbacks.ModelCheckpoint("model-{epoch:02d}")
    with pytest.raises(pk.ConfigError, match="save_weights"):
        pk.callbacks.ModelCheckpoint(tmp_path, save_weights_only=True)
    with pytest.raises(pk.ConfigError, match=r"\.weights\.h5"):
        pk.callbacks.ModelCheckpoint("best.keras", save_weights_only=True)
    with pytest.raises(pk.ConfigError, match="save_weights_only=True"):
        pk.callbacks.ModelCheckpoint("w.weights.h5")
    with pytest.raises(pk.ConfigError, match="keep="):
        pk.callbacks.ModelCheckpoint("best.keras", keep=2)


def test_model_checkpoint_writes_keras_files_as_keras_does(digits, tmp_path):
    """A Keras file name: model.save / save_weights of that file, the name filled from the
    epoch (1-based) and its logs; the best only when the monitor improved."""
    (x, y), (vx, vy) = digits
    with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
        model = seed_model()
    every = pk.callbacks.ModelCheckpoint(str(tmp_path / "ep{epoch:02d}-{loss:.3f}.keras"),
                                         monitor="loss")
    best = pk.callbacks.ModelCheckpoint(str(tmp_path / "best.weights.h5"), monitor="val_loss",
                                        save_best_only=True, save_weights_only=True)
    history = model.fit(x[:256], y[:256], batch_size=64, epochs=2, verbose=0,
                        validation_data=(vx, vy), callbacks=[every, best])
    losses = history.history["loss"]
    names = sorted(p.name for p in tmp_path.glob("ep*.keras"))
    assert names == [f"ep{e + 1:02d}-{losses[e]:.3f}.keras" for e in range(2)]
    reloaded = pk.models.load_model(tmp_path / names[-1])
    np.testing.assert_allclose(reloaded.predict(vx[:8], verbose=0),
                               model.predict(vx[:8], verbose=0), rtol=1e-5, atol=1e-6)
    assert (tmp_path / "best.weights.h5").is_file()


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()})")


@pytest.mark.parametrize("failure", ["no_space", "read_only"])
def test_a_failing_disk_is_a_clear_error_and_loses_no_checkpoint(digits, tmp_path, failure):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "3m")
    try:
        train(digits, epochs=1, checkpoint=disk / "ck")  # one good checkpoint (step 16)
        good = CheckpointManager(disk / "ck").steps()
        assert [i.step for i in good] == [16] and good[0].valid
        if failure == "no_space":
            with open(disk / "filler", "wb") as f:  # fill the rest of the 3 MB
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            match = "disk is full"
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            match = "read-only"
        with pytest.raises(pk.checkpoint.StorageError, match=match):
            train(digits, epochs=2, checkpoint=disk / "ck")
        after = CheckpointManager(disk / "ck").steps()
        assert [(i.step, i.status) for i in after if i.step == 16] == [(16, "valid")]
        restored, _, _ = train(digits, epochs=1, resume=disk / "ck")
        assert int(restored.state.step) == 16
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _scaled(x, y):
    return x * 0.5, y


def test_a_pk_data_pipeline_resumes_mid_epoch_exactly(digits, tmp_path):
    """A pipeline with a map is fed batch by batch (not staged): its iterator state is saved
    per execution and restored, so the resumed run sees exactly the remaining batches."""
    (x, y), _ = digits

    def pipeline():
        return (pk.data.Dataset.from_tensor_slices((x[:1024], y[:1024])).shuffle(1024, seed=3)
                .map(_scaled).batch(64))

    def fit(checkpoint=None, callbacks=()):
        with pk.Strategy(mesh={"data": 1}, devices=ONE).scope():
            model = seed_model(steps_per_execution=4)
        rec = StepLosses()
        history = model.fit(pipeline(), epochs=3, verbose=0, callbacks=[rec, *callbacks],
                            log_every=4, checkpoint=checkpoint)
        return model, history, rec.losses

    whole, whole_history, whole_losses = fit()
    with pytest.raises(KeyboardInterrupt):
        fit(CheckpointManager(tmp_path / "ck", every_steps=8), callbacks=[StopAt(28)])
    resumed, history, losses = fit(tmp_path / "ck")
    assert int(resumed.state.step) == int(whole.state.step) == 48
    assert losses == whole_losses[-len(losses):] and len(losses) == 6
    assert learned(history) == learned(whole_history)
    assert all(np.array_equal(a, b) for a, b in zip(params_of(whole), params_of(resumed),
                                                    strict=True))
