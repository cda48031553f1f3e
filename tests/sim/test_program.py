"""The program model (podkit.sim.program): the collectives XLA inserts for DP, FSDP and TP in
podkit's own GPT compiled on the test process's CPU devices, read with the byte convention;
scaling to a target mesh; bad input named before XLA is involved."""

import functools
import math
import string
from pathlib import Path

import pytest

from podkit.errors import ConfigError
from podkit.sim import program as P

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "gpt_small.toml"
SEED = CONFIG.with_name("seed_mlp.toml")
# configs/gpt_small.toml's GPT, shrunk to the least that still shows every collective: two
# unrolled layers (the per-layer ops appear twice), whole logits, 8 sequences of 16 tokens.
LAYERS, D, HEADS, FF, VOCAB, SEQ, BATCH = 2, 32, 4, 64, 256, 16, 8
TINY = [f"model.layers={LAYERS}", f"model.embed={D}", f"model.heads={HEADS}",
        f"model.mlp={FF}", f"data.vocab_size={VOCAB}", f"data.seq_len={SEQ}",
        f"data.batch_size={BATCH}", "model.scan_layers=false", "model.vocab_chunk=0"]
MESHES = {"dp": {"data": 4}, "fsdp": {"fsdp": 4}, "tp": {"data": 2, "model": 2}}
F32 = 4


@functools.cache
def compiled(name: str) -> P.Program:
    """The tiny GPT's Program on one of MESHES, compiled once per test process (shared with
    test_analytic.py)."""
    return P.extract(CONFIG, MESHES[name], overrides=TINY)


def big(program: P.Program, kind: str, axes: tuple[str, ...] | None = None
        ) -> list[P.CollectiveOp]:
    """The ops of a kind (over `axes`) that move more than scalars."""
    return [c for c in program.collectives
            if c.kind == kind and c.bytes > 64 and (axes is None or c.axes == axes)]


# -- reading HLO ------------------------------------------------------------------------------
HLO = string.Template("""HloModule m, entry_computation_layout={()->f32[]}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %ag = f32[32,16]{1,0} all-gather(%x), channel_id=1, $iota, dimensions={0}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%i, %x)
}

%cond (p: (s32[], f32[8,16])) -> pred[] {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (w: f32[64,16], g: f32[64,16], s: f32[]) -> f32[] {
  %w = f32[64,16]{1,0} parameter(0)
  %g = f32[64,16]{1,0} parameter(1)
  %s = f32[] parameter(2)
  %pid = u32[] partition-id()
  %ar = $tuple all-reduce(%g, %s, %w), channel_id=2, $fsdp, to_apply=%add
  %g0 = f32[64,16]{1,0} get-tuple-element(%ar), index=0
  %g1 = f32[] get-tuple-element(%ar), index=1
  %g2 = f32[64,16]{1,0} get-tuple-element(%ar), index=2
  %cv = bf16[64,16]{1,0} convert(%g0)
  %slice = bf16[16,16]{1,0} fusion(%cv, %pid), kind=kLoop, calls=%add
  %norm = f32[] fusion(%g0, %pid), kind=kLoop, calls=%add
  %full = f32[64,16]{1,0} add(%g2, %w)
  %rs = f32[16,16]{1,0} reduce-scatter(%w), channel_id=3, $fsdp, dimensions={0}, to_apply=%add
  %agst = (f32[16,16]{1,0}, f32[64,16]{1,0}) all-gather-start(%rs), $data, dimensions={0}
  %agd = f32[64,16]{1,0} all-gather-done(%agst)
  %init = (s32[], f32[8,16]{1,0}) tuple(%s, %rs)
  %loop = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body, $trips
  ROOT %out = f32[] add(%g1, %s)
}
""").substitute(
    tuple="(f32[64,16]{1,0}, f32[], /*index=2*/f32[64,16]{1,0})",  # as XLA prints a tuple
    iota="replica_groups=[2,4]<=[8]",  # the same groups as $fsdp, in XLA's iota form
    fsdp="replica_groups={{0,1,2,3},{4,5,6,7}}",
    data="replica_groups={{0,4},{1,5},{2,6},{3,7}}",
    trips='backend_config={"known_trip_count":{"n":"3"}}')


def test_hlo_collectives_by_the_byte_convention_with_tuples_loops_and_slices():
    ops = P.collectives_from_hlo(HLO, {"data": 2, "fsdp": 4})
    assert set(ops) == {
        # the tuple's slot 2 is used whole, its scalar too: an all-reduce of both
        P.CollectiveOp("all-reduce", 64 * 16 * F32 + F32, 4, ("fsdp",), 1, operands=2),
        # slot 0 is only read as this device's quarter (through a convert) or reduced by
        # device id: a reduce-scatter of the whole array; and a real one, input bytes = x4
        P.CollectiveOp("reduce-scatter", 64 * 16 * F32, 4, ("fsdp",), 2),
        # an async all-gather counts its output; a loop body's op its trip count times
        P.CollectiveOp("all-gather", 64 * 16 * F32, 2, ("data",), 1),
        P.CollectiveOp("all-gather", 32 * 16 * F32, 4, ("fsdp",), 3),
    }


# -- extraction: the collectives XLA inserted -------------------------------------------------
def test_dp_all_reduces_every_gradient_over_data():
    p = compiled("dp")
    assert {c.kind for c in p.collectives} == {"all-reduce"}
    assert all(c.axes == ("data",) and c.group_size == 4 for c in p.collectives)
    grads = big(p, "all-reduce")
    assert 1 <= sum(c.count for c in grads) <= LAYERS + 1  # XLA:CPU combines them into one
    # ... of many arrays, which XLA:CPU then runs one at a time (podkit.sim.cpu)
    assert sum(c.count * c.operands for c in grads) > sum(c.count for c in grads)
    param_bytes = p.params * F32
    assert p.param_bytes == param_bytes  # replicated
    assert sum(c.total_bytes for c in grads) == pytest.approx(param_bytes, rel=1e-3)


def test_fsdp_gathers_weights_and_scatters_gradients_over_fsdp():
    p = compiled("fsdp")
    assert {c.kind for c in p.collectives} == {"all-gather", "reduce-scatter", "all-reduce"}
    assert all(c.axes == ("fsdp",) and c.group_size == 4 for c in p.collectives)
    split = dict(p.param_shards)[("fsdp",)]  # every parameter with an `embed` dim
    assert split / (p.params * F32) > 0.99
    assert p.param_bytes == pytest.approx(split / 4 + (p.params * F32 - split), rel=1e-6)
    # Each weight gathered once (without remat it stays alive for the backward pass).
    gathered = sum(c.total_bytes for c in big(p, "all-gather"))
    assert gathered == pytest.approx(split, rel=0.01)
    qkv = 3 * D * D * F32
    assert [c.count for c in p.collectives if c.bytes == qkv] == [LAYERS, LAYERS]  # AG, RS
    # Gradients: scattered, except the token table (gathered whole for its lookup, its
    # gradient is read whole by the global-norm clipping) and the biases without `embed`.
    scattered = sum(c.total_bytes for c in p.collectives if c.kind == "reduce-scatter")
    reduced = sum(c.total_bytes for c in big(p, "all-reduce"))
    assert scattered + reduced == pytest.approx(p.params * F32, rel=0.01)
    assert reduced == pytest.approx(VOCAB * D * F32 + LAYERS * (3 * D + FF) * F32, rel=0.02)


def test_tp_splits_activations_over_model_and_reduces_gradients_over_data():
    p = compiled("tp")
    activation = BATCH // 2 * SEQ * D * F32  # (b, s, d) on each model device
    # Megatron's all-reduce after each row-parallel matmul, as a reduce-scatter (the residual
    # stream is split over model between blocks) and an all-gather before the next block: 2
    # per layer forward, 2 backward; the vocabulary-parallel lookup; the head's input grad.
    scattered = [c for c in p.collectives if c.kind == "reduce-scatter"
                 and c.axes == ("model",) and c.bytes == activation]
    assert sum(c.count for c in scattered) == 4 * LAYERS + 1
    gathered = [c for c in p.collectives if c.kind == "all-gather"
                and c.axes == ("model",) and c.bytes == activation]
    assert sum(c.count for c in gathered) == 4 * LAYERS + 4
    grads = big(p, "all-reduce", ("data",))
    # the norms' gradients (d wide, from model-split activations): in part over data x model
    assert sum(c.total_bytes for c in grads) == pytest.approx(p.param_bytes, rel=0.03)
    assert p.param_bytes < p.params * F32 * 0.6  # most weights split over model


def test_the_program_says_what_a_device_does_per_step():
    p = compiled("dp")
    assert p.mesh == {"data": 4} and p.devices == 4 and p.global_batch == BATCH
    assert p.tokens_per_sample == SEQ and p.tokens_per_step == BATCH * SEQ
    assert p.model_kind == "transformer" and p.source == "compiled"
    assert p.dims == {"layers": LAYERS, "heads": HEADS, "d_model": D, "ff": FF,
                      "vocab": VOCAB, "seq": SEQ}
    assert p.params == LAYERS * (4 * D * D + 2 * D * FF + 9 * D + FF) + 2 * VOCAB * D \
        + SEQ * D + 2 * D
    assert p.optimizer_bytes >= 2 * p.param_bytes  # AdamW's two moments, and its counters
    assert p.xla_flops > p.flops > 0 and p.bytes_accessed > 0
    assert p.memory_per_device_bytes > p.param_bytes + p.optimizer_bytes
    assert p.activation_bytes > 0
    for name in MESHES:  # the same step, split over 4 devices each time
        assert compiled(name).flops == p.flops
    assert P.Program.from_json(p.to_json()) == p


# -- scaling --------------------------------------------------------------------------------------
def test_scaling_data_parallelism_keeps_gradient_bytes_and_per_device_work():
    p = compiled("dp")
    s = P.scale(p, {"data": 1024})
    assert s.global_batch == BATCH // 4 * 1024 and s.flops == pytest.approx(p.flops)
    assert [(c.kind, c.bytes, c.group_size, c.count) for c in s.collectives] == \
        [(c.kind, c.bytes, 1024, c.count) for c in p.collectives]
    assert s.param_bytes == p.param_bytes and s.activation_bytes == p.activation_bytes
    assert s.source.startswith("scaled from compiled")
    half = P.scale(p, {"data": 1024}, global_batch=BATCH // 4 * 512)
    assert half.flops == pytest.approx(p.flops / 2)
    assert half.activation_bytes == pytest.approx(p.activation_bytes / 2, rel=1e-6)


def test_scaling_fsdp_keeps_gathered_weights_whole_and_shards_the_state():
    p = compiled("fsdp")
    s = P.scale(p, {"fsdp": 32})
    gathered = lambda prog: sum(c.total_bytes for c in prog.collectives
                                if c.kind == "all-gather")
    assert gathered(s) == pytest.approx(gathered(p), rel=1e-3)
    assert {c.group_size for c in s.collectives} == {32}
    split = dict(p.param_shards)[("fsdp",)]
    assert s.param_bytes == pytest.approx(split / 32 + p.params * F32 - split, rel=1e-3)
    assert s.optimizer_bytes == P.per_device(p.optimizer_shards, {"fsdp": 32})
    assert s.optimizer_bytes < p.optimizer_bytes / 4


def test_scaling_tensor_parallelism_sizes_activations_by_the_batch_per_device():
    p = compiled("tp")
    s = P.scale(p, {"data": 8, "model": 2}, global_batch=BATCH * 2)  # half the batch each
    activation = BATCH // 2 * SEQ * D * F32
    assert [c.bytes for c in s.collectives if c.axes == ("model",) and c.count == 9] == \
        [activation // 2]
    grads = [c for c in s.collectives if c.axes == ("data",) and c.bytes > 64
             and c.kind == "all-reduce"]
    assert sum(c.total_bytes for c in grads) == pytest.approx(p.param_bytes, rel=0.03)
    assert {c.group_size for c in grads} == {8}


def test_scaling_cannot_create_an_axis_the_compiled_program_lacks():
    with pytest.raises(ConfigError, match=r"splits fsdp.*Compile a mesh with fsdp = 2"):
        P.scale(compiled("dp"), {"data": 64, "fsdp": 8})
    with pytest.raises(ConfigError, match="heads = 4 is not divisible by the mesh's model = 8"):
        P.scale(compiled("tp"), {"data": 2, "model": 8})
    with pytest.raises(ConfigError, match="global_batch=100 is not divisible by data x fsdp"):
        P.scale(compiled("dp"), {"data": 64}, global_batch=100)


# -- bad input, named before XLA is involved ------------------------------------------------------
@pytest.mark.parametrize(("mesh", "overrides", "match"), [
    ({"data": 2, "pipeline": 2}, [], "unknown mesh axis 'pipeline'.*valid axes: dcn, data, fsdp"),
    ({"data": 0}, [], "mesh axis 'data' has size 0"),
    ({"data": -1}, [], "no -1"),
    ({"data": 2, "model": 8}, [], "heads = 4 is not divisible by the mesh's model = 8"),
    ({"fsdp": 8}, ["model.embed=36", "model.heads=4"], "d_model = 36 is not divisible"),
    ({"data": 3}, [], "global_batch=8 is not divisible by data x fsdp = 3"),
    ({"data": 128}, ["data.batch_size=128"], "128 devices.*scale\\(\\) it"),
])
def test_bad_meshes_are_named_with_the_fix(mesh, overrides, match):
    with pytest.raises(ConfigError, match=match):
        P.extract(CONFIG, mesh, overrides=[*TINY, *overrides])


def test_a_mesh_larger_than_the_devices_needs_them_or_a_subprocess():
    with pytest.raises(ConfigError, match=r"needs 16 CPU devices and this process has 8.*"
                                          r"pk.connect\(cpu_devices=16\)"):
        P.extract(CONFIG, {"data": 16}, overrides=TINY, global_batch=16,
                  allow_subprocess=False)


def test_a_mesh_beyond_this_process_compiles_in_a_child_process():
    p = P.extract(SEED, {"data": 16}, global_batch=64)  # 8 devices here: 16 in a child
    assert p.mesh == {"data": 16} and p.global_batch == 64
    assert p.model_kind == "other" and p.tokens_per_sample is None
    grads = big(p, "all-reduce")
    assert [(c.axes, c.group_size) for c in grads] == [(("data",), 16)]
    assert sum(c.total_bytes for c in grads) == pytest.approx(p.params * F32, rel=1e-3)


def test_mesh_text_parses():
    assert P.parse_mesh("data=2, fsdp=4") == {"data": 2, "fsdp": 4}
    with pytest.raises(ConfigError, match="axis=size pairs"):
        P.parse_mesh("data:2")
    assert P.per_device(((("fsdp",), 800), ((), 40)), {"fsdp": 8, "data": 2}) == 140
    assert math.prod(P.check_mesh({"model": 2, "data": 4}).values()) == 8
    assert list(P.check_mesh({"model": 2, "data": 4})) == ["data", "model"]
