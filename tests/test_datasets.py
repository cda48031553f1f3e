"""The datasets a config names: digits, stdlib text, synthetic images, generated click logs."""

import io

import numpy as np
import pytest

import podkit as pk
from podkit.config import CriteoDataConfig, DataConfig, ImagesDataConfig, TextDataConfig
from podkit.datasets import load
from podkit.datasets.criteo import auc
from podkit.monitor.progress import ProgbarLogger


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(pk.ConfigError,
                       match="valid names: digits, text, instructions, images, criteo"):
        load(DataConfig(name="cifar"))


def test_digits():
    data = load(DataConfig(validation_fraction=0.2))
    x, y = data.train
    assert x.shape[1] == 64 and data.info["classes"] == 10 and len(data.validation[0]) > 300


def test_text_is_the_stdlib_tokenized_locally(tmp_path, monkeypatch):
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    config = TextDataConfig(seq_len=32, vocab_size=300, max_bytes=100_000,
                            validation_fraction=0.1)
    data = load(config, seed=0)
    (x, y), (vx, _) = data.train, data.validation
    assert x.shape[1] == 32 and x.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # labels are the next tokens
    assert x.max() < data.info["vocab_size"] <= 300
    assert abs(len(vx) / (len(x) + len(vx)) - 0.1) < 0.01
    text = "def f(x):\n    return x + 1\n"
    assert data.info["decode"](data.info["encode"](text)) == text  # byte-level: lossless
    # The second load reads the cache: same tokens.
    assert list(tmp_path.rglob("tokens.npy"))
    again = load(config, seed=0)
    np.testing.assert_array_equal(again.train[0], x)
    # Validation windows are drawn from the whole text, by the seed.
    other = load(config, seed=1)
    assert not np.array_equal(other.validation[0], vx)


def test_text_too_small_for_a_batch_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PODKIT_CACHE", str(tmp_path))
    with pytest.raises(pk.ConfigError, match="Raise data.max_bytes"):
        load(TextDataConfig(seq_len=512, vocab_size=300, max_bytes=20_000, batch_size=64))


def test_images_are_learnable_cifar_shaped():
    data = load(ImagesDataConfig(samples=600, image_size=16, classes=4), seed=0)
    x, y = data.train
    assert x.shape == (540, 16, 16, 3) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1
    assert set(np.unique(y)) == {0, 1, 2, 3}
    assert data.info["image_shape"] == (16, 16, 3) and data.info["classes"] == 4
    # Same class, more alike than different classes (the signal a classifier learns).
    flat = x.reshape(len(x), -1)
    means = np.stack([flat[y == c].mean(0) for c in range(4)])
    own = np.mean([np.linalg.norm(flat[i] - means[y[i]]) for i in range(200)])
    other = np.mean([np.linalg.norm(flat[i] - means[(y[i] + 1) % 4]) for i in range(200)])
    assert own < other
    np.testing.assert_array_equal(load(ImagesDataConfig(samples=600, image_size=16,
                                                        classes=4), seed=0).train[0], x)


def test_criteo_click_logs():
    config = CriteoDataConfig(samples=50_000, table_rows=1000, sparse_features=5,
                              dense_features=3)
    data = load(config, seed=0)
    x, y = data.train
    assert x["dense"].shape == (45_000, 3) and x["sparse"].shape == (45_000, 5)
    assert x["sparse"].dtype == np.int32 and 0 <= x["sparse"].min() <= x["sparse"].max() < 1000
    assert y.shape == (45_000, 1) and set(np.unique(y)) == {0.0, 1.0}
    assert 0.15 < data.info["ctr"] < 0.35  # near Criteo's ~25% clicks
    # Power-law ids: the hottest id of a feature is a large share, most rows are rare.
    counts = np.bincount(x["sparse"][:, 0], minlength=1000)
    assert counts.max() / len(y) > 0.05 and np.median(counts) < 45_000 / 1000
    # The hottest rows are spread over the table (hashed), not all at its start.
    hot = np.argsort(counts)[-10:]
    assert hot.max() > 100
    assert 0.7 < data.info["bayes_auc"] < 0.95  # a learnable signal, not a trivial one


def test_auc_matches_the_pairwise_definition():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = np.round(rng.random(300) + labels * 0.3, 1)  # with ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()
    assert auc(labels, scores) == pytest.approx(pairs)


@pytest.mark.parametrize("key, value, match", [
    ("samples", 0, "data.samples = 0"), ("zipf", -1.0, "data.zipf = -1.0"),
    ("table_rows", 1, "data.table_rows = 1"), ("multi_hot", 0, "data.multi_hot = 0"),
    ("table_sizes", [10, 20], r"lists 2 tables but data.sparse_features = 26; .*"
                              r"data.sparse_features = 2"),
    ("table_sizes", [10] * 25 + [0], r"data.table_sizes = .*give positive ints"),
    ("files", "/nonexistent/day_*", r"data.files: no file matches '/nonexistent/day_\*'"),
])
def test_bad_criteo_configs_raise(key, value, match):
    with pytest.raises(pk.ConfigError, match=match):
        load(CriteoDataConfig(**{"samples": 1000, key: value}))


def test_criteo_tables_of_their_own_sizes_and_multi_hot_bags():
    config = CriteoDataConfig(samples=4000, sparse_features=3, table_sizes=[3, 500, 40],
                              dense_features=2, multi_hot=4)
    data = load(config, seed=0)
    sparse = data.train[0]["sparse"]
    assert sparse.shape == (3600, 3, 4) and data.info["table_sizes"] == [3, 500, 40]
    assert (sparse[:, :, 0] >= 0).all()  # every bag holds at least one id
    # -1 pads the end of a bag only, and each feature's ids stay inside its own table.
    padded = sparse < 0
    assert not (padded[:, :, :-1] & ~padded[:, :, 1:]).any()
    assert (sparse.max(axis=(0, 2)) < [3, 500, 40]).all() and padded.any()
    assert 0.6 < data.info["bayes_auc"] < 0.95


def test_criteo_tsv_logs_are_read_and_hashed_into_their_tables(tmp_path):
    """Criteo's format: label, 13 counts, 26 hex values, tab separated, empty = missing."""
    lines = []
    rng = np.random.default_rng(0)
    for i in range(300):
        counts = ["" if rng.random() < 0.1 else str(int(rng.integers(-2, 500)))
                  for _ in range(13)]
        values = ["" if rng.random() < 0.1 else f"{int(rng.integers(0, 2**32)):08x}"
                  for _ in range(26)]
        lines.append("\t".join(["1" if i % 4 == 0 else "0", *counts, *values]))
    (tmp_path / "day_0").write_text("\n".join(lines[:200]) + "\n")
    # Windows line ends and trailing blank lines are no examples (and no error).
    (tmp_path / "day_1").write_bytes(("\r\n".join(lines[200:]) + "\r\n\r\n\n").encode())
    sizes = [1000 + 7 * j for j in range(26)]
    data = load(CriteoDataConfig(files=str(tmp_path / "day_*"), table_sizes=sizes,
                                 validation_fraction=0.1), seed=0)
    (x, y), (_, vy) = data.train, data.validation
    assert len(y) == 270 and len(vy) == 30 and y[0, 0] == 1.0 and y[1, 0] == 0.0
    fields = lines[1].split("\t")
    want_dense = [np.log1p(max(float(v), 0.0)) if v else 0.0 for v in fields[1:14]]
    np.testing.assert_allclose(x["dense"][1], want_dense, rtol=1e-6)
    want_ids = [int(v, 16) % sizes[j] if v else -1 for j, v in enumerate(fields[14:])]
    assert x["sparse"][1].tolist() == want_ids
    assert np.isnan(data.info["bayes_auc"]) and data.info["table_sizes"] == sizes
    (tmp_path / "bad").write_text("1\t2\t3\n")
    with pytest.raises(pk.ConfigError, match=r"bad:1 has 3 tab-separated fields; .* has 40"):
        load(CriteoDataConfig(files=str(tmp_path / "bad")))
    (tmp_path / "hex").write_text("\t".join(["1", *["0"] * 13, "zz", *["0"] * 25]) + "\n")
    with pytest.raises(pk.InputError, match=r"hex:1: invalid literal"):
        load(CriteoDataConfig(files=str(tmp_path / "hex")))
    with pytest.raises(pk.ConfigError, match="data.multi_hot applies to generated logs"):
        load(CriteoDataConfig(files=str(tmp_path / "day_*"), multi_hot=2))
    good = lines[0].split("\t")
    for name, fields, pattern in [
        ("label2", ["2", *good[1:]], r"label2:1: the label is '2'; .* 0 or 1"),
        ("half", ["0.5", *good[1:]], r"half:1: the label is '0.5'"),
        ("nan", [good[0], "nan", *good[2:]], r"nan:1: invalid literal for int"),
        ("frac", [good[0], "3.5", *good[2:]], r"frac:1: invalid literal for int"),
    ]:
        (tmp_path / name).write_text("\t".join(fields) + "\n")
        with pytest.raises(pk.InputError, match=pattern):
            load(CriteoDataConfig(files=str(tmp_path / name)))
    (tmp_path / "latin").write_bytes(lines[0].encode() + b"\n" + b"1\t\xe9" + b"\n")
    with pytest.raises(pk.InputError, match=r"latin:2 holds a byte that is not ASCII"):
        load(CriteoDataConfig(files=str(tmp_path / "latin")))
    with pytest.raises(pk.ConfigError, match=r"hold 200 rows: that leaves 180 training rows, "
                                             r"fewer than one batch of data.batch_size = 256\. "
                                             r"Add rows"):
        load(CriteoDataConfig(files=str(tmp_path / "day_0")))
    with pytest.raises(pk.ConfigError, match=r"the TSV files hold data.sparse_features = 26 .*"
                                             r"leave data.table_sizes out"):
        load(CriteoDataConfig(files=str(tmp_path / "day_0"), table_sizes=[97]))


def test_criteo_tsv_table_sizes_are_read_from_the_data(tmp_path):
    """No table_sizes: a feature's distinct values are its rows, numbered in sorted order; one
    with more than table_rows distinct values is hashed into table_rows rows."""
    rng = np.random.default_rng(1)
    pools = [[f"{v:08x}" for v in rng.choice(2**32, size=3 + j, replace=False)]
             for j in range(25)]
    lines, raw = [], []
    for i in range(400):
        values = [pools[j][int(rng.integers(0, len(pools[j])))] for j in range(25)]
        values.append(f"{i * 7919:08x}")  # feature 25: a new value on every line
        values[3] = "" if i % 5 == 0 else values[3]  # missing: no row
        raw.append(values)
        lines.append("\t".join(["0" if i % 3 else "1", *["1"] * 13, *values]))
    (tmp_path / "day").write_text("\n".join(lines) + "\n")
    data = load(CriteoDataConfig(files=str(tmp_path / "day"), table_rows=100,
                                 validation_fraction=0.0), seed=0)
    (x, _), sizes = data.train, data.info["table_sizes"]
    seen = [sorted({int(r[j], 16) for r in raw if r[j]}) for j in range(26)]
    assert sizes[:25] == [len(seen[j]) for j in range(25)] and sizes[0] == 3
    assert sizes[25] == 100  # 400 distinct values > table_rows: hashed
    for i in (0, 1, 7):
        for j in (0, 3, 24):
            want = seen[j].index(int(raw[i][j], 16)) if raw[i][j] else -1
            assert x["sparse"][i, j] == want
        assert x["sparse"][i, 25] == int(raw[i][25], 16) % 100
    assert x["sparse"].max(axis=0).tolist() < sizes


def test_bad_images_configs_raise():
    with pytest.raises(pk.ConfigError, match="data.image_size = 2"):
        load(ImagesDataConfig(image_size=2))
    with pytest.raises(pk.ConfigError, match="fewer than one batch"):
        load(ImagesDataConfig(samples=100, batch_size=128))


def test_progress_off_a_terminal_prints_the_window_loss_every_so_often(monkeypatch):
    monkeypatch.setattr("podkit.monitor.progress.QUIET_LINE_S", 0.0)
    stream = io.StringIO()
    bar = ProgbarLogger(stream)
    bar.set_params({"epochs": 1, "steps": 4, "verbose": 1})
    bar.on_epoch_begin(0)
    for done, loss in ((2, 3.0), (4, 2.0)):
        bar.on_log(done, {"steps_in_epoch": done, "loss": 9.0, "window/loss": loss,
                          "samples_per_s": 1.0})
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("  2/4 ") and "loss: 3.0000 (steps 1-2)" in lines[0]
    assert lines[1].startswith("  4/4 ") and "loss: 2.0000 (steps 3-4)" in lines[1]
