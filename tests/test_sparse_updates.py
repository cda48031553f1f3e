"""Row-sparse updates of sharded embedding tables (podkit.train.sparse) on 8 virtual devices:
exactly the dense update where the optimizer allows it (SGD, Adagrad, global-norm clipping,
microbatches, DLRM's (feature, id) lookups), the lazy update otherwise (Adam: rows not looked
up keep their values and moments), and an error for every misuse."""

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import podkit as pk
from podkit.config import DLRMConfig
from podkit.errors import ConfigError
from podkit.models.dlrm import build_dlrm

ROWS, DIM, FEATURES = 64, 8, 5


def click_data(n=64, seed=0, rows=ROWS):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, rows, (n, FEATURES)).astype(np.int32)
    ids[:, 1] = ids[:, 0]  # the same row twice in an example, and across examples
    ids[: n // 2, 2] = 7
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    return ids, y


def embedding_model(sparse_updates, optimizer, **compile_kwargs):
    with pk.DataParallel().scope():
        model = pk.Sequential([
            pk.layers.Embedding(ROWS, DIM, sharded=True, sparse_updates=sparse_updates),
            pk.layers.Flatten(), pk.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss=pk.losses.BinaryCrossentropy(from_logits=True),
                      **compile_kwargs)
    model.build((None, FEATURES))
    return model


def train(model, ids, y, batch_size=16, epochs=2):
    history = model.fit(ids, y, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=False)
    return history.history["loss"], model.get_weights()


@pytest.mark.parametrize("optimizer", [
    lambda: pk.optimizers.SGD(0.5),
    lambda: pk.optimizers.SGD(0.5, global_clipnorm=0.05),
    lambda: pk.optimizers.SGD(0.5, clipvalue=0.01),
    lambda: pk.optimizers.Adagrad(0.5),
    lambda: pk.optimizers.Adagrad(0.5, clipnorm=0.05),
], ids=["sgd", "sgd-global-clipnorm", "sgd-clipvalue", "adagrad", "adagrad-clipnorm"])
def test_row_sparse_update_equals_the_dense_one(optimizer):
    ids, y = click_data()
    dense_loss, dense_w = train(embedding_model(False, optimizer()), ids, y)
    sparse_loss, sparse_w = train(embedding_model(True, optimizer()), ids, y)
    np.testing.assert_allclose(sparse_loss, dense_loss, rtol=1e-6)
    for s, d in zip(sparse_w, dense_w, strict=True):
        np.testing.assert_allclose(s, d, atol=1e-6)
    assert not np.allclose(sparse_w[0], embedding_model(True, optimizer()).get_weights()[0]), \
        "the table did not train"


def test_microbatches_sum_row_gradients_as_the_whole_batch_does():
    ids, y = click_data()
    whole_loss, whole_w = train(embedding_model(True, pk.optimizers.SGD(0.5)), ids, y)
    micro_loss, micro_w = train(embedding_model(True, pk.optimizers.SGD(0.5), microbatches=2),
                                ids, y)
    np.testing.assert_allclose(micro_loss, whole_loss, rtol=1e-6)
    for m, w in zip(micro_w, whole_w, strict=True):
        np.testing.assert_allclose(m, w, atol=1e-6)


def test_adam_is_lazy_rows_not_looked_up_keep_their_values():
    """Step 1 from fresh moments is dense Adam's; in step 2 a row looked up only in step 1
    stays put (dense Adam would move it by its momentum), every other value is dense Adam's."""
    ids, y = click_data(16)
    first, second = ids[:8].copy(), ids[8:].copy()
    second[:, :] = np.where(np.isin(second, first), (second + 1) % ROWS, second)
    second[:, :] = np.where(np.isin(second, first), 63, second)
    only_first = np.setdiff1d(first, second)
    assert only_first.size and 63 not in first
    models = {s: embedding_model(s, pk.optimizers.Adam(0.1)) for s in (False, True)}
    for m in models.values():
        m.set_weights(models[False].get_weights())
    after = {}
    for s, m in models.items():
        train(m, first, y[:8], batch_size=8, epochs=1)
        after[s] = m.get_weights()
        train(m, second, y[8:], batch_size=8, epochs=1)
    np.testing.assert_allclose(after[True][0], after[False][0], atol=1e-6)  # step 1: equal
    sparse, dense = models[True].get_weights(), models[False].get_weights()
    # Step 2: rows looked up only in step 1 keep their values under the lazy update ...
    np.testing.assert_array_equal(sparse[0][only_first], after[True][0][only_first])
    assert np.abs(dense[0][only_first] - after[False][0][only_first]).min() > 1e-4
    # ... and everything step 2 looked up (and the dense layer) is dense Adam's.
    touched = np.unique(second)
    np.testing.assert_allclose(sparse[0][touched], dense[0][touched], atol=1e-6)
    for s, d in zip(sparse[1:], dense[1:], strict=True):
        np.testing.assert_allclose(s, d, atol=1e-6)


def test_rows_never_looked_up_and_their_moments_are_untouched():
    ids, y = click_data(32, rows=32)  # rows 32..63 are never looked up
    model = embedding_model(True, pk.optimizers.AdamW(0.1, weight_decay=0.5))
    before = model.get_weights()[0]
    train(model, ids, y, epochs=3)
    after = model.get_weights()[0]
    np.testing.assert_array_equal(after[32:], before[32:])
    assert np.abs(after[np.unique(ids)] - before[np.unique(ids)]).min() > 0
    adam = [leaf for leaf in jax.tree.leaves(model.state.opt_state)
            if getattr(leaf, "shape", ()) == (ROWS, DIM)]
    assert len(adam) == 2  # mu and nu
    for moment in adam:
        moment = np.asarray(moment)
        assert not moment[32:].any() and moment[np.unique(ids)].any()


STRATEGIES = {
    "dp": lambda: pk.DataParallel(),
    "1-device": lambda: pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1]),
    "3-axis": lambda: pk.Strategy(mesh={"data": 2, "fsdp": 2, "model": 2},
                                  rules=[("embed", "fsdp"), ("mlp", "model")]),
}


@pytest.mark.parametrize("strategy", STRATEGIES, ids=list(STRATEGIES))
def test_dlrm_feature_and_id_lookups_update_exactly_as_dense_sgd(strategy):
    """DLRM's tables of their own sizes in one (rows, D) parameter, rows split over one mesh
    axis, three, or none; multi-hot bags padded with -1 (the padding row gets no update)."""
    rng = np.random.default_rng(0)
    n, sizes = 64, np.array([16, 5, 40])
    sparse = rng.integers(0, sizes[None, :, None], (n, 3, 2)).astype(np.int32)
    sparse[rng.random((n, 3, 2)) < 0.3] = -1
    sparse[:, :, 0] = np.abs(sparse[:, :, 0])  # every bag holds at least one id
    x = {"dense": rng.normal(size=(n, 4)).astype(np.float32), "sparse": sparse}
    y = (x["sparse"][:, :1, 0] % 2).astype(np.float32)
    info = {"dense_features": 4, "table_sizes": sizes.tolist()}
    runs = []
    for sparse_updates in (False, True):
        config = DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8],
                            sparse_updates=sparse_updates)
        with STRATEGIES[strategy]().scope():
            model = build_dlrm(config, info)
            model.compile(optimizer=pk.optimizers.SGD(0.5),
                          loss=pk.losses.BinaryCrossentropy(from_logits=True))
        runs.append(train(model, x, y))
    (dense_loss, dense_w), (sparse_loss, sparse_w) = runs
    np.testing.assert_allclose(sparse_loss, dense_loss, rtol=1e-5)
    for s, d in zip(sparse_w, dense_w, strict=True):
        np.testing.assert_allclose(s, d, atol=1e-6)


def test_lookup_out_of_range_or_negative_ids_give_nan_rows_and_update_nothing():
    table = nnx.Param(jnp.ones((4, 2)))
    rows = pk.layers.lookup(table, jnp.array([0, 3, 4, -1]))
    assert np.isfinite(rows[:2]).all() and np.isnan(rows[2:]).all()


def test_misuse_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="needs sharded=True"):
        pk.layers.Embedding(10, 4, sparse_updates=True)
    with pytest.raises(ConfigError, match="sparse_updates='yes'"):
        pk.layers.Embedding(10, 4, sharded=True, sparse_updates="yes")
    with pytest.raises(ConfigError, match="weight_decay"):
        pk.layers.Embedding(10, 4, sharded=True, embeddings_regularizer="l2")
    pk.layers.Embedding(10, 4, sharded=True, sparse_updates=False,
                        embeddings_regularizer="l2")  # dense updates: a penalty is fine
    table = nnx.Param(jnp.ones((4, 2)))
    with pytest.raises(ConfigError, match="integers"):
        pk.layers.lookup(table, jnp.array([0.0, 1.0]))
    with pytest.raises(ConfigError, match="at least one"):
        pk.layers.lookup(table)
    with pytest.raises(ConfigError, match="a row must keep"):
        pk.layers.lookup(table, jnp.array([0]), jnp.array([1]))


def test_an_optimizer_without_per_row_state_is_refused_and_dense_updates_take_it():
    ids = np.random.default_rng(0).integers(0, 256, (16, 2)).astype(np.int32)
    y = np.ones((16, 1), np.float32)

    def model(sparse_updates):
        with pk.DataParallel().scope():
            m = pk.Sequential([pk.layers.Embedding(256, 128, sharded=True,
                                                   sparse_updates=sparse_updates),
                               pk.layers.Flatten(), pk.layers.Dense(1)])
            m.compile(optimizer=optax.adafactor(0.1), loss="mse")  # factored: not per row
        return m

    with pytest.raises(ConfigError, match="not one entry per row"):
        model(True).fit(ids, y, batch_size=16, verbose=0)
    # The factored moments (shaped (256,) and (128,), not as the table) are replicated.
    loss = model(False).fit(ids, y, batch_size=16, epochs=3, verbose=0).history["loss"]
    assert loss[-1] < loss[0]


def test_layer_config_round_trips_sparse_updates():
    layer = pk.layers.Embedding(10, 4, sharded=True, sparse_updates=False)
    again = pk.layers.deserialize(pk.layers.serialize(layer))
    assert (again.sharded, again.sparse_updates) == (True, False)
    assert pk.layers.Embedding(10, 4, sharded=True).sparse_updates is True
    assert pk.layers.Embedding(10, 4).sparse_updates is False
