"""Generated click logs in the Criteo layout: 13 dense features, 26 categorical ones, a click.

The real Criteo logs cannot ship (terabytes, and a licence); what a CTR model meets in them can
be generated:
- dense features are counts with heavy tails (log-normal), fed as log(1 + count), as DLRM does;
- categorical ids follow a power law (Zipf with exponent `zipf` over each table's rows): a few
  ids are most of the traffic, most rows of a table are seen rarely or never. Each feature
  hashes its ranks to rows with its own permutation, so the hot rows are spread over the table
  (and so over the devices of a sharded table) as hashed ids are;
- the click is Bernoulli(sigmoid(logit)), the logit a sum of a dense linear term, a learnable
  effect per id for every categorical feature, and one pairwise interaction (feature 0's id
  with feature 1's), plus a bias that puts the click rate near Criteo's ~25%.

`info["bayes_auc"]` is the AUC of the true click probabilities on the validation set: the best
any model can score, so a trained model's AUC can be read against it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from podkit.errors import ConfigError, InputError

ID_EFFECT = 0.8  # std of the per-id logit effects, shared by the categorical features
DENSE_EFFECT = 0.5  # std of the dense weights
INTERACTION = 1.0  # std of the pairwise effect of features 0 and 1


def zipf_ids(rng: np.random.Generator, n: int, rows: int, exponent: float) -> np.ndarray:
    """n ranks in 0..rows-1 with P(rank r) proportional to 1 / (r + 1)^exponent."""
    p = 1.0 / np.arange(1, rows + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1)


def click_logs(samples: int, dense_features: int, table_sizes: list[int], zipf: float,
               seed: int = 0, multi_hot: int = 1) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                         np.ndarray]:
    """({"dense": (n, d) float32, "sparse": (n, f) int32, or (n, f, multi_hot) with -1 after
    each bag's ids}, clicks (n, 1) float32, true click probabilities (n,)). A bag holds 1 to
    `multi_hot` ids; its effect on the click is the mean of its ids' effects."""
    rng = np.random.default_rng(seed)
    f = len(table_sizes)
    counts = rng.lognormal(mean=1.0, sigma=1.5, size=(samples, dense_features))
    dense = np.log1p(np.floor(counts)).astype(np.float32)
    sparse = np.full((samples, f, multi_hot), -1, np.int32)
    bags = rng.integers(1, multi_hot + 1, (samples, f)) if multi_hot > 1 else np.ones(
        (samples, f), np.int64)
    id_effect = np.zeros((samples, f))
    for j, rows in enumerate(table_sizes):
        hashed = rng.permutation(rows)
        effects = rng.normal(0.0, ID_EFFECT, rows)
        for h in range(multi_hot):
            ids = hashed[zipf_ids(rng, samples, rows, zipf)]
            used = bags[:, j] > h
            sparse[used, j, h] = ids[used]
            id_effect[used, j] += effects[ids[used]]
    w_dense = rng.normal(0.0, DENSE_EFFECT, dense_features)
    # Centre the dense term so the bias alone sets the click rate.
    logit = (dense - dense.mean(axis=0)) @ w_dense / np.sqrt(dense_features)
    logit += (id_effect / bags).sum(axis=1) / np.sqrt(f)
    if f >= 2:
        # A hashed cross of two features: what DLRM's dot-product interactions can express.
        cross = rng.normal(0.0, INTERACTION, 1024)
        logit += cross[(sparse[:, 0, 0].astype(np.int64) * 31 + sparse[:, 1, 0]) % 1024]
    logit += -1.5  # ~25% clicks
    prob = 1.0 / (1.0 + np.exp(-logit))
    clicks = (rng.random(samples) < prob).astype(np.float32)[:, None]
    return {"dense": dense, "sparse": sparse if multi_hot > 1 else sparse[:, :, 0]}, clicks, \
        prob


def read_tsv(files: list[str], dense_features: int, table_sizes: list[int],
             max_rows: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, list[int]]:
    """Criteo's TSV click logs (Kaggle's train.txt, the Terabyte days): per line a 0/1 label,
    `dense_features` integer counts and one hexadecimal value per categorical feature, tab
    separated, any field may be empty. Counts are fed as log(1 + max(count, 0)) (DLRM's
    preprocessing), a missing one as 0; a missing categorical value is -1: no row, the
    feature's vector is zero.

    `table_sizes` given: each value is hashed into its table (int(value, 16) % rows). Empty
    (`len(table_sizes)` features are still expected): the sizes are read from the data, as
    DLRM's preprocessing builds its dictionaries: a feature's distinct values, in sorted
    order, are its rows; a feature with more than `max_rows` distinct values is hashed into
    `max_rows` rows instead (DLRM's --max-ind-range). Returns (x, clicks, table sizes)."""
    f = len(table_sizes)
    width = 1 + dense_features + f
    labels, dense, sparse = [], [], []
    sizes = np.asarray(table_sizes, np.int64)
    for path in files:
        with open(path, "rb") as lines:
            for number, raw in enumerate(lines, 1):
                try:
                    line = raw.decode("ascii")
                except UnicodeDecodeError:
                    raise InputError(f"{path}:{number} holds a byte that is not ASCII; a "
                                     "Criteo line is a label, counts and hexadecimal values, "
                                     "tab separated.") from None
                line = line.rstrip("\r\n")  # Windows line ends too
                if not line:
                    continue  # a blank line (a trailing one, often) holds no example
                fields = line.split("\t")
                if len(fields) != width:
                    raise ConfigError(
                        f"{path}:{number} has {len(fields)} tab-separated fields; Criteo's "
                        f"format with data.dense_features = {dense_features} and "
                        f"{f} categorical features has {width} (label, counts, values).")
                if fields[0] not in ("0", "1"):
                    raise InputError(f"{path}:{number}: the label is {fields[0]!r}; a Criteo "
                                     "line starts with its click, 0 or 1.")
                try:
                    labels.append(float(fields[0]))
                    # Counts are integers (int() refuses "nan", "inf" and "3.5": float would not)
                    dense.append([float(int(v)) if v else 0.0
                                  for v in fields[1:1 + dense_features]])
                    sparse.append([int(v, 16) if v else -1 for v in fields[1 + dense_features:]])
                except ValueError as e:
                    raise InputError(f"{path}:{number}: {e}; a Criteo line holds a 0/1 label, "
                                     "integer counts and hexadecimal values.") from None
    if not labels:
        raise ConfigError(f"data.files matched {files} but they hold no lines.")
    ids = np.asarray(sparse, np.int64)
    if (sizes < 1).any():  # sizes from the data
        ids, sizes = _dictionaries(ids, max_rows)
    ids = np.where(ids < 0, -1, ids % sizes[None, :]).astype(np.int32)
    counts = np.maximum(np.asarray(dense, np.float64), 0.0)
    return ({"dense": np.log1p(counts).astype(np.float32), "sparse": ids},
            np.asarray(labels, np.float32)[:, None], [int(s) for s in sizes])


def _dictionaries(values: np.ndarray, max_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(row ids, table sizes) of raw categorical values (n, f), -1 missing: each feature's
    sorted distinct values numbered 0.., or hashed into max_rows rows when there are more."""
    ids = np.full(values.shape, -1, np.int64)
    sizes = np.ones(values.shape[1], np.int64)
    for j in range(values.shape[1]):
        column = values[:, j]
        present = column >= 0
        distinct = np.unique(column[present])
        if len(distinct) > max_rows:
            ids[present, j] = column[present] % max_rows
            sizes[j] = max_rows
        else:
            ids[present, j] = np.searchsorted(distinct, column[present])
            sizes[j] = max(len(distinct), 1)
    return ids, sizes


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve (Mann-Whitney, ties counted half)."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # Average ranks over ties.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, counts)
    pos = labels.sum()
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def load_criteo(config: Any, seed: int = 0) -> Any:
    """`[data] name = "criteo"`: click logs (generated, or read from `files`) split into
    train and validation."""
    from podkit.datasets.registry import Data, check_ints, split_tail

    check_ints(config, {"samples": 2, "dense_features": 1, "sparse_features": 1,
                        "table_rows": 2, "multi_hot": 1})
    if not isinstance(config.zipf, (int, float)) or config.zipf <= 0:
        raise ConfigError(f"data.zipf = {config.zipf!r}; use a positive exponent (1.05-1.2 "
                          "is what click logs show).")
    from_data = bool(config.files) and not config.table_sizes
    sizes = list(config.table_sizes) or [0 if from_data else config.table_rows
                                         ] * config.sparse_features
    if len(sizes) != config.sparse_features:
        fix = (f"the TSV files hold data.sparse_features = {config.sparse_features} "
               "categorical values per line: give that many sizes, or leave data.table_sizes "
               "out to read them from the data" if config.files else
               f"give one size per feature (or set data.sparse_features = {len(sizes)})")
        raise ConfigError(f"data.table_sizes lists {len(sizes)} tables but data.sparse_features "
                          f"= {config.sparse_features}; {fix}.")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < (0 if from_data else 1)
           for s in sizes):
        raise ConfigError(f"data.table_sizes = {config.table_sizes!r}; give positive ints, one "
                          "per categorical feature.")
    if config.files:
        from podkit.datasets.files import expand

        if config.multi_hot != 1:
            raise ConfigError("data.multi_hot applies to generated logs; Criteo's TSV has one "
                              "value per feature. Set data.multi_hot = 1.")
        x, y, sizes = read_tsv(expand(config.files, "files"), config.dense_features, sizes,
                               max_rows=config.table_rows)
        prob = None
    else:
        x, y, prob = click_logs(config.samples, config.dense_features, sizes,
                                float(config.zipf), seed, config.multi_hot)
    train, val = split_tail(x, y, config, source=f"data.files = {config.files!r} hold "
                            f"{len(y)} rows" if config.files else None)
    cut = len(train[1])
    info = {"dense_features": config.dense_features, "sparse_features": len(sizes),
            "table_sizes": sizes, "multi_hot": config.multi_hot, "ctr": float(y.mean()),
            "bayes_auc": auc(y[cut:], prob[cut:]) if val and prob is not None
            else float("nan")}
    return Data(train, val, info)
