"""`podkit report` writes a self-contained report.html that loads in headless Chromium with
its plots visible; `podkit doctor` names what held a run back (an input pipeline slowed on
purpose is input-bound, with the advice for it)."""

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import podkit as pk
from podkit.monitor import doctor, records, report

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cli import SEED, podkit_cli


def _data(n=512):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return x, (x.sum(1) > 0).astype(np.int32)


def _model():
    model = pk.Sequential([pk.layers.Dense(16, activation="relu"), pk.layers.Dense(2)])
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def slow(x, y):
    time.sleep(0.004)  # a Python-heavy decode, per element
    return x, y


def test_doctor_finds_a_slowed_pipeline_input_bound(tmp_path):
    x, y = _data(768)
    ds = pk.data.Dataset.from_tensor_slices((x, y)).map(slow).batch(32)
    _model().fit(ds, epochs=1, verbose=0, run_dir=tmp_path, log_every=4)
    findings = doctor.diagnose(records.load(tmp_path))
    assert findings[0].title == "input-bound", [str(f) for f in findings]
    assert "num_parallel_calls" in findings[0].advice and "prefetch" in findings[0].advice


def test_doctor_on_a_healthy_run_does_not_call_it_input_bound(tmp_path):
    x, y = _data()
    _model().fit(x, y, batch_size=32, epochs=2, verbose=0, run_dir=tmp_path, log_every=4)
    titles = [f.title for f in doctor.diagnose(records.load(tmp_path))]
    assert "input-bound" not in titles


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    t0 = time.time()
    out = podkit_cli("train", str(SEED), "--cpu-devices", "2", "--set", "train.epochs=3",
                     "--set", f"run.dir={root}", "--set", "run.name=r", cwd=root)
    (root / "measured.json").write_text(json.dumps([t0, time.time()]))
    assert out.returncode == 0, out.stderr
    return root / "r"


def test_an_uninterrupted_run_loses_nothing_and_adds_up_to_its_wall_time(trained_run):
    t0, t1 = json.loads((trained_run.parent / "measured.json").read_text())
    wall = records.load(trained_run).wall_time()
    assert len(wall.fits) == 1 and wall.restarts == 0 and wall.fits[0].ended
    assert wall.parts["lost"] == 0 and wall.parts["down"] == 0 and wall.parts["idle"] == 0
    assert sum(wall.parts.values()) == pytest.approx(wall.wall, abs=1e-6)
    # from the process's start (a clock tick at most before the test started it) to its
    # last record (before it exited)
    assert t0 - 0.011 <= wall.start <= t0 + 0.5 and t1 - 5.0 <= wall.end <= t1
    assert wall.parts["startup"] > 0 and wall.parts["productive"] > 0


def test_report_and_doctor_commands(trained_run):
    out = podkit_cli("report", str(trained_run), cwd=trained_run)
    assert out.returncode == 0, out.stderr
    assert f"wrote {trained_run / 'report.html'}" in out.stdout
    html = (trained_run / "report.html").read_text()
    for section in ("Loss and metrics", "Throughput", "Where the time went", "Recompiles",
                    "Memory", "Diagnosis"):
        assert section in html
    assert html.count("data:image/png;base64,") >= 5  # curves, throughput, goodput, steps
    assert "<script src" not in html and "<link" not in html  # nothing beside the file
    doc = podkit_cli("doctor", str(trained_run), cwd=trained_run)
    assert doc.returncode == 0, doc.stderr
    assert "goodput" in doc.stdout and re.search(r"\[(problem|warning|ok)\]", doc.stdout)


def test_report_of_a_directory_that_is_no_run_says_so(tmp_path):
    out = podkit_cli("report", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2 and "holds no metrics.jsonl" in out.stderr


def test_the_report_renders_in_headless_chromium(trained_run, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium: `make test` installs Debian's package (apt-get, as root)")
    path = report.write(trained_run)
    common = [browser, "--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--enable-logging=stderr", "--v=0", "--dump-dom",
                          path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    plots = re.search(r'data-plots="(\d+)/(\d+)"', dom.stdout)
    assert plots is not None, dom.stdout[:500]
    assert plots.group(1) == plots.group(2) and int(plots.group(2)) >= 5  # all visible
    assert "Uncaught" not in dom.stderr  # no JavaScript error
    shot = tmp_path / "report.png"
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,1600",
                    path.as_uri()], capture_output=True, timeout=120, check=True)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"))
    assert pixels.shape == (1600, 1200) and pixels.std() > 10  # not a blank page
