"""Every path-taking call of saving, checkpoints and export on local paths, moto's S3 and the
GCS emulator: the same files, the same results; a malformed URL a ConfigError and no local
folder called `gs:`."""

import os
import uuid

import numpy as np
import pytest

import podkit as pk
from podkit import paths
from storage_servers import BUCKET

X = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int32)


def _model():
    with pk.Strategy(mesh={"data": 1}, devices=pk.connect().devices[:1]).scope():
        model = pk.Sequential([pk.Input((6,)), pk.layers.Dense(8, activation="relu"),
                               pk.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def trained():
    model = _model()
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    return model


@pytest.fixture(params=["local", "s3", "gs"])
def root(request, tmp_path, monkeypatch):
    """A fresh directory of each kind, with the working directory an empty one of its own
    (where a misread URL would leave a `gs:` folder)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    request.node.cwd = cwd
    if request.param == "local":
        return str(tmp_path / "root")
    request.getfixturevalue("s3" if request.param == "s3" else "gcs")
    return f"{request.param}://{BUCKET}/saving-{uuid.uuid4().hex[:12]}"


def _same_predictions(a, b):
    np.testing.assert_allclose(a.predict(X, verbose=0), b.predict(X, verbose=0), atol=1e-6)


def test_save_and_load_model_and_weights(root, trained, request):
    saved = paths.join(root, "model")
    trained.save(saved)
    assert paths.listdir(saved) == ["model.json", "state"]
    again = pk.models.load_model(saved)
    _same_predictions(trained, again)
    assert again.steps_trained == trained.steps_trained  # the whole state, step included
    trained.save(saved)  # over an existing save: replaced, not mixed
    assert paths.listdir(saved) == ["model.json", "state"]

    weights = paths.join(root, "weights")
    trained.save_weights(weights)
    fresh = _model()
    fresh.load_weights(weights)
    _same_predictions(trained, fresh)
    other = _model()
    other.load_weights(saved)  # a whole save's weights
    _same_predictions(trained, other)
    assert os.listdir(request.node.cwd) == []


@pytest.mark.parametrize("root", ["s3", "gs"], indirect=True)  # local: tests/test_checkpoint.py
def test_checkpoints_load_as_models(root, request):
    model = _model()
    ck = paths.join(root, "ck")
    model.fit(X, Y, batch_size=16, epochs=1, verbose=0, checkpoint=ck)
    steps = sorted(n for n in paths.listdir(ck) if n.startswith("step_"))
    assert steps, paths.listdir(ck)
    loaded = pk.models.load_model(ck)  # the newest step, compiled, optimizer state included
    _same_predictions(model, loaded)
    assert loaded.steps_trained == model.steps_trained
    fresh = _model()
    fresh.load_weights(ck)
    _same_predictions(model, fresh)
    one = _model()
    one.load_weights(paths.join(ck, steps[-1]))  # a step directory, as ModelCheckpoint logs
    _same_predictions(model, one)
    resumed = _model()
    resumed.fit(X, Y, batch_size=16, epochs=1, verbose=0, resume=ck)
    assert resumed.steps_trained == model.steps_trained  # nothing left to train
    assert os.listdir(request.node.cwd) == []


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_export(root, trained, fmt, request):
    out = pk.runs.export(trained, paths.join(root, "out", f"w.{fmt}"), format=fmt)
    assert str(out) == paths.join(root, "out", f"w.{fmt}")
    with paths.local_copy(out) as local:
        if fmt == "npz":
            tensors = dict(np.load(local))
        else:
            from safetensors.numpy import load_file

            tensors = load_file(local)
    expected = pk.runs.named_weights(trained)
    assert sorted(tensors) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(tensors[name], value)
    assert os.listdir(request.node.cwd) == []


@pytest.mark.parametrize("bad", ["gs:/b/x", "gcs://b/x", "s3:/b/x"])
def test_malformed_urls_are_config_errors(bad, trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for call in (trained.save, trained.save_weights, trained.load_weights,
                 pk.models.load_model, lambda p: pk.runs.export(trained, p),
                 lambda p: trained.fit(X, Y, epochs=1, verbose=0, checkpoint=p),
                 lambda p: trained.fit(X, Y, epochs=1, verbose=0, run_dir=p)):
        with pytest.raises(pk.ConfigError, match="://") as e:
            call(bad)
        assert repr(bad) in str(e.value) or bad in str(e.value)
    assert os.listdir(tmp_path) == []


def test_a_run_dir_url_leaves_no_local_folder(s3, trained, tmp_path, monkeypatch):
    """Its copy is in podkit's cache, never a folder called `s3:` (tests/test_run_dir_urls.py
    has the rest)."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path / "cache"))
    trained.fit(X, Y, epochs=1, verbose=0, run_dir=f"s3://{BUCKET}/run")
    assert os.listdir(tmp_path / "cwd") == []
    assert "metrics.jsonl" in paths.listdir(f"s3://{BUCKET}/run")


def test_csv_logger_and_tensorboard(root, request):
    model = _model()
    log, board = paths.join(root, "log.csv"), paths.join(root, "tb")
    model.fit(X, Y, batch_size=32, epochs=2, verbose=0,
              callbacks=[pk.callbacks.CSVLogger(log), pk.callbacks.TensorBoard(board)])
    rows = paths.open(log, "r").read().splitlines()
    assert rows[0].startswith("epoch,") and [r.split(",")[0] for r in rows[1:]] == ["0", "1"]
    model.fit(X, Y, batch_size=32, epochs=1, verbose=0,
              callbacks=[pk.callbacks.CSVLogger(log, append=True)])
    rows = paths.open(log, "r").read().splitlines()
    assert [r.split(",")[0] for r in rows] == ["epoch", "0", "1", "0"]  # appended, one header
    events = paths.glob(paths.join(board, "train", "events.out.tfevents.*"))
    assert paths.listdir(board) == ["train"] and len(events) == 1
    with paths.open(events[0], "rb") as f:  # TFRecord framing: a length, then the first event
        assert int.from_bytes(f.read(8), "little") > 0 and paths.size(events[0]) > 100
    assert os.listdir(request.node.cwd) == []


def test_text_files_of_a_data_config(root):
    """`[data] files` of a language model: text and JSONL read where they are."""
    from podkit.datasets import files

    with paths.open(paths.join(root, "a.txt"), "w", newline="") as f:
        f.write("one line\r\ntwo")
    with paths.open(paths.join(root, "b.jsonl"), "w") as f:
        f.write('{"text": "doc one"}\n\n{"text": "doc two"}\n')
    found = files.expand(paths.join(root, "*.txt") + "," + paths.join(root, "*.jsonl"),
                         "files")
    assert found == [paths.join(root, "a.txt"), paths.join(root, "b.jsonl")]
    assert list(files.blocks(found[:1], "auto", "text")) == [("one line\r\n", False),
                                                           ("two", True)]
    assert list(files.blocks(found[1:], "auto", "text")) == [("doc one", True),
                                                           ("doc two", True)]


def test_a_report_of_a_local_run_to_a_url(root, tmp_path):
    from podkit.monitor import report

    run = tmp_path / "run"
    _model().fit(X, Y, batch_size=32, epochs=1, verbose=0, run_dir=run)
    out = report.write(run, paths.join(root, "report.html"))
    assert str(out) == paths.join(root, "report.html")
    assert "</html>" in paths.open(out, "r").read()
