"""Strategies on 8 virtual devices: the same losses as one device, the layouts they promise
(golden files), the memory they save, and an error for every bad layout."""

import dataclasses
import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest

import podkit as pk
from podkit.config import DLRMConfig, GPTConfig, ResNetConfig
from podkit.strategy import FSDP, TensorParallel

GOLDEN = Path(__file__).with_name("golden")
TINY_GPT = GPTConfig(layers=2, heads=4, embed=32, mlp=64, sample_tokens=0)
VOCAB, SEQ = 64, 16


def one_device():
    return pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1])


STRATEGIES = {
    "dp": lambda: pk.DataParallel(),
    "fsdp": lambda: FSDP(),
    "tp": lambda: TensorParallel(model=2),
    "custom": lambda: pk.Strategy(
        mesh={"data": 2, "fsdp": 2, "model": 2},
        rules=[("embed", "fsdp"), ("mlp", "model"), ("heads", "model"), ("vocab", "model")]),
}
# A user's rules must each match the model (the GPT's heads and vocab rules would be refused
# for the others): the 3-axis layout of the models without attention.
CUSTOM_NO_ATTENTION = lambda: pk.Strategy(
    mesh={"data": 2, "fsdp": 2, "model": 2}, rules=[("embed", "fsdp"), ("mlp", "model")])


def tokens(rows=16, seed=0):
    rng = np.random.default_rng(seed)
    x = ((np.arange(SEQ)[None] * 5 + rng.integers(0, VOCAB, (rows, 1))) % VOCAB).astype(np.int32)
    return x, ((x + 5) % VOCAB).astype(np.int32)


def gpt(strategy, config=TINY_GPT, **compile_kwargs):
    from podkit.models.gpt import build_gpt

    with strategy.scope():
        model = build_gpt(config, {"vocab_size": VOCAB, "seq_len": SEQ}, seed=3)
        model.compile(optimizer="adam",
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      **compile_kwargs)
    return model


def step_losses(model, steps=4):
    """The loss of each of the first optimizer steps (one step per epoch, same batch)."""
    x, y = tokens()
    history = model.fit(x, y, batch_size=16, epochs=steps, verbose=0, shuffle=False)
    return np.array(history.history["loss"])


@pytest.fixture(scope="module")
def reference_losses():
    return step_losses(gpt(one_device()))


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategy_losses_match_one_device(name, reference_losses):
    model = gpt(STRATEGIES[name]())
    assert len(model.strategy.mesh.devices.flat) == 8
    losses = step_losses(model)
    assert losses[-1] < losses[0]  # it learns
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-4)


def test_microbatches_match_the_whole_batch(reference_losses):
    losses = step_losses(gpt(FSDP(), microbatches=2))
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-4)


def test_remat_and_mixed_precision_train():
    remat = step_losses(gpt(FSDP(), dataclasses.replace(TINY_GPT, remat="dots_saveable")))
    plain = step_losses(gpt(FSDP()))
    np.testing.assert_allclose(remat, plain, rtol=1e-5)
    mixed = gpt(FSDP(), dataclasses.replace(TINY_GPT, precision="mixed_bfloat16"))
    losses = step_losses(mixed)
    np.testing.assert_allclose(losses, plain, rtol=0.05)  # bf16 compute: close, not equal
    assert {r["dtype"] for r in mixed.sharding_table() if r["kind"] == "param"} == {"float32"}


# -- layouts --------------------------------------------------------------------------------
def build_layout_only(model, x):
    """`model` built for inputs like `x`, its state left abstract (the layout's
    ShapeDtypeStructs): sharding_table() reads the layout alone, so neither the initializer
    nor a step is compiled (the zoo's initializers took ~30 s of CPU on build()'s threads)."""
    sample = {k: v[:1] for k, v in x.items()} if isinstance(x, dict) else x[:1]
    model.build_for(model._arch.input_spec(sample), initial_state=lambda layout: layout.abstract)
    return model


def zoo():
    """(name, builder(strategy) -> built model) for each model family."""
    from podkit.models import build_model

    def build(config, info, x):
        def make(strategy):
            with strategy.scope():
                model = build_model(config, info, seed=0)
                model.compile(optimizer="adam", loss="mse")
            return build_layout_only(model, x)
        return make

    dlrm_x = {"dense": np.zeros((8, 13), np.float32), "sparse": np.zeros((8, 26), np.int32)}
    gpt_info = {"vocab_size": VOCAB, "seq_len": SEQ}
    return {
        # The unrolled blocks (blocks/0/..., blocks/1/...): the layout before scan_layers,
        # still what scan_layers = false gives. "gpt_scan": the default, blocks stacked on
        # an unsplit leading `layers` dim (blocks/attn/qkv of shape (2, 3, 32, 4, 8)).
        "gpt": build(dataclasses.replace(TINY_GPT, scan_layers=False), gpt_info, tokens(8)[0]),
        "gpt_scan": build(TINY_GPT, gpt_info, tokens(8)[0]),
        "mlp": build(pk.config.ModelConfig(hidden=[64], outputs=16), {"classes": 10},
                     np.zeros((8, 64), np.float32)),
        "resnet": build(ResNetConfig(depth=18, width=8), {"classes": 10,
                        "image_shape": (8, 8, 1), "input_shape": (64,)},
                        np.zeros((8, 64), np.float32)),
        "dlrm": build(DLRMConfig(embed_dim=8, bottom=[16, 8], top=[16, 8]),
                      {"dense_features": 13, "table_sizes": [64] * 26},
                      dlrm_x),
    }


def _golden_rows(table):
    return [{k: r[k] for k in ("path", "shape", "dtype", "spec", "kind")} for r in table]


@pytest.mark.parametrize("model_name", ["gpt", "gpt_scan", "mlp", "resnet", "dlrm"])
def test_shardings_match_golden_files(model_name):
    """The layout of each model under each strategy, as committed. A change of layout must be
    deliberate: regenerate with PODKIT_UPDATE_GOLDEN=1 and review the diff."""
    make = zoo()[model_name]
    strategies = dict(STRATEGIES)
    if not model_name.startswith("gpt"):
        strategies["custom"] = CUSTOM_NO_ATTENTION
    got = {name: _golden_rows(make(strategy()).sharding_table())
           for name, strategy in strategies.items()}
    path = GOLDEN / f"shardings_{model_name}.json"
    if os.environ.get("PODKIT_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(path.read_text())


def total_bytes(model, kinds=("param", "opt_state"), where=lambda row: True):
    return sum(r["bytes_per_device"] for r in model.sharding_table()
               if r["kind"] in kinds and where(r))


def test_fsdp_bytes_per_device_are_one_nth_of_data_parallel():
    dp, fsdp = gpt(pk.DataParallel()), gpt(FSDP())
    for model in (dp, fsdp):
        build_layout_only(model, tokens(8)[0])
    full, sharded = total_bytes(dp), total_bytes(fsdp)
    # What FSDP cannot split: the few leaves with no `embed` dim (attention and MLP biases,
    # Adam's counters): well under 8 KB for this model.
    assert sharded <= full / 8 + 8192, (sharded, full)
    assert full > 8 * 8192  # the bound means something


def test_tensor_parallel_shrinks_the_sharded_layers_by_the_model_axis():
    dp, tp = gpt(pk.DataParallel()), gpt(TensorParallel(model=2))
    for model in (dp, tp):
        build_layout_only(model, tokens(8)[0])
    by_path = {r["path"]: r for r in dp.sharding_table()}
    split = 0
    for row in tp.sharding_table():
        if "model" in json.dumps(row["spec"]):
            split += 1
            assert row["bytes_per_device"] * 2 == by_path[row["path"]]["bytes_per_device"]
        else:
            assert row["bytes_per_device"] == by_path[row["path"]]["bytes_per_device"]
    assert split >= 6 * 3  # qkv, out, up, down per block, embeddings, head: params + moments


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_sharded_embedding_bytes_scale_as_one_over_n(devices):
    rows, dim = 4096, 16
    strategy = pk.Strategy(mesh={"data": devices}, devices=jax.devices()[:devices])
    with strategy.scope():
        model = pk.Sequential([pk.layers.Embedding(rows, dim, sharded=True),
                               pk.layers.Flatten(), pk.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        model.build((4,))
    table = total_bytes(model, where=lambda r: r["shape"] == [rows, dim])
    assert table == 3 * rows * dim * 4 // devices  # the table, Adam's mu and nu


# -- bad layouts -----------------------------------------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: pk.Strategy(mesh={"data": 3}), "asks for 3 devices but the cluster has 8"),
    (lambda: pk.Strategy(mesh={"data": -1, "model": 3}), "multiply to 3, which does not divide"),
    (lambda: pk.Strategy(mesh={"data": -1, "fsdp": -1}), "more than one -1"),
    (lambda: pk.Strategy(mesh={"tensor": 8}), "unknown strategy axis 'tensor'"),
    (lambda: pk.Strategy(mesh={"data": 0}), "positive int or -1"),
    (lambda: pk.Strategy(mesh={"data": -1}, rules=[("embed", "model")]),
     "names mesh axis 'model', which mesh"),
    (lambda: pk.Strategy(mesh={"data": -1}, rules=[("embed", "tensor")]),
     "names mesh axis 'tensor'; valid axes"),
    (lambda: pk.Strategy(mesh={"data": -1}, rules=["embed"]), "is not \\(logical_axis"),
    (lambda: TensorParallel(model=0), "TensorParallel\\(model=0\\)"),
    (lambda: FSDP(data=3), "does not divide the 8 devices"),
])
def test_bad_meshes_and_rules_raise(make, match):
    with pytest.raises(pk.ConfigError, match=match):
        make().mesh  # noqa: B018 - building the mesh validates it


def test_a_rule_that_matches_nothing_raises():
    strategy = pk.Strategy(mesh={"fsdp": -1}, rules=[("embd", "fsdp")])
    with pytest.raises(pk.ConfigError, match=r"\('embd', \['fsdp'\]\) matches no parameter"):
        gpt(strategy).predict(tokens(8)[0], verbose=0)


def test_an_indivisible_dim_raises_naming_the_numbers():
    import dataclasses

    odd = dataclasses.replace(TINY_GPT, mlp=66)
    with pytest.raises(pk.ConfigError, match=r"of size 66 is split over mesh axis 'model' \(4\)"
                       r" = 4 parts, and 66 is not divisible by 4"):
        gpt(TensorParallel(model=4), odd).predict(tokens(8)[0], verbose=0)


def test_microbatches_must_divide_the_batch():
    model = gpt(pk.DataParallel(), microbatches=3)
    with pytest.raises(pk.ConfigError, match="microbatches=3 parts .* divisible by 24"):
        step_losses(model, steps=1)


# -- several processes -----------------------------------------------------------------------
def run_sharded_job(tmp_path, processes, devices, kind):
    import subprocess
    import sys

    from helpers import free_port

    out = tmp_path / f"{kind}_{processes}x{devices}.json"
    port, procs = free_port(), []
    for pid in range(processes):
        env = {**os.environ, "PODKIT_CPU_DEVICES": str(devices),
               "PYTHONPATH": str(Path(__file__).parent)}
        if processes > 1:
            env.update(PODKIT_COORDINATOR=f"127.0.0.1:{port}",
                       PODKIT_NUM_PROCESSES=str(processes), PODKIT_PROCESS_ID=str(pid))
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("sharding_worker.py")), str(out),
             kind], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("kind", ["custom"])
def test_two_processes_of_four_devices_match_one_of_eight(tmp_path, kind):
    multi = run_sharded_job(tmp_path, 2, 4, kind)
    single = run_sharded_job(tmp_path, 1, 8, kind)
    assert (multi["processes"], multi["devices"]) == (2, 8)
    assert (single["processes"], single["devices"]) == (1, 8)
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(multi["weights_sum"], single["weights_sum"], rtol=1e-5)


def test_a_checkpoint_saved_under_fsdp_restores_under_tensor_parallel_and_one_device(tmp_path):
    x, y = tokens()
    saved = gpt(FSDP())
    first = saved.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False,
                      checkpoint=str(tmp_path / "ckpt")).history["loss"]
    expected = saved.get_weights()
    continued = step_losses(gpt(FSDP()), steps=4)  # what a 4th epoch gives, uninterrupted
    for i, strategy in enumerate((TensorParallel(model=2), one_device())):
        model = gpt(strategy)
        ckpt = tmp_path / f"ckpt{i}"
        import shutil

        shutil.copytree(tmp_path / "ckpt", ckpt)
        history = model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False,
                            checkpoint=str(ckpt)).history["loss"]
        # Resumed at step 3: the history of the first 3 epochs comes with the checkpoint,
        # the 4th ran from the restored state as the uninterrupted run did.
        np.testing.assert_allclose(history[:3], first, rtol=1e-6)
        np.testing.assert_allclose(history[3], continued[3], rtol=1e-4)
    restored = gpt(one_device())
    restored.fit(x, y, batch_size=16, epochs=3, verbose=0, checkpoint=str(tmp_path / "ckpt"))
    for a, b in zip(restored.get_weights(), expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize(("mesh", "flags", "warned"), [
    ("fsdp", ["unfixed"], True),  # what the GPT did before: XLA's warning, seen here
    ("fsdp", [], False),
    ("three", [], False),
])
def test_meshes_mixing_data_and_fsdp_compile_without_involuntary_rematerialization(
        mesh, flags, warned):
    """A GPT on {data, fsdp} (and {data, fsdp, model}) meshes: the token table's lookup read
    from its embed-split form made XLA replicate the lookup's output gradient ("Involuntary
    full rematerialization ... SPMD will replicate the tensor"); the table is now gathered
    along embed where it is used. Compiled in a fresh process (no compilation cache)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("remat_check.py")
    # Without the tests' compilation cache (conftest's, inherited): a hit would skip the
    # compile that warns.
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    out = subprocess.run([sys.executable, str(script), mesh, *flags], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loss" in out.stdout
    assert ("Involuntary full rematerialization" in out.stderr) is warned, out.stderr[-3000:]


def test_parameters_without_logical_axes_take_fsdps_default_layout_and_say_so():
    # An NNX module written without podkit's annotations: under FSDP every parameter was
    # replicated, silently. Now each is split along its largest dim the fsdp axis divides
    # (as FSDP2 shards parameters it was not told about), once warned, marked in the table.
    import flax.nnx as nnx

    from podkit.train.state import DefaultLayoutWarning

    class Plain(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(6, 32, rngs=rngs)
            self.down = nnx.Linear(32, 3, rngs=rngs)

        def __call__(self, x):
            return self.down(nnx.relu(self.up(x)))

    x = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
    y = x[:, :3].sum(1, keepdims=True) * np.ones((1, 3), np.float32)
    losses = {}
    for name, strategy in (("fsdp", FSDP()), ("dp", pk.DataParallel())):
        with strategy.scope():
            model = pk.Model(lambda rngs: Plain(rngs), seed=0)
            model.compile(optimizer="adam", loss="mse")
        if name == "fsdp":
            with pytest.warns(DefaultLayoutWarning, match=r"3 parameter\(s\) name no logical "
                                                          r"axes \(down/kernel, up/bias, up/k"):
                model.build((6,))
            table = {r["path"]: r for r in model.sharding_table() if r["kind"] == "param"}
            assert table["up/kernel"]["spec"] == [None, "fsdp"]  # (6, 32): 32 splits 8 ways
            assert table["down/kernel"]["spec"] == ["fsdp", None]  # (32, 3)
            assert table["down/bias"]["spec"] == [None]  # 3: nothing divides (so not listed)
            assert "note" not in table["down/bias"]
            assert "FSDP's default layout" in table["up/kernel"]["note"]
        losses[name] = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                                 verbose=0).history["loss"]
    np.testing.assert_allclose(losses["fsdp"], losses["dp"], rtol=1e-5)


def test_slices_are_refused_where_the_devices_are_not_that_many_slices():
    # One process of virtual CPU devices is one slice: slices=2 names what it found.
    with pytest.raises(pk.ConfigError, match=r"slices=2 but the \d+ devices are in 1 processes"):
        _ = pk.DataParallel(slices=2).mesh
    with pytest.raises(pk.ConfigError, match="names the dcn axis and slices=2"):
        pk.Strategy(mesh={"dcn": 2, "data": -1}, slices=2)
    with pytest.raises(pk.ConfigError, match=r"FSDP\(slices=0\): slices must be a positive int"):
        pk.FSDP(slices=0)
    # the dcn axis by hand (one process): the batch is split over it as over data
    s = pk.Strategy(mesh={"dcn": 2, "data": -1})
    assert s.batch_axes == ("dcn", "data")
