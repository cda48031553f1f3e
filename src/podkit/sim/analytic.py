"""Analytic programs: a transformer's or ResNet-50's train step on a mesh from formulas, for
sizes too large to compile here (175B and up). They agree with the compiled program where both
apply (tests/sim/test_analytic.py); each returns a podkit.sim.program.Program.

Transformer (`transformer`): podkit's GPT by default (pre-norm blocks, LayerNorm with bias,
biases on every projection, learned positions, an untied output layer, a GELU MLP), or a
LLaMA-like one (`gated_mlp`, `biases=False`, `learned_positions=False`, `kv_heads` for
grouped-query attention).

- FLOPs: MaxText's `calculate_tflops_training_per_device` (AI-Hypercomputer/maxtext,
  src/MaxText/maxtext_utils.py), the definition behind MaxText's published MFU: per layer the
  QKV projection 2·T·d·(H + 2·Hkv)·hd, the output projection 2·T·d·H·hd, the MLP
  2·T·d·ff·(2 if gated else 1) + 2·T·ff·d, the output layer 2·T·d·V once, all x3 for forward
  and backward (T = tokens); attention 4·T·s·H·hd per layer x3, halved for a causal mask
  (`causal`, as MaxText, Megatron-LM and NeMo count it). With d = H·hd and the weights' 6·N
  per token this is PaLM's 6·N + 12·L·s·d per token (Chowdhery et al. 2022, appendix B) with
  the attention term halved. Embedding lookups, norms, softmax and the optimizer are not
  counted: as podkit's own count on the jaxpr (podkit.train.flops), which with
  `causal=False` is the same number for podkit's GPT (XLA computes the whole s x s score
  matrix; a causal splash kernel skips half and podkit's count then halves it too).
- State: parameters in float32 (`param_bytes` = 4: podkit keeps float32 master weights under
  "mixed_bfloat16" as under "float32"), gradients as the parameters, Adam's two moments
  (`optimizer_bytes_per_param` = 8), split as podkit's rules split them: every dim named
  `embed` over fsdp; heads, MLP units and the vocabulary over model.
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2 with sequence parallelism: per layer s·b·h·(34/t +
  5·a·s/(h·t)) bytes at 16 bits without recomputation (t the tensor-parallel size: podkit's
  TP rules split the residual stream between blocks over `model`, `activation_embed`, so the
  norms' and residual's activations are 1/t a device too), generalised here to any ff and
  grouped-query attention (k and v whole on every model device where `split_kv` is False);
  2·s·b·h/t per layer (the layer's input) with full recomputation, plus one layer's
  activations live while it is recomputed. The formula counts
  dropout masks (1 byte) that podkit's default dropout = 0 does not keep: an upper bound by
  2·s·b·h + a·s²·b per layer. `flash_attention` (the default: splash on TPU, flash on GPU)
  drops the 5·a·s²·b score matrices. Bytes scale with `compute_bytes` / 2. The float32 logits
  (s·b·V/t x 4) are added once.
- Collectives per step and device: data parallelism (data > 1): each layer's gradients are
  all-reduced over data (one op per layer, one for the embeddings and head: XLA's combiner
  may merge them, which changes the latency term, not the bytes). FSDP (fsdp > 1, ZeRO-3):
  per layer an all-gather of its fsdp-split weights in the forward pass (in `gather_bytes`,
  default the compute dtype: compiled ahead of time for a TPU v5e 2x2, XLA moves the cast
  to bfloat16 before the all-gather; XLA:CPU gathers the float32 master weights and casts
  after, so a CPU-compiled Program shows float32 gathers), again in the backward when the
  layer is rematerialized
  (without remat JAX keeps the gathered weight as a residual for the backward: it is
  gathered once and held, which the memory counts), and a reduce-scatter of their gradients;
  parameters with no `embed` dim (attention and MLP-in biases) are all-reduced over the batch
  axes. With data and fsdp both > 1, the scattered gradient shard is all-reduced over data.
  (XLA's partitioner may instead gather a matmul's activations where they are smaller than
  the weight -- seen for a toy MLP on TPU -- which this model does not.)
  Tensor parallelism (model > 1; Megatron, Shoeybi et al. 2019): per layer two all-reduces
  of the (b, s, d) activations in the forward pass and two in the backward (two more when a
  rematerialized layer's forward runs again), one for the vocabulary-parallel embedding
  lookup, one for the output layer's input gradient -- each a reduce-scatter and an
  all-gather, as the residual stream is split over `model` between them (the same bytes
  and ring time as the all-reduce) -- and the three small ones of a
  vocabulary-parallel cross-entropy (max, sum of exponentials, the target's logit).
- Bytes accessed: an estimate for the roofline -- the (gathered) weights read in the forward
  and backward passes (again when recomputed), the gradients written, the optimizer update
  (parameters, gradients and moments read, parameters and moments written), activations
  written once and read once.

ResNet-50 (`resnet50`, He et al. 2016, torchvision's "v1.5": the stride on the 3x3 conv):
parameters and multiply-adds computed from the layer shapes for any image size. At 224 px
that is 25,557,032 parameters and 4.09e9 multiply-adds per image, torchvision's published
figures (ResNet50_Weights, IMAGENET1K_V1 and V2: num_params 25,557,032, "GFLOPS" 4.09 --
torchvision's GFLOPS count multiply-adds; He et al. Table 1 gives 3.8e9 for the original v1,
the stride on the first 1x1), so 8.18e9 FLOPs forward per image at 2 FLOPs per multiply-add
(podkit's convention: its count of its own ResNet-50 is 8,178,368,512), x3 for a train step.
BatchNorm under SPMD normalizes over the global batch (`synchronized_bn`, Keras's
`BatchNormalization(synchronized=True)`; podkit's ResNet under jit): every BN layer
all-reduces its per-channel statistics (2·C float32) in the forward pass and their gradients
(2·C) in the backward, over the batch axes -- 53 layers, small messages whose latency matters
at 2,048 chips, and on the critical path (the next layer needs them). `synchronized_bn=False`
is per-device statistics, no collective (PyTorch's BatchNorm under DDP; Ying et al. 2018's
"distributed batch normalization" over a few replicas is close to it). Gradients are
all-reduced over data as one combined all-reduce (XLA's all-reduce combiner: podkit's
compiled ResNet-50 on 2 devices has one of 101.85 MB, every gradient; SGD with momentum:
`optimizer_bytes_per_param` = 4). Activations: about two tensors of every convolution's
output size are kept for the backward pass (the conv output for BatchNorm, the activation
for the next conv); with remat "full" only each block's input.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from podkit.errors import ConfigError
from podkit.sim.program import (
    BATCH_AXES,
    CollectiveOp,
    Program,
    Shards,
    check_divides,
    check_mesh,
    merge,
)

REMATS = ("none", "minimal", "full")
FLOAT32 = 4
# torchvision's published figures for ResNet-50 v1.5 at 224 px (ResNet50_Weights).
RESNET50_PARAMS = 25_557_032
RESNET50_MACS_224 = 4.09e9


@dataclasses.dataclass(frozen=True)
class _Params:
    """Parameters of one kind: `count` numbers split over `axes` (podkit's rules), in a layer
    (`layer`: one group per layer) or outside (embeddings, head, final norm)."""

    count: int  # in one layer (of `repeat` alike)
    axes: tuple[str, ...]
    layer: bool
    repeat: int = 1  # the layers holding such a group

    @property
    def total(self) -> int:
        return self.count * self.repeat


def _positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r}; give a positive int.")


def _check_remat(remat: str) -> None:
    if remat not in REMATS:
        raise ConfigError(f"remat={remat!r}; the analytic model knows {', '.join(REMATS)} "
                          "(MaxText's 'minimal': the matmul outputs are kept).")


def _share(count: int, axes: tuple[str, ...], mesh: Mapping[str, int],
           but: tuple[str, ...] = ()) -> float:
    """Numbers per device of `count` split over `axes`, except along `but`."""
    return count / math.prod(mesh.get(a, 1) for a in axes if a not in but)


def _shards(groups: list[_Params], bytes_each: float) -> Shards:
    out: dict[tuple[str, ...], int] = {}
    for g in groups:
        out[g.axes] = out.get(g.axes, 0) + int(g.total * bytes_each)
    return tuple(sorted(out.items()))


def _batch_axes(mesh: Mapping[str, int], only: tuple[str, ...] = BATCH_AXES
                ) -> tuple[str, ...]:
    return tuple(a for a in only if mesh.get(a, 1) > 1)


def _combined(ops: list[CollectiveOp]) -> list[CollectiveOp]:
    """The data-parallel gradient all-reduces of a program without a layer loop as one, as
    XLA's all-reduce combiner leaves them (FSDP's per-layer gathers and scatters stay apart:
    each waits for its layer)."""
    reduces = [o for o in ops if o.kind == "all-reduce"]
    if len({(o.axes, o.group_size) for o in reduces}) != 1:
        return ops
    total = sum(o.bytes * o.count for o in reduces)
    arrays = sum(o.operands * o.count for o in reduces)
    return [o for o in ops if o.kind != "all-reduce"] + [
        CollectiveOp("all-reduce", total, reduces[0].group_size, reduces[0].axes, 1,
                     operands=arrays)]


def _gradient_sync(groups: list[_Params], mesh: Mapping[str, int], layers: int,
                   grad_bytes: float, gather_bytes: float, gathers_per_layer: int
                   ) -> list[CollectiveOp]:
    """FSDP's all-gathers and reduce-scatters and the data-parallel all-reduces of one step:
    one op per layer (and one for the parameters outside the layers) for each, an operand
    per parameter group (XLA:CPU runs each operand as its own collective; a group may be
    several of the compiled model's arrays, so on a cpu pod this counts fewer latencies)."""
    f = mesh.get("fsdp", 1)
    ops: list[CollectiveOp] = []
    for in_layer, times in ((True, layers), (False, 1)):
        mine = [g for g in groups if g.layer == in_layer]
        split = [g for g in mine if f > 1 and "fsdp" in g.axes]
        whole = [g for g in mine if g not in split]
        if split:
            gathered = sum(_share(g.count, g.axes, mesh, but=("fsdp",)) for g in split)
            gathers = gathers_per_layer if in_layer else 1
            ops.append(CollectiveOp("all-gather", int(gathered * gather_bytes), f, ("fsdp",),
                                    times * gathers, operands=len(split)))
            ops.append(CollectiveOp("reduce-scatter", int(gathered * grad_bytes), f,
                                    ("fsdp",), times, operands=len(split)))
            if mesh.get("data", 1) > 1:  # the scattered shard, over the replicas
                shard = sum(_share(g.count, g.axes, mesh) for g in split)
                ops.append(CollectiveOp("all-reduce", int(shard * grad_bytes),
                                        mesh["data"], ("data",), times, operands=len(split)))
        axes = _batch_axes(mesh)
        if whole and axes:
            size = sum(_share(g.count, g.axes, mesh) for g in whole)
            ops.append(CollectiveOp("all-reduce", int(size * grad_bytes),
                                    math.prod(mesh[a] for a in axes), axes, times,
                                    operands=len(whole)))
    return ops


def transformer(layers: int, d_model: int, heads: int, ff: int, vocab: int, seq: int,
                global_batch: int, mesh: Mapping[str, int], *, kv_heads: int | None = None,
                head_dim: int | None = None, gated_mlp: bool = False, biases: bool = True,
                learned_positions: bool = True, tied_embeddings: bool = False,
                qkv_bias: bool = False, qk_norm: bool = False, remat: str = "none",
                split_kv: bool | None = None, vocab_multiple: int | None = None,
                causal: bool = True, flash_attention: bool = True,
                compute_bytes: int = 2, param_bytes: int = FLOAT32,
                optimizer_bytes_per_param: int = 2 * FLOAT32,
                gather_bytes: int | None = None) -> Program:
    """A decoder-only transformer's train step on `mesh` (the module docstring: formulas and
    sources). Defaults: podkit's GPT in mixed precision (bfloat16 compute, float32 weights,
    AdamW). The Llama family: `gated_mlp` (SwiGLU), `biases=False` (RMSNorm's scale only),
    `learned_positions=False` (RoPE has no parameters), `kv_heads`, `head_dim`; `qkv_bias` the
    q/k/v biases alone (Qwen2), `qk_norm` an RMSNorm of each head's q and k (Qwen3).
    `split_kv`: the key/value projections split over `model` (the GPT's, whose k/v heads are
    its heads); False keeps them whole on every model device (podkit's Llama: the `kv_heads`
    axis has no built-in rule, so grouped- and multi-query attention need not divide the
    model axis). Default: split when kv_heads == heads. `vocab_multiple`: podkit's padding
    of the vocabulary (None: Megatron's, 128 x the model axis)."""
    _positive(layers=layers, d_model=d_model, heads=heads, ff=ff, vocab=vocab, seq=seq,
              compute_bytes=compute_bytes, param_bytes=param_bytes)
    kv_heads = heads if kv_heads is None else kv_heads
    _positive(kv_heads=kv_heads)
    if heads % kv_heads:
        raise ConfigError(f"heads={heads} is not divisible by kv_heads={kv_heads}: each group "
                          "of query heads shares one key/value head.")
    if head_dim is None:
        if d_model % heads:
            raise ConfigError(f"d_model={d_model} is not divisible by heads={heads}; pass "
                              "head_dim, or pick heads that divide d_model.")
        head_dim = d_model // heads
    _positive(head_dim=head_dim)
    _check_remat(remat)
    mesh = check_mesh(mesh, global_batch)
    split_kv = kv_heads == heads if split_kv is None else split_kv
    dims = {"layers": layers, "d_model": d_model, "heads": heads, "kv_heads": kv_heads,
            "ff": ff, "vocab": vocab, "seq": seq}
    check_divides(dims, mesh, {"model": ("heads", "ff")
                               + (("kv_heads",) if split_kv else ()),
                               "fsdp": ("d_model",)}, "")
    real_vocab, vocab = vocab, padded_vocab(vocab, mesh.get("model", 1), vocab_multiple)
    h, q, kv = d_model, heads * head_dim, kv_heads * head_dim
    gate = 2 if gated_mlp else 1
    norm = 2 * h if biases else h
    fm = ("fsdp", "model")
    groups = [
        _Params(h * q, fm, True),  # q: (embed, heads, kv)
        _Params(h * 2 * kv, fm if split_kv else ("fsdp",), True),  # k, v
        _Params(q * h, fm, True),  # attention output: (heads, kv, embed)
        _Params(h * ff * gate, fm, True),  # MLP in: (embed, mlp)
        _Params(ff * h, fm, True),  # MLP out: (mlp, embed)
        _Params(2 * norm, ("fsdp",), True),  # two norms: (embed,)
        _Params(vocab * h, fm, False),  # token embeddings: (vocab, embed)
        _Params(norm, ("fsdp",), False),  # final norm
    ]
    if biases:
        groups += [_Params(q + 2 * kv, ("model",), True), _Params(ff * gate, ("model",), True),
                   _Params(2 * h, ("fsdp",), True)]  # q/k/v and MLP-in biases; two outputs'
    elif qkv_bias:
        groups.append(_Params(q + 2 * kv, ("model",), True))
    if qk_norm:
        groups.append(_Params(2 * head_dim, (), True))  # replicated: (head_dim,) each
    if learned_positions:
        groups.append(_Params(seq * h, ("fsdp",), False))  # (None, embed)
    if not tied_embeddings:
        groups.append(_Params(h * vocab, fm, False))  # output layer: (embed, vocab)
    groups = [dataclasses.replace(g, repeat=layers) if g.layer else g for g in groups]
    params = sum(g.total for g in groups)

    # FLOPs: MaxText's calculate_tflops_training_per_device.
    tokens = global_batch * seq
    weights = (2 * tokens * h * ff * gate + 2 * tokens * ff * h + 2 * tokens * h * (q + 2 * kv)
               + 2 * tokens * h * q)
    attention = 4 * tokens * seq * q / (2 if causal else 1)
    flops = 3 * (weights * layers + 2 * tokens * h * vocab) + 3 * attention * layers
    devices = math.prod(mesh.values())

    d, f, t = mesh.get("data", 1), mesh.get("fsdp", 1), mesh.get("model", 1)
    b = global_batch / (d * f)
    recompute = remat != "none"
    gather = compute_bytes if gather_bytes is None else gather_bytes
    ops = _gradient_sync(groups, mesh, layers, param_bytes, gather, 2 if recompute else 1)
    if t > 1:  # the residual stream split over model: Megatron's all-reduces as RS + AG
        act = int(b * seq * h * compute_bytes)
        times = layers * (6 if recompute else 4) + 2
        ops += [CollectiveOp("reduce-scatter", act, t, ("model",), times),
                CollectiveOp("all-gather", act, t, ("model",), times),
                CollectiveOp("all-reduce", int(b * seq * FLOAT32), t, ("model",), 3)]

    # Memory per device.
    param_dev = sum(_share(g.total, g.axes, mesh) for g in groups)
    saved = _transformer_activations(b, seq, h, heads, q, kv, ff, gate, t, layers, remat,
                                     flash_attention, compute_bytes, split_kv)
    saved += b * seq * vocab * FLOAT32 / t  # the float32 logits
    layer_gathered = sum(_share(g.count, g.axes, mesh, but=("fsdp",)) for g in groups
                         if g.layer and "fsdp" in g.axes)
    other_gathered = sum(_share(g.count, g.axes, mesh, but=("fsdp",)) for g in groups
                         if not g.layer and "fsdp" in g.axes)
    held = 0.0
    if f > 1:  # gathered weights: all of them held for the backward without remat
        held = (layer_gathered * (2 if recompute else layers) + other_gathered) * gather
    grads = param_dev * param_bytes
    temps = int(saved + held + grads)
    optimizer = param_dev * optimizer_bytes_per_param
    read = (layer_gathered if f > 1 else sum(_share(g.count, g.axes, mesh) for g in groups
                                             if g.layer)) * compute_bytes
    traffic = (read * layers * (3 if recompute else 2) + 2 * param_dev * compute_bytes
               + grads + param_dev * (3 * param_bytes + 2 * optimizer_bytes_per_param)
               + 2 * saved)
    notes = ("FLOPs: MaxText's calculate_tflops_training_per_device"
             + (" (causal attention counted half)" if causal else ""),
             *((f"vocabulary {real_vocab:,} padded to {vocab:,} (a multiple of "
                f"{vocab_multiple or f'128 x the model axis {t}'}): {vocab - real_vocab:,} "
                "rows that no token uses",) if vocab != real_vocab else ()),
             "activations: Korthikanti et al. 2022 Table 2"
             + (" without the s^2 score matrices (flash attention)" if flash_attention else ""),
             "bytes accessed: an estimate (weights, gradients, optimizer update, activations)")
    return Program(
        mesh=mesh, global_batch=global_batch, flops=flops / devices, xla_flops=None,
        bytes_accessed=traffic, collectives=merge(ops), params=params,
        param_bytes=int(param_dev * param_bytes),
        optimizer_bytes=int(optimizer), activation_bytes=temps,
        memory_per_device_bytes=int(param_dev * param_bytes + optimizer + temps),
        tokens_per_sample=seq, model_kind="transformer",
        param_shards=_shards(groups, param_bytes),
        optimizer_shards=_shards(groups, optimizer_bytes_per_param),
        dims=dims, source="analytic", notes=notes,
        recompute_flops=(weights + attention) * layers / devices if remat == "full" else 0.0)


VOCAB_MULTIPLE = 128


def padded_vocab(vocab: int, model: int = 1, multiple: int | None = None) -> int:
    """The vocabulary as a model pads it. `multiple` given (podkit's `model.vocab_multiple`):
    up to a multiple of it, which the model axis must divide, as podkit's models require.
    None: Megatron-LM's rule, a multiple of 128 (the MXU's tile) x the model axis
    (`make_vocab_size_divisible_by` x its tensor-parallel size), unchanged when the vocabulary
    already is a multiple of both."""
    if multiple is not None:
        rows = -(-vocab // multiple) * multiple
        if rows % model:
            raise ConfigError(f"the vocabulary of {vocab:,} padded to a multiple of "
                              f"vocab_multiple = {multiple} does not split over model = "
                              f"{model}; use vocab_multiple = {math.lcm(multiple, model)}.")
        return rows
    step = VOCAB_MULTIPLE * model
    return vocab if vocab % model == 0 and vocab % VOCAB_MULTIPLE == 0 else -(-vocab // step) * step


def _transformer_activations(b: float, s: int, h: int, heads: int, q: int, kv: int, ff: int,
                             gate: int, t: int, layers: int, remat: str, flash: bool,
                             compute_bytes: int, split_kv: bool = True) -> float:
    """Bytes per device kept for the backward pass (Korthikanti et al. 2022, Table 2 with
    sequence parallelism, generalised: the 16-bit formula's terms, scaled by compute_bytes /
    2). The residual stream is split over the model axis (podkit's `activation_embed` rule,
    as Megatron's sequence parallelism splits it): the norms' and residual's tensors are 1/t
    a device too, not only the heads' and MLP's; k and v 1/t only where they are split."""
    kv_t = t if split_kv else 1
    whole = 10 * s * b * h / t  # two norms' inputs, attention and MLP inputs, dropout masks
    split = s * b * (2 * q / t + 4 * kv / kv_t + 2 * q / t + (2 * ff * gate + 2 * ff) / t)
    scores = 0.0 if flash else 5 * heads * s * s * b / t
    layer = (whole + split + scores) * compute_bytes / 2
    if remat == "none":
        return layers * layer
    if remat == "full":  # each layer's input, split over model; one layer live again
        return layers * 2 * s * b * h / t * compute_bytes / 2 + layer
    # "minimal": the projections' outputs kept (q, k, v; attention output; MLP in and out).
    kept = s * b * (2 * q / t + 4 * kv / kv_t + 2 * h / t + 2 * ff * gate / t + 2 * h / t)
    return layers * kept * compute_bytes / 2 + layer


# -- ResNet-50 ---------------------------------------------------------------------------------
def _out(size: int, kernel: int, stride: int) -> int:
    """A conv's (or max-pool's) output size with torch's symmetric padding (kernel - 1) // 2."""
    return (size + 2 * ((kernel - 1) // 2) - kernel) // stride + 1


@dataclasses.dataclass(frozen=True)
class _Conv:
    cin: int
    cout: int
    kernel: int
    out: int  # output height (= width)
    block: bool  # the first conv of a residual block (its input is kept under remat)


def _resnet50_convs(image_size: int) -> list[_Conv]:
    """ResNet-50 v1.5's convolutions in order (each followed by BatchNorm)."""
    size = _out(image_size, 7, 2)
    convs = [_Conv(3, 64, 7, size, True)]
    size, cin = _out(size, 3, 2), 64  # 3x3 max-pool, stride 2
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = 64 * 2 ** stage
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            out = _out(size, 3, stride)
            convs += [_Conv(cin, width, 1, size, True), _Conv(width, width, 3, out, False),
                      _Conv(width, 4 * width, 1, out, False)]
            if i == 0:  # projection shortcut
                convs.append(_Conv(cin, 4 * width, 1, out, False))
            size, cin = out, 4 * width
    return convs


def resnet50(global_batch: int, mesh: Mapping[str, int], image_size: int = 224, *,
             classes: int = 1000, remat: str = "none", compute_bytes: int = 2,
             param_bytes: int = FLOAT32, optimizer_bytes_per_param: int = FLOAT32,
             synchronized_bn: bool = True) -> Program:
    """ResNet-50's train step on a data (and fsdp) mesh (the module docstring: formulas and
    sources). Defaults: bfloat16 compute, float32 weights, SGD with momentum."""
    _positive(global_batch=global_batch, image_size=image_size, classes=classes,
              compute_bytes=compute_bytes, param_bytes=param_bytes)
    if image_size < 32:
        raise ConfigError(f"image_size={image_size}; ResNet-50's ImageNet stem needs at least "
                          "32 px (it downsamples 32x).")
    if remat not in ("none", "full"):
        raise ConfigError(f"remat={remat!r}; the ResNet-50 model knows 'none' and 'full'.")
    mesh = check_mesh(mesh, global_batch)
    if mesh.get("model", 1) > 1:
        raise ConfigError(f"mesh={mesh}: the analytic ResNet-50 models data and fsdp only. "
                          "For tensor parallelism compile it: podkit.sim.extract() of a "
                          "ResNet config, then scale().")
    check_divides({"width": 64}, mesh, {"fsdp": ("width",)}, "ResNet-50 ")
    convs = _resnet50_convs(image_size)
    macs = sum(c.out ** 2 * c.kernel ** 2 * c.cin * c.cout for c in convs) + 2048 * classes
    # Conv kernels (kh, kw, in, out): `in` is `embed` (split by fsdp) except the stem's 3
    # channels; BatchNorm's scale and bias follow the output channels (not split by fsdp).
    layers = [[_Params(c.kernel ** 2 * c.cin * c.cout, ("fsdp",) if i else (), True),
               _Params(2 * c.cout, (), True)] for i, c in enumerate(convs)]
    head = [_Params(2048 * classes, ("fsdp",), False), _Params(classes, (), False)]
    groups = [g for layer in layers for g in layer] + head
    params = sum(g.count for g in groups)

    devices = math.prod(mesh.values())
    b = global_batch / math.prod(mesh.get(a, 1) for a in BATCH_AXES)
    ops = []
    for layer in layers:  # one gradient op per layer (conv + BN)
        ops += _gradient_sync(layer, mesh, 1, param_bytes, compute_bytes,
                              2 if remat == "full" else 1)
    ops += _gradient_sync(head, mesh, 0, param_bytes, compute_bytes, 1)
    ops = _combined(ops)
    axes = _batch_axes(mesh)
    if axes and synchronized_bn:
        group = math.prod(mesh[a] for a in axes)
        ops += [CollectiveOp("all-reduce", 2 * c.cout * FLOAT32, group, axes, 2, critical=True)
                for c in convs]

    elements = [c.out ** 2 * c.cout for c in convs]  # per image
    if remat == "full":
        kept = sum(e for e, c in zip(elements, convs, strict=True) if c.block) + max(elements)
    else:
        kept = 2 * sum(elements)
    saved = b * kept * compute_bytes
    param_dev = sum(_share(g.total, g.axes, mesh) for g in groups)
    grads = param_dev * param_bytes
    optimizer = param_dev * optimizer_bytes_per_param
    temps = int(saved + grads + (param_dev * compute_bytes if mesh.get("fsdp", 1) > 1 else 0))
    traffic = (param_dev * compute_bytes * (3 if remat == "full" else 2) + grads
               + param_dev * (3 * param_bytes + 2 * optimizer_bytes_per_param) + 2 * saved)
    conv_macs = macs - 2048 * classes  # all but the classifier's matmul
    return Program(
        mesh=mesh, global_batch=global_batch, flops=3 * 2 * macs * global_batch / devices,
        conv_flops=3 * 2 * conv_macs * global_batch / devices,
        recompute_flops=2 * macs * global_batch / devices if remat == "full" else 0.0,
        xla_flops=None, bytes_accessed=traffic, collectives=merge(ops), params=params,
        param_bytes=int(param_dev * param_bytes), optimizer_bytes=int(optimizer),
        activation_bytes=temps,
        memory_per_device_bytes=int(param_dev * param_bytes + optimizer + temps),
        tokens_per_sample=None, model_kind="resnet",
        param_shards=_shards(groups, param_bytes),
        optimizer_shards=_shards(groups, optimizer_bytes_per_param),
        dims={"depth": 50, "width": 64, "image_size": image_size, "classes": classes},
        source="analytic",
        notes=("FLOPs: 2 x multiply-adds of the layer shapes, x3 for a train step",
               "BatchNorm statistics all-reduced over the batch axes in both passes"))
