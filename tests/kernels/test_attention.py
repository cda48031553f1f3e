"""podkit.kernels.attention on CPU: splash attention in Pallas's interpreter against XLA's
attention (forward and gradients, causal or not, several shapes, one device and meshes of
4 with the batch or the heads split), the block sizes, the fallback to XLA with one
warning, the errors, and a GPT whose loss is the same with either kernel."""

import contextlib
import warnings

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import podkit as pk
from podkit.config import GPTConfig, from_dict
from podkit.kernels import (
    KernelFallbackWarning,
    attention_probabilities,
    block_size,
    dot_product_attention,
    resolve_implementation,
)
from podkit.models.gpt import Attention, build_gpt
from podkit.strategy import FSDP, TensorParallel


def qkv(batch, time, heads, dim, v_dim=None, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(k, (batch, time, heads, d), jnp.float32)
                 for k, d in zip(keys, (dim, dim, v_dim or dim), strict=True))


def loss_and_grads(q, k, v, *, causal=True, **kwargs):
    """The output and the gradients of a weighted sum of it (weights that differ per place,
    so that no gradient is zero by symmetry), jitted."""
    def loss(q, k, v):
        out = dot_product_attention(q, k, v, causal=causal, **kwargs)
        weights = jnp.cos(jnp.arange(out.size, dtype=jnp.float32).reshape(out.shape) * 0.37)
        return (out * weights).sum(), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
        q, k, v)
    return out, grads


def assert_matches_xla(q, k, v, *, causal=True, **kwargs):
    out, grads = loss_and_grads(q, k, v, causal=causal, implementation="splash", **kwargs)
    ref_out, ref_grads = loss_and_grads(q, k, v, causal=causal, implementation="xla")
    assert out.dtype == q.dtype and out.shape == (*q.shape[:3], v.shape[3])
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-4)
    for g, ref in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-3)


def mesh_of(axes, devices=4):
    return jax.make_mesh(tuple(axes.values()), tuple(axes), devices=jax.devices()[:devices])


@pytest.mark.parametrize("time,heads,dim,causal", [
    (128, 3, 64, True), (512, 2, 128, True), (256, 2, 32, False)])
def test_splash_matches_xla_on_one_device(time, heads, dim, causal):
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)  # splash really ran
        assert_matches_xla(*qkv(2, time, heads, dim), causal=causal,
                           mesh=mesh_of({"data": 1}, devices=1))


def test_splash_takes_a_value_head_dim_of_its_own():
    q, k, v = qkv(1, 128, 1, 64, v_dim=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        assert_matches_xla(q, k, v, mesh=mesh_of({"data": 1}, devices=1))
    # XLA's own path for it (jax.nn takes one head dim) is the plain computation.
    probs = attention_probabilities(q, k, causal=True)
    plain = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    np.testing.assert_allclose(dot_product_attention(q, k, v, causal=True,
                                                     implementation="xla"),
                               plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_splash_takes_grouped_and_multi_query_kv_heads_as_they_are(kv_heads):
    # 4 query heads over 2 k/v heads (grouped-query) or 1 (multi-query): the kernel reads
    # each group's k/v head, and so do its gradients (dk, dv summed over the group).
    q, _, _ = qkv(2, 128, 4, 64, seed=2)
    _, k, v = qkv(2, 128, kv_heads, 64, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        assert_matches_xla(q, k, v, mesh=mesh_of({"data": 1}, devices=1))
    # ... also split over `model` (2 devices: 2 k/v heads split; 1 stays whole).
    tp = TensorParallel(model=2, devices=jax.devices()[:4])
    sharding = NamedSharding(tp.mesh, P("data", None, "model"))
    q = jax.device_put(q, sharding)
    with warnings.catch_warnings(), tp.scope():
        warnings.simplefilter("error", KernelFallbackWarning)
        assert_matches_xla(q, k, v)


def test_kv_heads_that_do_not_divide_the_query_heads_are_not_splashs():
    q, _, _ = qkv(1, 256, 4, 32)
    _, k, v = qkv(1, 256, 3, 32)
    with pytest.warns(KernelFallbackWarning, match="3 k and 3 v heads for 4 query heads"):
        with pytest.raises(ValueError):  # XLA's attention refuses them too
            dot_product_attention(q, k, v, causal=True, implementation="splash",
                                  mesh=mesh_of({"data": 1}, 1))


MESHES = {
    # the batch over `data`: a mesh passed in, the spec the kernel defaults to
    "data_parallel": (lambda: mesh_of({"data": 4}), 4, P("data")),
    # the batch over `fsdp` from the strategy in scope; 2 rows for 4 devices stay whole
    "fsdp_uneven_batch": (lambda: FSDP(devices=jax.devices()[:4]), 2, P()),
    # heads over `model`, the batch over `data`, from the strategy in scope
    "tensor_parallel": (lambda: TensorParallel(model=2, devices=jax.devices()[:4]), 4,
                        P("data", None, "model")),
}


@pytest.mark.parametrize("name", list(MESHES))
def test_splash_matches_xla_over_a_mesh(name):
    make, batch, spec = MESHES[name]
    where = make()
    given = isinstance(where, jax.sharding.Mesh)
    mesh = where if given else where.mesh
    sharding = NamedSharding(mesh, spec)
    q, k, v = (jax.device_put(a, sharding) for a in qkv(batch, 128, 4, 64, seed=1))
    kwargs = {"mesh": mesh} if given else {}
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.simplefilter("error", KernelFallbackWarning)
        if not given:
            stack.enter_context(where.scope())
        assert_matches_xla(q, k, v, **kwargs)
        jaxpr = str(jax.make_jaxpr(lambda q, k, v: dot_product_attention(
            q, k, v, causal=True, implementation="splash", **kwargs))(q, k, v))
    assert "shard_map" in jaxpr  # the kernel ran per device


def test_block_sizes_are_the_largest_multiple_of_128_up_to_512_that_divides():
    assert [block_size(t) for t in (128, 256, 384, 512, 640, 768, 1024, 2048, 8192)] == \
        [128, 256, 384, 512, 128, 384, 512, 512, 512]
    with pytest.raises(pk.ConfigError, match="multiple of 128, not 100"):
        block_size(100)


def test_a_length_splash_cannot_take_falls_back_to_xla_with_one_warning():
    q, k, v = qkv(2, 100, 2, 64)
    mesh = mesh_of({"data": 1}, devices=1)
    with pytest.warns(KernelFallbackWarning, match=r"query length of 100.*multiples of 128"):
        out = dot_product_attention(q, k, v, causal=True, implementation="splash", mesh=mesh)
    np.testing.assert_array_equal(out, dot_product_attention(q, k, v, causal=True,
                                                             implementation="xla"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)  # once per shape
        dot_product_attention(q, k, v, causal=True, implementation="splash", mesh=mesh)


def test_several_devices_and_no_mesh_fall_back_to_xla():
    assert len(jax.devices()) > 1
    q, k, v = qkv(2, 128, 2, 64, seed=2)
    with pytest.warns(KernelFallbackWarning, match="no mesh"):
        out = dot_product_attention(q, k, v, causal=False, implementation="splash")
    np.testing.assert_array_equal(out, dot_product_attention(q, k, v, causal=False,
                                                             implementation="xla"))


def test_a_padding_mask_goes_through_xla():
    q, k, v = qkv(2, 128, 2, 64)
    mask = jnp.arange(128)[None, None, None, :] < jnp.array([100, 128])[:, None, None, None]
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)  # documented, not warned
        out = dot_product_attention(q, k, v, causal=True, mask=mask, implementation="splash",
                                    mesh=mesh_of({"data": 1}, devices=1))
    np.testing.assert_array_equal(out, jax.nn.dot_product_attention(q, k, v, mask=mask,
                                                                    is_causal=True))


def test_auto_is_xla_off_a_tpu_and_bad_names_are_config_errors():
    assert resolve_implementation("auto") == "xla"
    assert resolve_implementation("splash") == "splash"
    q, k, v = qkv(1, 128, 1, 64)
    with pytest.raises(pk.ConfigError, match=r"attention='flash'.*'auto', 'xla', 'splash'"):
        dot_product_attention(q, k, v, causal=True, implementation="flash")
    with pytest.raises(pk.ConfigError, match=r"attention='Splash'"):
        Attention(GPTConfig(attention="Splash"), nnx.Rngs(0), jnp.float32, jnp.float32)
    assert from_dict({"model": {"name": "gpt", "attention": "splash"}}).model.attention == \
        "splash"
    with pytest.raises(pk.ConfigError,
                       match=r"model.attention = 'flash'; allowed values: auto, xla, splash"):
        from_dict({"model": {"name": "gpt", "attention": "flash"}})
    with pytest.raises(pk.ConfigError, match=r"splits only the batch"):
        dot_product_attention(q, k, v, causal=True, implementation="splash",
                              mesh=mesh_of({"data": 1}, devices=1), spec=P(None, "data"))


def test_gpt_loss_is_the_same_with_splash_and_xla():
    vocab, seq = 64, 128
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (4, seq)).astype(np.int32)
    y = np.roll(x, -1, axis=1)
    losses = {}
    for attention in ("xla", "splash"):
        config = GPTConfig(layers=1, heads=2, embed=128, mlp=128, attention=attention,
                           sample_tokens=0)
        with pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1]).scope():
            model = build_gpt(config, {"vocab_size": vocab, "seq_len": seq}, seed=0)
            model.compile(optimizer="adam",
                          loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
        with warnings.catch_warnings():
            warnings.simplefilter("error", KernelFallbackWarning)
            history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
        losses[attention] = history.history["loss"]
    np.testing.assert_allclose(losses["splash"], losses["xla"], rtol=1e-5)


def _packed_ids(batch, time, lengths):
    """(batch, time) segment ids: rows packed with examples of `lengths`, padding 0 after."""
    ids = np.zeros((batch, time), np.int32)
    for b in range(batch):
        at = 0
        for s, n in enumerate(lengths[b], 1):
            ids[b, at:at + n] = s
            at += n
    return jnp.asarray(ids)


@pytest.mark.parametrize("over_mesh", [False, True])
def test_segment_ids_keep_packed_examples_apart_in_splash_and_xla(over_mesh):
    """Packed sequences: each query attends only to its own segment's keys. Splash (its
    SegmentIds, GQA k/v as they are, the batch split over a mesh or not) equals XLA's
    attention with the segment mask, forward and gradients; and XLA's equals attention of
    each example alone."""
    q, _, _ = qkv(4, 128, 4, 64, seed=5)
    _, k, v = qkv(4, 128, 2, 64, seed=6)
    ids = _packed_ids(4, 128, [[50, 40, 38], [128], [7, 100], [1, 60, 30]])
    ref_out, ref_grads = loss_and_grads(q, k, v, implementation="xla", segment_ids=ids)
    mesh = mesh_of({"data": 4}) if over_mesh else mesh_of({"data": 1}, devices=1)
    placed = (q, k, v, ids)
    if over_mesh:  # the batch split, as a strategy lays it out
        placed = tuple(jax.device_put(a, NamedSharding(mesh, P("data"))) for a in placed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        out, grads = loss_and_grads(*placed[:3], implementation="splash",
                                    segment_ids=placed[3], mesh=mesh)
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-4)
    for g, ref in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-3)
    packed = dot_product_attention(q, k, v, causal=True, segment_ids=ids, implementation="xla")
    kk, vv = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
    alone = dot_product_attention(q[:3, 50:90], kk[:3, 50:90], vv[:3, 50:90], causal=True,
                                  implementation="xla")
    np.testing.assert_allclose(packed[0, 50:90], alone[0], rtol=1e-5, atol=1e-5)


def test_segment_ids_of_another_shape_are_refused():
    q, k, v = qkv(2, 128, 2, 32)
    with pytest.raises(pk.errors.ConfigError, match=r"segment_ids of shape \(2, 64\)"):
        dot_product_attention(q, k, v, causal=True, segment_ids=jnp.zeros((2, 64), jnp.int32))
