"""GPT training throughput and MFU: podkit fit() against a hand-written loop, in one run.

    .venv/bin/python bench/gpt.py                        # every setting below, 2 rounds
    .venv/bin/python bench/gpt.py --settings 1:dp 8:fsdp --steps 40 --rounds 1

Model: configs/gpt_small.toml's decoder (4 layers, width 128, 4 heads, MLP 512, context 128,
vocabulary 2048), AdamW, batch 32 sequences (4,096 tokens per step), float32. Tokens are
random ids: a step costs the same whatever the text.

Settings (devices:strategy): 1:dp (one device: every strategy is the same program), 8:dp,
8:fsdp, 8:tp (TensorParallel(model=2): a data 4 x model 2 mesh) on virtual CPU devices.

Contestants, each in a fresh process, rounds interleaved (this machine's speed drifts):
  podkit  `model.fit(x, y, steps_per_epoch=N)` after a warm-up fit (compilation excluded);
          the data staged on the devices, `steps_per_execution` 10
  hand    a hand-written Flax NNX + optax loop: `jax.jit` of a pure step over
          (params, opt_state) with donation, the same module and the same parameter
          shardings (logical axes resolved by a 10-line table), batches put on the devices
          before the clock starts — no input cost at all

MFU = (FLOPs per step from XLA's cost analysis of the hand step) x steps/s / peak, where the
peak is a float32 matmul (2048^3) measured by this script on one device of this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VOCAB, SEQ, BATCH = 2048, 128, 32
SETTINGS = ("1:dp", "8:dp", "8:fsdp", "8:tp")
RULES = {"dp": {}, "fsdp": {"embed": "fsdp"},
         "tp": {"mlp": "model", "heads": "model", "vocab": "model"}}
MESHES = {"dp": {"data": -1}, "fsdp": {"fsdp": -1}, "tp": {"data": -1, "model": 2}}


def gpt_config():
    import tomllib
    from pathlib import Path

    from podkit.config import GPTConfig

    table = tomllib.loads((Path(__file__).parent.parent / "configs/gpt_small.toml").read_text())
    return GPTConfig(**{**table["model"], "sample_tokens": 0})


def tokens(steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (steps * BATCH, SEQ + 1), dtype=np.int32)
    return x[:, :-1], x[:, 1:]


def strategy_of(kind: str):
    import podkit as pk
    from podkit.strategy import FSDP, TensorParallel

    return {"dp": pk.DataParallel, "fsdp": FSDP, "tp": lambda: TensorParallel(model=2)}[kind]()


def bench_podkit(kind: str, steps: int) -> dict:
    import podkit as pk
    from podkit.models.gpt import build_gpt

    x, y = tokens(steps)
    with strategy_of(kind).scope():
        model = build_gpt(gpt_config(), {"vocab_size": VOCAB, "seq_len": SEQ})
        model.compile(optimizer=pk.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.01),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=10)
    model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=20, verbose=0)  # compiles
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, steps_per_epoch=steps, verbose=0,
              shuffle=False)
    seconds = time.perf_counter() - start
    return {"steps_per_s": steps / seconds}


def bench_hand(kind: str, steps: int) -> dict:
    import flax.nnx as nnx
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from podkit.models.gpt import GPT

    sizes = MESHES[kind]
    n = len(jax.devices())
    fixed = 1
    for v in sizes.values():
        fixed *= v if v != -1 else 1
    shape = tuple(n // fixed if v == -1 else v for v in sizes.values())
    mesh = jax.make_mesh(shape, tuple(sizes), (jax.sharding.AxisType.Auto,) * len(shape))
    rules = RULES[kind]

    def spec(var) -> P:  # logical axes -> mesh axes, the hand-written way
        names = var.get_metadata().get("out_sharding") or (None,) * var.get_value().ndim
        return P(*[rules.get(a) if a and mesh.shape.get(rules.get(a), 1) > 1 else None
                   for a in names])

    with nnx.use_eager_sharding(False):  # placed below, by hand
        module = GPT(gpt_config(), VOCAB, SEQ, nnx.Rngs(0))
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    param_sh = nnx.to_pure_dict(jax.tree.map(
        lambda v: NamedSharding(mesh, spec(v)), params,
        is_leaf=lambda v: isinstance(v, nnx.Variable)))
    params = jax.device_put(nnx.to_pure_dict(params), param_sh)
    tx = optax.adamw(1e-3, weight_decay=0.01)
    opt_state = jax.jit(tx.init)(params)
    data_axes = tuple(a for a in ("data", "fsdp") if a in sizes)
    batch_sh = NamedSharding(mesh, P(data_axes if len(data_axes) > 1 else data_axes[0]))

    # The rest (random-number state) goes in as an argument, a plain dict: NNX refuses
    # Variables made outside the trace inside its scan of the blocks (scan_layers).
    rest = nnx.to_pure_dict(rest)

    def loss_fn(p, xb, yb, rest):
        module = nnx.merge(graphdef, p, rest)
        logits = module(xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    def step(p, o, xb, yb, rest):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb, rest)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    x, y = tokens(steps)
    batches = [(jax.device_put(x[i * BATCH:(i + 1) * BATCH], batch_sh),
                jax.device_put(y[i * BATCH:(i + 1) * BATCH], batch_sh)) for i in range(steps)]
    compiled = step.lower(params, opt_state, *batches[0], rest).compile()
    flops = (compiled.cost_analysis() or {}).get("flops", 0.0)
    for xb, yb in batches[:5]:  # warm-up
        params, opt_state, loss = step(params, opt_state, xb, yb, rest)
    loss.block_until_ready()
    start = time.perf_counter()
    for i, (xb, yb) in enumerate(batches):
        params, opt_state, loss = step(params, opt_state, xb, yb, rest)
        if i % 2:  # at most two steps in flight (see docs/design.md: CPU rendezvous)
            loss.block_until_ready()
    loss.block_until_ready()
    seconds = time.perf_counter() - start
    return {"steps_per_s": steps / seconds, "flops_per_step": flops}


def matmul_peak(n: int, dtype: str, calls: int, repeats: int) -> float:
    """FLOP/s of an (n, n) @ (n, n) matmul in `dtype` on the default device: the best of
    `repeats` timings of `calls` back-to-back calls (bench/tpu.py uses it too)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(dtype))
    mm = jax.jit(lambda a, b: a @ b)
    mm(a, b).block_until_ready()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = mm(a, b)
        out.block_until_ready()
        best = max(best, calls * 2 * n**3 / (time.perf_counter() - start))
    return best


def bench_peak() -> dict:
    return {"flops_per_s": matmul_peak(2048, "float32", calls=4, repeats=5)}


def child(args: argparse.Namespace) -> None:
    import podkit as pk

    devices, kind = args.setting.split(":") if args.setting else ("1", "dp")
    pk.connect(cpu_devices=int(devices))
    if args.child == "peak":
        out = bench_peak()
    elif args.child == "podkit":
        out = bench_podkit(kind, args.steps)
    else:
        out = bench_hand(kind, args.steps)
    print("RESULT " + json.dumps(out), flush=True)


def run_child(*argv: str) -> dict:
    cmd = [sys.executable, __file__, *argv]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{' '.join(argv)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=("podkit", "hand", "peak"))
    parser.add_argument("--setting")
    args = parser.parse_args()
    if args.child:
        return child(args)
    peak = max(run_child("--child", "peak")["flops_per_s"] for _ in range(2))
    print(f"measured matmul peak (float32, one device): {peak / 1e9:.1f} GFLOP/s")
    results: dict = {}
    for r in range(args.rounds):
        for setting in args.settings:
            for who in ("hand", "podkit"):
                got = run_child("--child", who, "--setting", setting, "--steps", str(args.steps))
                best = results.setdefault((setting, who), got)
                if got["steps_per_s"] > best["steps_per_s"]:
                    results[(setting, who)] = {**best, **got}
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    tokens_per_step = BATCH * SEQ
    # XLA's cost analysis of an SPMD program counts one device's share: the FLOPs of a step
    # are those of the one-device program (or the share times the devices).
    flops_of = {s: results[(s, "hand")].get("flops_per_step", 0.0) * int(s.split(":")[0])
                for s in args.settings}
    one = [s for s in args.settings if s.startswith("1:")]
    step_flops = flops_of[one[0]] if one else max(flops_of.values())
    print(f"\n{'setting':<8} {'hand tok/s':>11} {'podkit tok/s':>13} {'podkit/hand':>12} "
          f"{'MFU hand':>9} {'MFU podkit':>11}")
    for setting in args.settings:
        hand, pk_ = results[(setting, "hand")], results[(setting, "podkit")]
        mfu = lambda s: step_flops * s / peak
        print(f"{setting:<8} {hand['steps_per_s'] * tokens_per_step:>11,.0f} "
              f"{pk_['steps_per_s'] * tokens_per_step:>13,.0f} "
              f"{pk_['steps_per_s'] / hand['steps_per_s']:>11.2f}x "
              f"{mfu(hand['steps_per_s']):>8.1%} {mfu(pk_['steps_per_s']):>10.1%}")
    print(f"\nFLOPs per step (XLA cost analysis): {step_flops / 1e9:.2f} GFLOP; MFU against "
          "the one-device peak (8 virtual devices share the same cores)")


if __name__ == "__main__":
    main()
