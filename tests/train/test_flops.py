"""FLOPs of traced programs (podkit.train.flops): XLA's cost analysis where it is right (no
loops), loop bodies times their trip counts where it is not, splash attention as the
attention it computes."""

import jax
import jax.numpy as jnp
import pytest

from podkit.kernels.attention import dot_product_attention
from podkit.train import flops


def _xla_flops(f, *args):
    """XLA:CPU's count (on every backend: a TPU's compiler counts padding and layouts its
    own way, e.g. 215,552 FLOPs for the convolution below against the dense 169,344)."""
    args = jax.device_put(args, jax.devices("cpu")[0])
    return jax.jit(f).lower(*args).compile().cost_analysis()["flops"]


def test_matmuls_and_convolutions_match_xla_cost_analysis_without_loops():
    x, w = jnp.ones((32, 64)), jnp.ones((64, 128))
    mlp = lambda x, w: jnp.tanh(x @ w) @ w.T
    counted, notes = flops.count(jax.make_jaxpr(mlp)(x, w))
    assert counted == 2 * 2 * 32 * 64 * 128 and notes == []
    assert counted == pytest.approx(_xla_flops(mlp, x, w), rel=0.05)  # XLA adds the tanh
    img, k = jnp.ones((2, 16, 16, 3)), jnp.ones((3, 3, 3, 8))
    # VALID: with SAME padding XLA leaves out the taps that fall on the border's zeros;
    # MFU's convention (and podkit's count) is the dense count.
    conv = lambda img, k: jax.lax.conv_general_dilated(img, k, (1, 1), "VALID",
                                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
    counted, _ = flops.count(jax.make_jaxpr(conv)(img, k))
    assert counted == 2 * (2 * 14 * 14 * 8) * (3 * 3 * 3)
    assert counted == pytest.approx(_xla_flops(conv, img, k), rel=0.05)


def test_work_whose_results_nothing_reads_is_not_counted_as_xla_drops_it():
    x, w = jnp.ones((32, 64)), jnp.ones((64, 128))

    def f(x, w):
        unused = jnp.tanh(x @ w) @ w.T  # traced, never read: XLA removes it
        del unused
        return jax.lax.scan(lambda c, _: (c @ w @ w.T, None), x, None, length=3)[0]

    counted, _ = flops.count(jax.make_jaxpr(f)(x, w))
    assert counted == 3 * 2 * 2 * 32 * 64 * 128
    assert _xla_flops(f, x, w) == pytest.approx(counted / 3, rel=0.05)  # XLA: the body once


def test_each_op_class_is_counted_apart_inside_loops_and_gradients():
    img, k = jnp.ones((2, 8, 8, 3)), jnp.ones((3, 3, 3, 4))
    w = jnp.ones((6 * 6 * 4, 10))

    def net(img, k, w):  # a convolution, then a matmul, three times over in a scan
        def body(c, _):
            h = jax.lax.conv_general_dilated(img, k, (1, 1), "VALID",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return c + (h.reshape(2, -1) @ w).sum(), None
        return jax.lax.scan(body, 0.0, None, length=3)[0]

    forward = jax.make_jaxpr(net)(img, k, w)
    by_class, _ = flops.count_by_class(forward)
    assert by_class.conv == 3 * 2 * (2 * 6 * 6 * 4) * (3 * 3 * 3)
    assert by_class.dot == 3 * 2 * 2 * (6 * 6 * 4) * 10
    for jaxpr in (forward, jax.make_jaxpr(jax.grad(net, argnums=(1, 2)))(img, k, w)):
        by_class, _ = flops.count_by_class(jaxpr)
        assert by_class.conv > 0 and by_class.dot > 0
        assert by_class.total == flops.count(jaxpr)[0]


def test_a_cond_counts_its_costliest_branch_whole():
    x, w = jnp.ones((8, 8)), jnp.ones((8, 8))
    img, k = jnp.ones((1, 6, 6, 1)), jnp.ones((3, 3, 1, 1))
    conv = lambda: jax.lax.conv_general_dilated(img, k, (1, 1), "VALID",
                                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
    # branch 0: two matmuls (2 x 1024 FLOPs); branch 1: one small convolution (2 x 144)
    f = lambda p: jax.lax.cond(p, lambda: (x @ w @ w).sum(), lambda: conv().sum())
    by_class, _ = flops.count_by_class(jax.make_jaxpr(f)(True))
    assert by_class == flops.Flops(dot=2 * 2 * 8 * 8 * 8, conv=0.0)


def test_a_scan_counts_its_body_times_its_length_where_xla_counts_it_once():
    x, w = jnp.ones((64, 128)), jnp.ones((128, 128))

    def f(x, w):
        return jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=6)[0].sum()

    counted, _ = flops.count(jax.make_jaxpr(f)(x, w))
    assert counted == 6 * 2 * 64 * 128 * 128
    assert _xla_flops(f, x, w) < counted / 5  # the reason podkit counts itself


def test_gradients_count_three_matmuls_per_forward_matmul():
    x, w = jnp.ones((32, 64)), jnp.ones((64, 16))
    grad = jax.grad(lambda w: (x @ w).sum())
    counted, _ = flops.count(jax.make_jaxpr(jax.value_and_grad(lambda w: (x @ w).sum()))(w))
    assert counted == 2 * 2 * 32 * 64 * 16  # forward + the weight gradient (x is constant)
    assert grad(w).shape == w.shape


@pytest.mark.parametrize("causal", [True, False])
def test_splash_attention_counts_as_the_attention_it_computes(causal):
    q = jnp.ones((2, 256, 4, 64), jnp.float32)

    # Over two devices: the kernel runs per device inside shard_map (per-device shapes).
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices("cpu")[:2],
                         axis_types=(jax.sharding.AxisType.Auto,))

    def loss(q, implementation):
        return dot_product_attention(q, q, q, causal=causal, mesh=mesh,
                                     implementation=implementation).sum()

    # value_and_grad, as a train step (which logs its loss): under grad alone the forward's
    # last product feeds nothing and is not counted
    xla, _ = flops.count(jax.make_jaxpr(jax.value_and_grad(lambda q: loss(q, "xla")))(q))
    splash, notes = flops.count(jax.make_jaxpr(jax.value_and_grad(
        lambda q: loss(q, "splash")))(q))
    full = 6 * 2 * (2 * 4 * 256 * 256 * 64)  # forward 2 products, backward 4
    assert xla == full  # XLA computes the masked half too
    assert splash == pytest.approx(full * (0.5 if causal else 1.0), rel=0.01)
    assert notes == []
