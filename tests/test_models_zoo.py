"""The model zoo's ResNet and DLRM: shapes, parameter counts, logical axes, precision, remat,
and short training runs through model.fit on 8 virtual devices."""

import dataclasses
import math

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import podkit as pk
from podkit.config import DLRMConfig, ResNetConfig
from podkit.models.dlrm import DLRM, build_dlrm, interaction_pairs
from podkit.models.resnet import ResNet, build_resnet
from podkit.sharding import logical_axes_of, state_shardings
from podkit.strategy import FSDP, TensorParallel

VOCABULARY = {"batch", "embed", "mlp", "heads", "kv", "vocab", "table"}
SMALL = ResNetConfig(depth=18, width=8)
CLICKS_INFO = {"dense_features": 3, "table_sizes": [64, 64, 64, 64]}


def abstract(make):
    """A module of shapes only (no numbers, no compile)."""
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(make)


def eager(make):
    with nnx.use_eager_sharding(False):
        return make()


def resnet(config=SMALL, classes=10, image_shape=(8, 8, 1), seed=0):
    return lambda: ResNet(config, classes, image_shape, nnx.Rngs(seed))


SMALL_DLRM = DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8])


def dlrm(config=SMALL_DLRM, info=CLICKS_INFO):
    return lambda: DLRM(config, info["dense_features"], info["table_sizes"], nnx.Rngs(0))


def param_count(module):
    return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(module, nnx.Param)))


def output_shape(make, x):
    def run(x):
        module = make()
        module.train()
        return module(x)
    with nnx.use_eager_sharding(False):
        return jax.eval_shape(run, x)


# -- ResNet ----------------------------------------------------------------------------------
@pytest.mark.parametrize("image_shape, x_shape", [
    ((8, 8, 1), (4, 64)),  # the digits: flat pixels, reshaped by the model
    ((8, 8, 1), (4, 8, 8)),
    ((32, 32, 3), (4, 32, 32, 3)),
    ((96, 96, 3), (4, 96, 96, 3)),  # the ImageNet stem
])
def test_resnet_output_shapes(image_shape, x_shape):
    for depth in (18, 50):
        make = resnet(dataclasses.replace(SMALL, depth=depth), 10, image_shape)
        out = output_shape(make, jax.ShapeDtypeStruct(x_shape, jnp.float32))
        assert out.shape == (4, 10) and out.dtype == jnp.float32


def test_resnet_rejects_images_of_another_shape():
    with pytest.raises(pk.ConfigError, match=r"images of shape \(8, 8, 1\)"):
        output_shape(resnet(), jax.ShapeDtypeStruct((4, 32, 32, 3), jnp.float32))


@pytest.mark.parametrize("depth, classes, image_shape, count", [
    # The CIFAR variant (3x3 stem, no max-pool) with 10 classes, as in kuangliu/pytorch-cifar:
    # ResNet-18 11,173,962 ("11.17M"), ResNet-34 21,282,122, ResNet-50 23,520,842 ("23.5M").
    (18, 10, (32, 32, 3), 11_173_962),
    (34, 10, (32, 32, 3), 21_282_122),
    (50, 10, (32, 32, 3), 23_520_842),
    # The ImageNet variant with 1000 classes: torchvision's resnet18 / resnet50 counts.
    (18, 1000, (224, 224, 3), 11_689_512),
    (50, 1000, (224, 224, 3), 25_557_032),
])
def test_resnet_param_counts_match_the_literature(depth, classes, image_shape, count):
    config = ResNetConfig(depth=depth, width=64)
    assert param_count(abstract(resnet(config, classes, image_shape))) == count


def check_axes(module):
    """Every parameter names one logical axis (or None) per dim, from the vocabulary; returns
    {path: axes}."""
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        shape = var.get_value().shape
        axes = logical_axes_of(var, len(shape))
        assert len(axes) == len(shape), path
        assert set(axes) - {None} <= VOCABULARY, (path, axes)
        out["/".join(map(str, path))] = (shape, axes)
    return out


def test_resnet_axes_cover_every_big_weight():
    for depth in (18, 50):
        axes = check_axes(abstract(resnet(dataclasses.replace(SMALL, depth=depth),
                                          image_shape=(32, 32, 3))))
        for path, (shape, names) in axes.items():
            if path.endswith("conv/kernel") and not path.startswith("stem"):
                assert names == (None, None, "embed", "mlp"), path
            if len(shape) > 1 and not path.startswith("stem"):  # every weight matrix
                assert "embed" in names, path
        assert axes["head/kernel"][1] == ("embed", None)


# The dims sized by the data, never split: (path, dim) -> what sizes it.
DATA_SIZED = {
    ("stem/conv/kernel", 2): "image channels (3)",
    ("head/kernel", 1): "classes (10)",
    ("head/bias", 0): "classes (10)",
    ("bottom/layers/0/kernel", 0): "dense features (3)",
    ("top/layers/0/kernel", 0): "interactions (dense + pairs: 18)",
    ("top/layers/2/kernel", 1): "the click logit (1)",
    ("top/layers/2/bias", 0): "the click logit (1)",
}


@pytest.mark.parametrize("strategy, splits", [
    (FSDP, {"fsdp"}),
    (lambda: TensorParallel(model=2), {"model", "data"}),  # data: the DLRM's table rows
    (lambda: TensorParallel(model=4), {"model", "data"}),
])
def test_zoo_layouts_resolve_under_every_strategy(strategy, splits):
    """Every split dim divides: 1 or 3 image channels, 10 classes and the data-sized DLRM
    dims are never split (TensorParallel(model=4) would not divide 10 classes), and the
    strategy does split the weights its rules name (a layout that split nothing would also
    divide)."""
    s = strategy()
    used, unsplit = set(), set()
    for make in (resnet(image_shape=(32, 32, 3)), dlrm()):
        state = nnx.state(abstract(make), nnx.Param)
        shardings = state_shardings(state, s.rules, s.mesh)
        for path, var in nnx.to_flat_state(state):
            name, shape = "/".join(map(str, path)), var.get_value().shape
            sharding = shardings
            for key in path:
                sharding = sharding[key]
            spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
            for dim, (size, entry) in enumerate(zip(shape, spec, strict=True)):
                axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
                parts = math.prod(s.mesh.shape[a] for a in axes)
                assert size % parts == 0, (name, shape, sharding.spec)
                used.update(axes)
                if (name, dim) in DATA_SIZED:
                    assert parts == 1, (name, DATA_SIZED[name, dim], sharding.spec)
                    unsplit.add((name, dim))
    assert unsplit == set(DATA_SIZED)  # every one was looked at
    assert used == splits, used


def test_mixed_precision_keeps_float32_params_and_logits():
    mixed = eager(resnet(dataclasses.replace(SMALL, precision="mixed_bfloat16")))
    plain = eager(resnet())
    dtypes = {v.dtype for v in jax.tree.leaves(nnx.state(mixed, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.float32)}
    assert mixed.blocks[0].conv1.conv.dtype == jnp.bfloat16
    x = jnp.asarray(np.random.default_rng(0).random((4, 64)), jnp.float32)
    mixed.eval(), plain.eval()
    call = nnx.jit(lambda m, x: m(x))
    out = call(mixed, x)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, call(plain, x), atol=0.1)  # bf16 compute: close, not equal


def _loss_and_grads(module, x, y):
    module.train()

    @nnx.jit
    def step(module, x, y):
        def loss_of(m):
            logits = m(x)
            return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1).mean()
        return nnx.value_and_grad(loss_of)(module)

    loss, grads = step(module, x, y)
    return loss, nnx.to_pure_dict(grads), nnx.to_pure_dict(nnx.state(module, nnx.BatchStat))


def _batch():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.random((8, 64)), jnp.float32),
            jnp.asarray(rng.integers(0, 10, 8), jnp.int32))


@pytest.fixture(scope="module")
def no_remat():
    return _loss_and_grads(eager(resnet()), *_batch())


@pytest.mark.parametrize("policy", ["full", "dots_saveable", "nothing_saveable"])
def test_remat_changes_nothing_numerically(policy, no_remat):
    x, y = _batch()
    ref = no_remat
    got = _loss_and_grads(eager(resnet(dataclasses.replace(SMALL, remat=policy))), x, y)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 got[1:], ref[1:])  # gradients, and the BatchNorm statistics the call wrote


def test_bad_resnet_configs_raise():
    with pytest.raises(pk.ConfigError, match="model.depth = 101"):
        build_resnet(ResNetConfig(depth=101), {"classes": 10, "image_shape": (8, 8, 1)})
    with pytest.raises(pk.ConfigError, match="remat = 'some'"):
        build_resnet(ResNetConfig(remat="some"), {"classes": 10, "image_shape": (8, 8, 1)})
    with pytest.raises(pk.ConfigError, match="'image_shape'"):
        build_resnet(SMALL, {"classes": 10})


def test_resnet_learns_the_digits(digits):
    (x, y), (vx, vy) = digits
    info = {"classes": 10, "image_shape": (8, 8, 1)}
    # The parameters from the classic threefry (XLA:CPU compiles ResNet-18's initialization
    # in a fraction of the partitionable one's time), and an epoch's 23 steps (1,438 images in
    # batches of 64) in one execution (a steps_per_execution that does not divide them
    # compiles a second train program for the rest; the batches and updates are the same).
    # Running the steps is most of this test (FAST_XLA's unoptimized code): ResNet-18 at
    # width 4, a third of width 8's time, with Adam at 3e-3 reaches ~0.90 validation accuracy
    # in 3 epochs (width 8 at Adam's default 1e-3: ~0.92); at 1e-3 width 4 stays at ~0.72.
    config = dataclasses.replace(SMALL, width=4)
    with jax.threefry_partitionable(False), pk.DataParallel().scope():
        model = build_resnet(config, info, seed=0)
        model.compile(optimizer=pk.optimizers.Adam(learning_rate=3e-3),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=23)
        history = model.fit(x, y, batch_size=64, epochs=3, validation_data=(vx, vy),
                            verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] / 2
    assert history.history["val_accuracy"][-1] > 0.8
    # As Keras counts: parameters and batch statistics (non-trainable weights) together.
    module = abstract(resnet(config))
    statistics = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(module,
                                                                            nnx.BatchStat)))
    assert model.count_params() == param_count(module) + statistics


# -- DLRM ------------------------------------------------------------------------------------
def test_dlrm_shapes_and_interactions():
    module = abstract(dlrm())
    n = 1 + len(CLICKS_INFO["table_sizes"])
    assert interaction_pairs(n) == n * (n - 1) // 2 == 10
    pairs = zip(module.pair_rows, module.pair_cols, strict=True)
    assert len(module.pair_rows) == 10 and all(r < c for r, c in pairs)
    # The top MLP takes the bottom output and the n(n-1)/2 dot products.
    assert module.top.layers[0].kernel.shape == (8 + 10, 16)
    x = {"dense": jax.ShapeDtypeStruct((5, 3), jnp.float32),
         "sparse": jax.ShapeDtypeStruct((5, 4), jnp.int32)}
    assert output_shape(dlrm(), x).shape == (5, 1)


def test_dlrm_interactions_are_the_pairwise_dot_products():
    module = eager(dlrm())
    rng = np.random.default_rng(0)
    x = {"dense": jnp.asarray(rng.random((2, 3)), jnp.float32),
         "sparse": jnp.asarray(rng.integers(0, 64, (2, 4)), jnp.int32)}
    bottom = module.bottom(x["dense"])
    tables = np.asarray(module.tables[...])
    offsets = np.arange(4)[None] * 64  # feature f's table starts at row 64 f
    vectors = np.concatenate([np.asarray(bottom)[:, None],
                              tables[offsets + np.asarray(x["sparse"])]], axis=1)
    want = [[vectors[b, i] @ vectors[b, j] for i in range(5) for j in range(i + 1, 5)]
            for b in range(2)]
    top_in = np.concatenate([np.asarray(bottom), np.array(want)], axis=1)
    np.testing.assert_allclose(module(x), module.top(jnp.asarray(top_in)), rtol=1e-5)


@pytest.mark.parametrize("sharded, table_axes", [(True, ("table", "embed")),
                                                 (False, (None, "embed"))])
def test_dlrm_table_axes(sharded, table_axes):
    config = DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8], sharded=sharded)
    axes = check_axes(abstract(dlrm(config)))
    assert axes["tables"] == ((1024, 8), table_axes)  # 256 rows and padding to 1024
    bound = 1 / math.sqrt(64)  # DLRM's init: uniform in +-1/sqrt(rows)
    tables = np.asarray(eager(dlrm(config)).tables[...])
    used = tables[:256]
    assert used.min() >= -bound and used.max() <= bound and used.std() > bound / 3
    assert (tables[256:] == 0).all()  # the padding rows
    assert axes["bottom/layers/0/kernel"][1] == (None, "mlp")
    assert axes["bottom/layers/1/kernel"][1] == ("mlp", "embed")
    assert axes["top/layers/2/kernel"][1] == ("embed", None)


def test_bad_dlrm_configs_raise():
    with pytest.raises(pk.ConfigError, match="ends in 32 but model.embed_dim = 16"):
        build_dlrm(DLRMConfig(bottom=[64, 32]), CLICKS_INFO)
    with pytest.raises(pk.ConfigError, match="lacks table_sizes"):
        build_dlrm(DLRMConfig(), {"dense_features": 3, "sparse_features": 4})
    with pytest.raises(pk.ConfigError, match="model.pooling = 'max'"):
        build_dlrm(DLRMConfig(pooling="max"), CLICKS_INFO)


def clicks(n, seed=0):
    """Learnable click logs: the click depends on a dense feature and on the ids of two
    categorical features (half the ids of each raise the click rate)."""
    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(n, 3)).astype(np.float32)
    sparse = rng.integers(0, 64, (n, 4)).astype(np.int32)
    logit = 1.5 * dense[:, 0] + 2.0 * (sparse[:, 0] % 2) - 2.0 * (sparse[:, 1] < 32)
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]
    return {"dense": dense, "sparse": sparse}, y


def test_dlrm_learns_clicks():
    x, y = clicks(4096)
    vx, vy = clicks(1024, seed=1)
    with pk.DataParallel().scope():
        model = build_dlrm(DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8]), CLICKS_INFO)
        model.compile(optimizer=pk.optimizers.Adam(learning_rate=0.01),
                      loss=pk.losses.BinaryCrossentropy(from_logits=True), metrics=["auc"],
                      steps_per_execution=8)
    history = model.fit(x, y, batch_size=128, epochs=3, validation_data=(vx, vy), verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_auc"][-1] > 0.8
    table = model.state.params["tables"]
    assert table.sharding.spec == jax.sharding.PartitionSpec("data")


def test_dlrm_tables_of_their_own_sizes_and_multi_hot_bags_pool_by_sum_or_mean():
    """Feature f's ids read its own rows; -1 pads a bag; sum or mean of the bag's rows; an id
    outside its table is NaN, never another feature's row."""
    info = {"dense_features": 3, "table_sizes": [5, 1000, 2]}
    ids = np.array([[[4, -1, -1], [999, 0, 7], [1, 1, -1]],
                    [[-1, -1, -1], [3, -1, -1], [0, -1, -1]]], np.int32)
    x = {"dense": jnp.ones((2, 3), jnp.float32), "sparse": jnp.asarray(ids)}
    for pooling in ("sum", "mean"):
        config = DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8], pooling=pooling)
        module = eager(dlrm(config, info))
        tables = np.asarray(module.tables[...])
        assert tables.shape == (1024, 8)  # 1007 rows, at least one padding row: 1024
        offsets = [0, 5, 1005]
        want = np.zeros((2, 3, 8), np.float32)
        for b in range(2):
            for f in range(3):
                bag = [i for i in ids[b, f] if i >= 0]
                rows = sum((tables[offsets[f] + i] for i in bag), np.zeros(8, np.float32))
                want[b, f] = rows / max(len(bag), 1) if pooling == "mean" else rows
        bottom = np.asarray(module.bottom(x["dense"]))
        vectors = np.concatenate([bottom[:, None], want], axis=1)
        pairs = [[vectors[b, i] @ vectors[b, j] for i in range(4) for j in range(i + 1, 4)]
                 for b in range(2)]
        top_in = np.concatenate([bottom, np.array(pairs)], axis=1)
        np.testing.assert_allclose(module(x), module.top(jnp.asarray(top_in)), rtol=1e-5,
                                   atol=1e-6)
    wrong = {"dense": x["dense"], "sparse": jnp.asarray([[5, 0, 0]], jnp.int32)}  # table 0: 5
    assert np.isnan(np.asarray(module({**wrong, "dense": x["dense"][:1]}))).all()
    # Only -1 pads: another negative id is out of range (it was read as padding).
    negative = {"dense": x["dense"][:1], "sparse": jnp.asarray([[-5, 0, 0]], jnp.int32)}
    assert np.isnan(np.asarray(module(negative))).all()
    # Padding is selected out of the bag, so even a NaN padding row cannot reach the output.
    module.tables[...] = module.tables[...].at[1007:].set(jnp.nan)
    assert np.isfinite(np.asarray(module(x))).all()
    with pytest.raises(pk.ConfigError, match=r"built for 3 sparse features.*shape \(2, 4\)"):
        module({"dense": x["dense"], "sparse": jnp.zeros((2, 4), jnp.int32)})


def test_dlrm_learns_multi_hot_generated_logs_on_any_table_sizes():
    from podkit.config import CriteoDataConfig
    from podkit.datasets.criteo import load_criteo

    cfg = CriteoDataConfig(samples=30000, dense_features=4, sparse_features=3,
                           table_sizes=[7, 300, 50], multi_hot=3, zipf=1.05)
    data = load_criteo(cfg, seed=0)
    (x, y), (vx, vy) = data.train, data.validation
    assert x["sparse"].shape == (len(y), 3, 3) and (x["sparse"][:, :, 0] >= 0).all()
    assert (x["sparse"] < np.array([7, 300, 50])[None, :, None]).all()
    with pk.DataParallel().scope():
        model = build_dlrm(DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8],
                                      pooling="mean"), data.info)
        model.compile(optimizer=pk.optimizers.Adam(learning_rate=0.01),
                      loss=pk.losses.BinaryCrossentropy(from_logits=True), metrics=["auc"],
                      steps_per_execution=8)
    history = model.fit(x, y, batch_size=256, epochs=2, validation_data=(vx, vy), verbose=0)
    # Half the way from chance to the best any model can score (measured: 0.668 of 0.768).
    assert history.history["val_auc"][-1] > 0.5 + (data.info["bayes_auc"] - 0.5) * 0.5
