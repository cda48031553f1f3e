"""The analytic models (podkit.sim.analytic) against the compiled program where both apply:
podkit's GPT on DP, FSDP and TP meshes (compiled once, in test_program.py), ResNet-50 against
its published figures and podkit's own ResNet-50 (traced, not compiled)."""

import pytest
from test_program import BATCH, FF, HEADS, LAYERS, MESHES, SEQ, VOCAB, D, big, compiled

from podkit.errors import ConfigError
from podkit.sim import analytic as A

F32 = 4


def analytic(name: str, **kw) -> A.Program:
    """The analytic model of the compiled tiny GPT: float32 compute and weights, AdamW."""
    return A.transformer(LAYERS, D, HEADS, FF, VOCAB, SEQ, BATCH, MESHES[name],
                         compute_bytes=F32, **kw)


def total(program: A.Program, kind: str, axes: tuple[str, ...] | None = None) -> int:
    return sum(c.total_bytes for c in big(program, kind, axes))


@pytest.mark.parametrize("name", list(MESHES))
def test_flops_parameters_and_state_agree_with_the_compiled_gpt(name):
    got, model = compiled(name), analytic(name, causal=False)
    # podkit's count on the jaxpr is MaxText's formula without halving the causal scores
    # (XLA computes the whole s x s matrix): the same matmuls, the same number.
    assert model.flops == pytest.approx(got.flops, rel=1e-9)
    # MaxText's own definition counts half of the attention scores.
    causal = analytic(name).flops
    assert causal < got.flops and causal == pytest.approx(got.flops, rel=0.10)
    assert model.params == got.params
    assert model.param_bytes == got.param_bytes
    assert model.optimizer_bytes == pytest.approx(got.optimizer_bytes, rel=0.01)  # + counters
    # Activations and temporaries: an estimate against XLA's buffer assignment (measured:
    # 8-18% under it).
    assert model.memory_per_device_bytes == pytest.approx(got.memory_per_device_bytes,
                                                          rel=0.25)


def test_dp_gradient_all_reduce_agrees():
    got, model = compiled("dp"), analytic("dp")
    assert {c.kind for c in model.collectives} == {"all-reduce"}
    assert total(model, "all-reduce", ("data",)) == pytest.approx(
        total(got, "all-reduce", ("data",)), rel=0.001)
    assert sum(c.count for c in model.collectives) == LAYERS + 1  # one per layer (an upper
    # bound: XLA:CPU combined them into one)


def test_fsdp_gathers_and_gradient_reduction_agree():
    got, model = compiled("fsdp"), analytic("fsdp")
    assert total(model, "all-gather") == pytest.approx(total(got, "all-gather"), rel=0.01)
    sync = lambda p: total(p, "reduce-scatter") + total(p, "all-reduce")
    assert sync(model) == pytest.approx(sync(got), rel=0.01)
    # By kind: podkit's token table is gathered whole for its lookup and clipping reads its
    # gradient whole, so XLA all-reduces it; the model scatters every `embed` gradient.
    table = VOCAB * D * F32
    assert total(model, "reduce-scatter") - table == pytest.approx(
        total(got, "reduce-scatter"), rel=0.01)
    # Per layer: one gather (no remat) and one scatter of the layer's weights.
    qkv = 3 * D * D * F32
    layer = [c for c in model.collectives if c.kind == "all-gather" and c.count == LAYERS]
    assert len(layer) == 1 and layer[0].bytes > qkv
    assert [c.count for c in analytic("fsdp", remat="full").collectives
            if c.kind == "all-gather" and c.bytes == layer[0].bytes] == [2 * LAYERS]


def test_tp_activation_and_gradient_collectives_agree():
    # The residual stream is split over model between blocks (the `activation_embed` rule):
    # Megatron's all-reduce of each block's (b, s, d) output is a reduce-scatter, and the next
    # block's input an all-gather. The compiled program has them (and a few more around the
    # embedding lookup and the loss, laid out XLA's way).
    got, model = compiled("tp"), analytic("tp")
    activation = BATCH // 2 * SEQ * D * F32
    ours = sorted((c.kind, c.axes, c.count) for c in model.collectives
                  if c.bytes == activation)
    assert ours == [("all-gather", ("model",), 4 * LAYERS + 2),
                    ("reduce-scatter", ("model",), 4 * LAYERS + 2)]
    theirs = {kind: sum(c.count for c in got.collectives if c.axes == ("model",)
                        and c.kind == kind and c.bytes == activation)
              for kind in ("all-gather", "reduce-scatter")}
    assert theirs["reduce-scatter"] == pytest.approx(4 * LAYERS + 2, abs=1)
    assert theirs["all-gather"] == pytest.approx(4 * LAYERS + 2, abs=2)
    # The gradients over data; the norms' (d wide, computed from model-split activations)
    # XLA reduces in part over data and model together: 3% of the bytes move between groups.
    assert total(model, "all-reduce", ("data",)) == pytest.approx(
        total(got, "all-reduce", ("data",)), rel=0.03)


def test_a_175b_model_is_modelled_without_compiling():
    # GPT-3 175B (Brown et al. 2020): 96 layers, d 12288, 96 heads, 2048 tokens.
    gpt3 = A.transformer(96, 12288, 96, 4 * 12288, 51200, 2048, 1536,
                         {"data": 8, "fsdp": 64, "model": 8}, remat="full")
    assert gpt3.params == pytest.approx(175e9, rel=0.01)
    # 6 N per token plus the attention, within a few percent.
    per_token = gpt3.flops * gpt3.devices / gpt3.tokens_per_step
    assert per_token == pytest.approx(6 * gpt3.params, rel=0.06)
    assert gpt3.param_bytes == pytest.approx(gpt3.params * F32 / 512, rel=0.01)
    kinds = {(c.kind, c.axes) for c in gpt3.collectives}
    assert {("all-gather", ("fsdp",)), ("reduce-scatter", ("fsdp",)),
            ("all-reduce", ("data",)), ("all-reduce", ("model",))} <= kinds
    assert gpt3.memory_per_device_bytes < 95 * 2 ** 30  # fits a v5p chip
    no_remat = A.transformer(96, 12288, 96, 4 * 12288, 51200, 2048, 1536,
                             {"data": 8, "fsdp": 64, "model": 8})
    assert no_remat.activation_bytes > 4 * gpt3.activation_bytes


def test_resnet50_matches_its_published_figures_and_podkits_own():
    import flax.nnx as nnx
    import jax
    import jax.numpy as jnp
    import numpy as np

    from podkit.config import ResNetConfig
    from podkit.models.resnet import ResNet
    from podkit.train import flops

    r = A.resnet50(256, {"data": 8})
    assert r.params == A.RESNET50_PARAMS  # torchvision's 25,557,032
    forward = r.flops * r.devices / r.global_batch / 3
    assert forward / 2 == pytest.approx(A.RESNET50_MACS_224, rel=0.001)  # 4.09 G mult-adds

    def forward_pass(x):  # traced, not compiled
        with nnx.use_eager_sharding(False):
            return ResNet(ResNetConfig(depth=50), 1000, (224, 224, 3), nnx.Rngs(0))(x)

    counted, _ = flops.count(jax.make_jaxpr(forward_pass)(jnp.zeros((1, 224, 224, 3))))
    assert forward == pytest.approx(counted, rel=1e-9)
    with nnx.use_eager_sharding(False):
        module = nnx.eval_shape(lambda: ResNet(ResNetConfig(depth=50), 1000, (224, 224, 3),
                                               nnx.Rngs(0)))
    assert r.params == sum(int(np.prod(v.shape))
                           for v in jax.tree.leaves(nnx.state(module, nnx.Param)))
    # every gradient in one all-reduce, as XLA's combiner leaves them (podkit's compiled
    # ResNet-50 on 2 devices: one of 101.85 MB)
    (grads,) = [c for c in r.collectives if not c.critical]
    assert grads.count == 1 and grads.bytes == pytest.approx(r.params * F32, rel=1e-6)
    batchnorm = [c for c in r.collectives if c.critical]  # 53 layers, both passes
    assert sum(c.count for c in batchnorm) == 2 * 53 and all(c.bytes < 64 * 1024
                                                             for c in batchnorm)
    assert all(c.axes == ("data",) and c.group_size == 8 for c in r.collectives)
    # per-device BatchNorm statistics: no BatchNorm collectives, the gradients' all-reduce
    assert A.resnet50(256, {"data": 8}, synchronized_bn=False).collectives == (grads,)
    assert r.conv_flops == pytest.approx(r.flops, rel=0.001)  # all but the classifier
    # At 112 px each stage has a quarter of the pixels (7 x 7 becomes 4 x 4 at the end).
    assert A.resnet50(256, {"data": 8}, image_size=112).flops == pytest.approx(
        r.flops / 4, rel=0.1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mesh": {"data": 2, "model": 8}}, "heads = 4 is not divisible by the mesh's model = 8"),
    ({"mesh": {"model": 3}, "heads": 6, "d_model": 36},
     "ff = 64 is not divisible by the mesh's model = 3"),
    ({"mesh": {"fsdp": 3}, "global_batch": 6},
     "d_model = 32 is not divisible by the mesh's fsdp = 3"),
    ({"mesh": {"tensor": 2}}, "unknown mesh axis 'tensor'"),
    ({"mesh": {"data": 3}}, "global_batch=8 is not divisible by data x fsdp = 3"),
    ({"mesh": {"data": 2}, "kv_heads": 3}, "heads=4 is not divisible by kv_heads=3"),
    ({"mesh": {"data": 2}, "remat": "some"}, "remat='some'.*none, minimal, full"),
    ({"mesh": {"data": 2}, "layers": 0}, "layers=0; give a positive int"),
])
def test_bad_transformer_input_is_named(kwargs, match):
    args = {"layers": LAYERS, "d_model": D, "heads": HEADS, "ff": FF, "vocab": VOCAB,
            "seq": SEQ, "global_batch": BATCH, **kwargs}
    with pytest.raises(ConfigError, match=match):
        A.transformer(**args)


def test_bad_resnet_input_is_named():
    with pytest.raises(ConfigError, match="models data and fsdp only"):
        A.resnet50(64, {"data": 2, "model": 2})
    with pytest.raises(ConfigError, match="global_batch=10 is not divisible"):
        A.resnet50(10, {"data": 4})


LLAMA = """
[data]
name = "text"
batch_size = 8
seq_len = 16
vocab_size = 256

[model]
name = "llama"
layers = 2
heads = 4
kv_heads = 2
head_dim = 16
embed = 32
mlp = 48
qkv_bias = true
qk_norm = true
scan_layers = false
vocab_chunk = 0

[train]
optimizer = "adamw"
loss = "sparse_categorical_crossentropy"
from_logits = true
"""


def test_the_llama_twin_agrees_with_the_compiled_llama(tmp_path):
    """The planner's twin of a Llama-family config (GQA, head_dim apart from the width, SwiGLU,
    Qwen's q/k/v biases and q/k norm, untied) counts the FLOPs and parameters of the program
    XLA compiles for it; tied, the token table is the output layer."""
    from podkit.config import load
    from podkit.sim import plan
    from podkit.sim import program as P

    path = tmp_path / "llama.toml"
    path.write_text(LLAMA + "\n[strategy]\nkind = \"data_parallel\"\n")
    got = P.extract(path, {"data": 2})
    twin = plan.Transformer.of_config(load(path), "gpu")  # XLA's attention
    assert twin is not None and twin.kv_heads == 2 and twin.head_dim == 16 and twin.gated_mlp
    model = twin.program({"data": 2}, 8)
    assert model.params == got.params
    assert model.param_bytes == got.param_bytes
    # float32 here (the config's precision): the twin's compute bytes follow it
    assert model.flops == pytest.approx(got.flops, rel=1e-9)
    assert got.dims["kv_heads"] == 2 and got.model_kind == "transformer"
    tied = plan.Transformer.of_config(load(path, ["model.tie_embeddings=true"]), "gpu")
    assert tied.program({"data": 2}, 8).params == model.params - 256 * 32  # vocab x embed
