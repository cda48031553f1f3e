"""The sums' packing across the call boundary (podkit.train.sums)."""

import jax
import jax.numpy as jnp
import numpy as np

import podkit as pk
from podkit.train.sums import SumsLayout

TREE = {"loss": {"total": np.float32(1.5), "count": np.float32(4)},
        "auc": {"tp": np.arange(3, dtype=np.float32), "fp": np.ones(3, np.float32)},
        "hits": {"n": np.int32(7)}}


def test_a_tree_packs_into_one_vector_per_dtype_and_back():
    layout = SumsLayout.of(TREE)
    packed = layout.pack(TREE, np)
    assert [(p.dtype, p.shape) for p in packed] == [(np.float32, (8,)), (np.int32, (1,))]
    back = layout.unpack(packed)
    assert jax.tree.structure(back) == jax.tree.structure(TREE)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(TREE), strict=True):
        assert a.dtype == np.result_type(b) and np.array_equal(a, b)


def test_traced_packing_adds_as_the_tree_would():
    layout = SumsLayout.of(TREE)

    @jax.jit
    def step(packed):
        tree = layout.unpack(packed)
        return layout.pack(jax.tree.map(lambda a: a + a, tree))

    out = layout.unpack(jax.device_get(step(layout.pack(TREE))))
    np.testing.assert_array_equal(out["auc"]["tp"], 2 * TREE["auc"]["tp"])
    assert out["hits"]["n"] == 14 and out["loss"]["count"] == 8


def test_a_programs_sums_are_one_array_and_its_checkpoint_tree_is_unchanged():
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    x = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    program = model._program
    zeros = program.zeros()
    assert len(jax.tree.leaves(zeros)) == 1  # loss, accuracy and the step's own: one buffer
    tree = program.sums_tree(zeros)  # what a checkpoint keeps: the entries by name
    assert set(tree) == {"loss", "accuracy", "_steps"} and set(tree["loss"]) == {"total",
                                                                                  "count"}
    again = program.packed_sums(jax.tree.map(lambda a: a + 1, tree))
    assert float(program.host_sums(again)["accuracy"]["count"]) == 1.0
    assert jnp.asarray(again[0]).sharding == program.sums_sharding
