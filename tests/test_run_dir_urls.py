"""Run directories on gs:// and s3:// (moto's S3 and the GCS emulator, started by the tests):
fit(run_dir=URL) and `podkit train` with run.dir a URL write the run's records to the bucket
(run.json, config.toml, metrics.jsonl, TensorBoard events, final.json; checkpoints under the
URL), a run resumed on another machine (another $PODKIT_CACHE) continues them with each step
once, and `podkit report` and `podkit eval` read the URL. The local copy they are written in
(podkit.paths.Mirror) sends what changed and removes what went."""

import json
import uuid

import numpy as np
import pytest

import podkit as pk
from helpers import fast_xla_env, finish, start_cli
from podkit import paths
from storage_servers import BUCKET

X = np.random.default_rng(0).normal(size=(96, 6)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)


@pytest.fixture(params=["s3", "gs"])
def bucket_dir(request):
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    return f"{request.param}://{BUCKET}/runs-{uuid.uuid4().hex[:10]}"


def _model():
    with pk.Strategy(mesh={"data": 1}, devices=pk.connect().devices[:1]).scope():
        model = pk.Sequential([pk.Input((6,)), pk.layers.Dense(8, activation="relu"),
                               pk.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=1)
    return model


def _steps(url):
    with paths.open(paths.join(url, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f.read().splitlines()]
    return [r["step"] for r in records if not any(k.startswith("val_") for k in r)]


def test_fit_writes_and_resumes_a_run_directory_in_a_bucket(bucket_dir, tmp_path, monkeypatch):
    run = paths.join(bucket_dir, "exp")
    checkpoints = paths.join(run, "checkpoints")
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "machine-a"))
    _model().fit(X, Y, batch_size=32, epochs=2, verbose=0, log_every=1, run_dir=run,
                 checkpoint=checkpoints, validation_data=(X[:32], Y[:32]))
    assert sorted(paths.listdir(run)) == ["checkpoints", "final.json", "fits.jsonl",
                                           "metrics.jsonl", "recompiles.json", "run.json",
                                           "shardings.json", "tensorboard"]
    assert _steps(run) == [1, 2, 3, 4, 5, 6]
    assert paths.listdir(paths.join(run, "tensorboard"))  # the event file
    # Another machine (a fresh cache): the copy is pulled, the checkpoint restored, and
    # metrics.jsonl continues from the restored step.
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "machine-b"))
    again = _model()
    again.fit(X, Y, batch_size=32, epochs=3, verbose=0, log_every=1, run_dir=run,
              checkpoint=checkpoints, validation_data=(X[:32], Y[:32]))
    assert again.steps_trained == 9
    assert _steps(run) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    with paths.open(paths.join(run, "final.json")) as f:
        assert "val_loss" in json.load(f)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with paths.local_copy(paths.join(run, "tensorboard")) as local:
        board = EventAccumulator(local)
        board.Reload()
        assert {e.step for e in board.Scalars("validation/loss")} >= {6, 9}


def test_the_cli_trains_resumes_reports_and_evaluates_a_run_in_a_bucket(gcs, tmp_path):
    """On the GCS emulator (the same path layer serves S3: the fit test runs both)."""
    bucket_dir = f"gs://{BUCKET}/runs-{uuid.uuid4().hex[:10]}"
    config = "configs/seed_mlp.toml"
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    common = ["--set", f"run.dir={bucket_dir}", "--set", "train.steps_per_execution=1",
              "--set", "train.log_every=9", "--cpu-devices", "1"]
    env = {**fast_xla_env(), "PODKIT_CACHE": str(tmp_path / "a")}
    (first,) = finish(start_cli("train", str(root / config), "--set", "train.epochs=1",
                                *common, cwd=tmp_path, **env))
    assert first.returncode == 0, first.stderr[-3000:]
    run = paths.join(bucket_dir, "seed_mlp")
    assert {"config.toml", "data_info.json", "metrics.jsonl", "run.json", "final.json",
            "checkpoints"} <= set(paths.listdir(run))
    assert not list(tmp_path.glob("runs*")) and not (tmp_path / "s3:").exists()
    one_epoch = _steps(run)
    env["PODKIT_CACHE"] = str(tmp_path / "b")  # another machine
    (second,) = finish(start_cli("train", str(root / config), "--set", "train.epochs=2",
                                 *common, cwd=tmp_path, **env))
    assert second.returncode == 0, second.stderr[-3000:]
    steps = _steps(run)
    assert steps[:len(one_epoch)] == one_epoch and len(steps) == 2 * len(one_epoch)
    assert len(set(steps)) == len(steps)
    env["PODKIT_CACHE"] = str(tmp_path / "c")
    report, evaluation = finish(start_cli("report", run, cwd=tmp_path, **env),
                                start_cli("eval", run, "--cpu-devices", "1", cwd=tmp_path,
                                          **env))
    assert report.returncode == 0, report.stderr[-3000:]
    assert f"wrote {run}/report.html" in report.stdout
    assert paths.exists(paths.join(run, "report.html"))
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    assert "accuracy" in evaluation.stdout


def test_a_mirror_sends_what_changed_and_removes_what_went(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    url = f"s3://{BUCKET}/mirror-{uuid.uuid4().hex[:10]}"
    mirror = paths.Mirror(url, skip=("checkpoints",))
    assert mirror.local.is_relative_to(tmp_path / "mirrors")
    assert mirror.pull() == 0
    (mirror.local / "sub").mkdir()
    (mirror.local / "a.txt").write_text("one\n")
    (mirror.local / "sub" / "b.txt").write_text("two\n")
    (mirror.local / "checkpoints").mkdir()
    (mirror.local / "checkpoints" / "c").write_text("never sent")
    assert mirror.push() == 2
    assert mirror.push() == 0  # nothing changed
    with open(mirror.local / "a.txt", "a") as f:
        f.write("more\n")
    (mirror.local / "sub" / "b.txt").unlink()
    assert mirror.push() == 1
    with paths.open(paths.join(url, "a.txt")) as f:
        assert f.read() == "one\nmore\n"
    assert paths.listdir(url) == ["a.txt"]
    # another copy of the same URL elsewhere: pulled equal, stale files removed
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "other"))
    other = paths.Mirror(url, skip=("checkpoints",))
    other.local.mkdir(parents=True)
    (other.local / "stale.txt").write_text("from an earlier run")
    assert other.pull() == 1
    assert sorted(p.name for p in other.local.iterdir()) == ["a.txt"]


def test_what_cannot_be_a_run_directory_is_refused_naming_it(s3):
    url = f"s3://{BUCKET}/file-{uuid.uuid4().hex[:8]}"
    with paths.open(url, "w") as f:
        f.write("not a directory")
    with pytest.raises(pk.ConfigError, match="is an object, not a directory"):
        _model().fit(X, Y, epochs=1, verbose=0, run_dir=url)
    with pytest.raises(pk.ConfigError, match="s3:/b"):
        _model().fit(X, Y, epochs=1, verbose=0, run_dir="s3:/b/run")
    from podkit import runs

    with pytest.raises(pk.ConfigError, match="holds no run directory"):
        runs.read_config(f"s3://{BUCKET}/nothing-{uuid.uuid4().hex[:8]}")


def test_a_failing_fit_pushes_the_records_it_wrote(s3, tmp_path, monkeypatch):
    """On an ephemeral VM the records of a run that failed are what says why: fit() pushes
    them before it raises (not only every 60 s and at epoch ends)."""
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    run = f"s3://{BUCKET}/failing-{uuid.uuid4().hex[:8]}"

    class Breaks(pk.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.model.steps_trained == 10:  # inside the first epoch (12 steps)
                raise RuntimeError("a failure inside the first epoch")

    with pytest.raises(RuntimeError, match="inside the first epoch"):
        _model().fit(X, Y, batch_size=8, epochs=2, verbose=0, log_every=1, run_dir=run,
                     callbacks=[Breaks()])
    from podkit.monitor.run_dir import mirror_of

    written = [json.loads(line)["step"] for line in
               (mirror_of(run).local / "metrics.jsonl").read_text().splitlines()]
    # Before the first step only run.json went up; the first epoch never ended.
    assert len(written) >= 5 and _steps(run) == written


def test_reading_a_run_never_touches_the_copy_a_run_on_this_machine_writes(s3, tmp_path,
                                                                            monkeypatch):
    """`podkit report` beside the training on one machine: the reader pulls into a copy of
    its own, so the files the run appends to (not pushed yet) stay as they are."""
    from podkit import runs
    from podkit.monitor.run_dir import mirror_of

    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    url = f"s3://{BUCKET}/live-{uuid.uuid4().hex[:8]}"
    writer = mirror_of(url)
    writer.pull()
    (writer.local / "config.toml").write_text("[run]\nname = \"live\"\n")
    writer.push()
    with open(writer.local / "metrics.jsonl", "w") as f:  # appended to, not pushed yet
        f.write('{"step": 1}\n')
    reader = runs.local_dir(url)
    assert reader != writer.local and (reader / "config.toml").is_file()
    assert not (reader / "metrics.jsonl").exists()
    assert (writer.local / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_bucket_root_is_not_a_run_directory(s3):
    with pytest.raises(pk.ConfigError, match="a bucket's root"):
        _model().fit(X, Y, epochs=1, verbose=0, run_dir=f"s3://{BUCKET}")
