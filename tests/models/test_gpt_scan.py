"""The GPT's blocks under nnx.scan: the same math as the unrolled loop (logits, loss and
gradients to 1e-5 from the same weights, and the same training), a `layers` axis no rule
splits, a train step handed to XLA with one block whatever the depth; its remat policies: the
compiled step's temporary memory in the documented order. Timings and sizes are printed
(`pytest -s`); what is asserted is sizes and their order, never seconds."""

import dataclasses

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from gpt_common import SEQ, SMALL, VOCAB, build_abstract, fit_history, gpt_model, tokens, train_step

import podkit as pk
from podkit.config import GPTConfig
from podkit.models.gpt import GPT
from podkit.train.feeds import BatchInputs


def stack_blocks(params: dict) -> dict:
    """An unrolled GPT's parameters (pure dict) laid out as the scanned GPT's."""
    blocks = params["blocks"]
    layers = [blocks[k] for k in sorted(blocks, key=int)]
    return {**params, "blocks": jax.tree.map(lambda *a: jnp.stack(a), *layers)}


def modules(config=SMALL, vocab=VOCAB):
    """(unrolled, scanned) GPT modules holding the same weights."""
    with nnx.use_eager_sharding(False):  # as pk.Model builds: the strategy places them
        unrolled = GPT(dataclasses.replace(config, scan_layers=False), vocab, SEQ,
                       nnx.Rngs(0))
        scanned = GPT(config, vocab, SEQ, nnx.Rngs(1))
    target = nnx.state(scanned, nnx.Param)
    nnx.replace_by_pure_dict(target, stack_blocks(nnx.to_pure_dict(
        nnx.state(unrolled, nnx.Param))))
    nnx.update(scanned, target)
    return unrolled, scanned


@nnx.jit
def logits_loss_and_grads(module, x, y):
    def loss(m):
        return optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
    value, grads = nnx.value_and_grad(loss)(module)
    return module(x), value, nnx.to_pure_dict(grads)


@pytest.mark.parametrize("remat", ["none", "minimal"])
def test_scanned_blocks_compute_what_the_unrolled_loop_computes(remat):
    config = dataclasses.replace(SMALL, remat=remat)
    unrolled, scanned = modules(config)
    x, y = tokens(4)
    logits_u, value_u, grads_u = logits_loss_and_grads(unrolled, x, y)
    logits_s, value_s, grads_s = logits_loss_and_grads(scanned, x, y)
    np.testing.assert_allclose(logits_s, logits_u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value_s, value_u, rtol=1e-5)
    jax.tree.map(lambda s, u: np.testing.assert_allclose(s, u, rtol=1e-5, atol=1e-6),
                 grads_s, stack_blocks(grads_u))


def test_a_scanned_model_trains_as_the_unrolled_one_from_the_same_weights():
    x, y = tokens(8)
    unrolled = gpt_model(dataclasses.replace(SMALL, scan_layers=False), metrics=["accuracy"])
    scanned = gpt_model(SMALL, metrics=["accuracy"])
    for model in (unrolled, scanned):
        model.build((SEQ,), dtype=np.int32)
    params = jax.device_put(jax.tree.map(jnp.copy, stack_blocks(unrolled.state.params)),
                            scanned._layout.shardings.params)  # a copy: fit donates the state
    scanned.state = scanned.state.replace(params=params)
    want, got = fit_history(unrolled, x, y), fit_history(scanned, x, y)
    assert want["loss"][-1] < want["loss"][0]
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)


def test_stacked_parameters_carry_an_unsplit_layers_axis():
    model = build_abstract(gpt_model(SMALL, strategy=pk.FSDP()), tokens(1)[0])
    rows = {r["path"]: r for r in model.sharding_table() if r["kind"] == "param"}
    qkv = rows["blocks/attn/qkv"]
    assert qkv["shape"] == [SMALL.layers, 3, SMALL.embed, SMALL.heads, 16]
    assert qkv["spec"][:3] == [None, None, "fsdp"]  # layers, (q, k, v), embed
    assert rows["blocks/mlp/up"]["spec"] == [None, "fsdp", None]  # layers, embed, mlp
    assert not any(p.startswith("blocks/0") for p in rows)


def test_dropout_under_the_scan_draws_per_layer_and_per_step():
    config = dataclasses.replace(SMALL, dropout=0.3)
    x, y = tokens(8)
    first = gpt_model(config)
    losses = fit_history(first, x, y)["loss"]
    assert np.all(np.isfinite(losses))
    again = fit_history(gpt_model(config), x, y)["loss"]
    np.testing.assert_array_equal(losses, again)  # the same seed, the same masks
    keys = jax.tree.leaves(first.state.rng)
    assert any(k.shape[:1] == (SMALL.layers,) for k in keys)  # each layer its own stream


def lowered_train_step(config, x, y) -> str:
    """The text of the model's own train step for one batch, lowered (not compiled) on the
    layout's abstract state."""
    model = build_abstract(gpt_model(config), x)
    program = model._program
    ones = np.ones((1, len(x)), np.float32)
    return program.train.lower(model.state, program.zeros(),
                               BatchInputs(x[None], y[None], ones, ones)).as_text()


def test_scanned_layers_hand_xla_one_block_whatever_the_depth():
    """Why the scan compiles faster: the program XLA gets holds one block inside a loop, so
    its size does not grow with the layers, where the unrolled program holds every block (6
    layers: unrolled 18,039 optimized HLO instructions compiled in 24 s, scanned 3,163 in
    13 s, on a busy 2-core machine). Asserted on the lowered programs of 2 and 8 layers,
    whose structure does not depend on the machine's load and needs no compile: the
    unrolled one's matrix products grow by one block's per layer; the scanned one's are one
    block's (plus the embedding's and the head's) at either depth, in while loops of its
    own, and it holds as many operations at 2 layers as at 8."""
    x, y = tokens(4)
    text = {(layers, scan): lowered_train_step(GPTConfig(
                layers=layers, heads=2, embed=32, mlp=64, sample_tokens=0, scan_layers=scan),
                x, y)
            for layers in (2, 8) for scan in (False, True)}
    ops = {key: sum(" = " in line for line in t.splitlines()) for key, t in text.items()}
    dots = {key: t.count("stablehlo.dot_general") for key, t in text.items()}
    loops = {key: t.count("stablehlo.while") for key, t in text.items()}
    print("\nGPT train step, lowered operations (matrix products): "
          + ", ".join(f"{layers} layers {'scanned' if scan else 'unrolled'} {ops[layers, scan]}"
                      f" ({dots[layers, scan]})" for layers, scan in sorted(text)))
    per_block = (dots[8, False] - dots[2, False]) / 6
    outside = dots[2, False] - 2 * per_block  # the embedding's and the head's products
    assert per_block >= 6 and outside >= 1, dots  # q/k/v, scores, mix, out, up, down at least
    for layers in (2, 8):
        assert loops[layers, True] > loops[layers, False], loops  # the scan's loops
        assert dots[layers, True] == outside + per_block, (layers, dots)
    assert ops[8, True] == ops[2, True], ops
    assert ops[8, True] < 0.4 * ops[8, False], ops


# What each policy keeps per layer for the backward pass (docs/sharding.md): none everything
# (attention's probabilities included), minimal the four named projections, save_qkv_proj
# only q/k/v, full only the block's input. Measured on this config, in this order.
REMAT_ORDER = ("none", "minimal", "save_qkv_proj", "full")


def test_remat_policies_cut_temporary_memory_in_the_documented_order():
    config = GPTConfig(layers=4, heads=4, embed=64, mlp=256, sample_tokens=0)
    x, y = tokens(8, seq=64)
    temp = {}
    for remat in REMAT_ORDER:
        model = gpt_model(dataclasses.replace(config, remat=remat), seq=64)
        temp[remat] = train_step(model, x, y)[0]
    print("\ntrain step temporary memory by remat policy (4 layers, batch 8 x 64, width 64): "
          + ", ".join(f"{k} {v / 2**10:.0f} KiB" for k, v in temp.items()))
    sizes = [temp[k] for k in REMAT_ORDER]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1], temp


def test_remat_names_by_model():
    from podkit.config import ResNetConfig
    from podkit.models.resnet import build_resnet

    for remat in ("minimal", "save_qkv_proj", "dots_saveable", "nothing_saveable"):
        build_abstract(gpt_model(dataclasses.replace(SMALL, remat=remat)), tokens(1)[0])
    with pytest.raises(pk.ConfigError, match="needs a model whose blocks name"):
        build_resnet(ResNetConfig(remat="minimal"), {"classes": 10, "image_shape": (8, 8, 1)})
    with pytest.raises(pk.ConfigError, match="remat = 'some'"):
        gpt_model(dataclasses.replace(SMALL, remat="some")).build((SEQ,), dtype=np.int32)
