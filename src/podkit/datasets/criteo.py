"""Generated click logs in the Criteo layout: 13 dense features, 26 categorical ones, a click.

The real Criteo logs cannot ship (terabytes, and a licence); what a CTR model meets in them can
be generated:
- dense features are counts with heavy tails (log-normal), fed as log(1 + count), as DLRM does;
- categorical ids follow a power law (Zipf with exponent `zipf` over `table_rows` ranks): a few
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

from podkit.errors import ConfigError

ID_EFFECT = 0.8  # std of the per-id logit effects, shared by the categorical features
DENSE_EFFECT = 0.5  # std of the dense weights
INTERACTION = 1.0  # std of the pairwise effect of features 0 and 1


def zipf_ids(rng: np.random.Generator, n: int, rows: int, exponent: float) -> np.ndarray:
    """n ranks in 0..rows-1 with P(rank r) proportional to 1 / (r + 1)^exponent."""
    p = 1.0 / np.arange(1, rows + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1)


def click_logs(samples: int, dense_features: int, sparse_features: int, table_rows: int,
               zipf: float, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                    np.ndarray]:
    """({"dense": (n, d) float32, "sparse": (n, f) int32}, clicks (n, 1) float32, true
    click probabilities (n,))."""
    rng = np.random.default_rng(seed)
    counts = rng.lognormal(mean=1.0, sigma=1.5, size=(samples, dense_features))
    dense = np.log1p(np.floor(counts)).astype(np.float32)
    sparse = np.empty((samples, sparse_features), np.int32)
    for f in range(sparse_features):
        ranks = zipf_ids(rng, samples, table_rows, zipf)
        sparse[:, f] = rng.permutation(table_rows)[ranks]
    w_dense = rng.normal(0.0, DENSE_EFFECT, dense_features)
    # Centre the dense term so the bias alone sets the click rate.
    logit = (dense - dense.mean(axis=0)) @ w_dense / np.sqrt(dense_features)
    effects = rng.normal(0.0, ID_EFFECT, (sparse_features, table_rows))
    logit += effects[np.arange(sparse_features)[None, :], sparse].sum(axis=1) / np.sqrt(
        sparse_features)
    if sparse_features >= 2:
        # A hashed cross of two features: what DLRM's dot-product interactions can express.
        cross = rng.normal(0.0, INTERACTION, 1024)
        logit += cross[(sparse[:, 0].astype(np.int64) * 31 + sparse[:, 1]) % 1024]
    logit += -1.5  # ~25% clicks
    prob = 1.0 / (1.0 + np.exp(-logit))
    clicks = (rng.random(samples) < prob).astype(np.float32)[:, None]
    return {"dense": dense, "sparse": sparse}, clicks, prob


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
    """`[data] name = "criteo"`: generated click logs split into train and validation."""
    from podkit.datasets.registry import Data, check_ints, split_tail

    check_ints(config, {"samples": 2, "dense_features": 1, "sparse_features": 1,
                        "table_rows": 2})
    if not isinstance(config.zipf, (int, float)) or config.zipf <= 0:
        raise ConfigError(f"data.zipf = {config.zipf!r}; use a positive exponent (1.05-1.2 "
                          "is what click logs show).")
    x, y, prob = click_logs(config.samples, config.dense_features, config.sparse_features,
                            config.table_rows, float(config.zipf), seed)
    train, val = split_tail(x, y, config)
    cut = len(train[1])
    info = {"dense_features": config.dense_features,
            "sparse_features": config.sparse_features, "table_rows": config.table_rows,
            "ctr": float(y.mean()),
            "bayes_auc": auc(y[cut:], prob[cut:]) if val else float("nan")}
    return Data(train, val, info)
