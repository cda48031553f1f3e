"""GPT training throughput and MFU: podkit fit() against hand-written loops on equal terms.

    .venv/bin/python bench/gpt.py                        # 1:dp and 8:dp, 3 rounds
    .venv/bin/python bench/gpt.py --settings 1:dp 8:fsdp --steps 20 --rounds 2

Model: configs/gpt_small.toml's decoder (4 layers, width 128, 4 heads, MLP 512, context 128,
vocabulary 2048), AdamW, batch 32 sequences (4,096 tokens per step), float32. Tokens are
random ids: a step costs the same whatever the text.

Settings (devices:strategy): 1:dp (one device: every strategy is the same program), 8:dp,
8:fsdp, 8:tp (TensorParallel(model=2): a data 4 x model 2 mesh) on virtual CPU devices. Each
setting runs in one process; in it every contestant is built and warmed up (compilation
excluded), then each round times `--steps` steps of every contestant in turn (odd rounds in
reverse order). A ratio is
taken within a round (the machine's speed drifts between rounds, hitting both sides alike)
and the median over rounds reported.

The pairings (every peer gets what podkit uses: data on the devices, donation, the same
module and parameter shardings; logical axes resolved by a 10-line table):
  hand 1    a hand-written Flax NNX + optax loop: `jax.jit` of a pure step over
            (params, opt_state) with donation, one step per call, batches put on the devices
            before the clock starts (no input cost at all)
  podkit 1  `model.fit(x, y, steps_per_epoch=N)`, compile(steps_per_execution=1); the data
            staged on the devices (podkit's feed)
  hand k    the same step in a `lax.scan` of k steps per call over (k, B, T) batches on the
            devices
  podkit k  compile(steps_per_execution=k)
  podkit    compile() as a Keras user calls it ("auto": podkit chooses, printed), against
            hand 1 (target >= 1.2x)
k defaults to what "auto" chose on one device.

MFU = (FLOPs per step of the hand step, counted on its jaxpr by podkit.train.flops: XLA's cost
analysis counts the scanned blocks' loop body once) x steps/s / peak, where the peak is a
float32 matmul (2048^3) measured by this script on one device of this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


class Podkit:
    """fit() over staged token arrays; `spe` None is compile()'s default ("auto")."""

    def __init__(self, kind: str, steps: int, spe: int | None):
        import podkit as pk
        from podkit.models.gpt import build_gpt

        self.x, self.y = tokens(steps)
        self.steps = steps
        with strategy_of(kind).scope():
            self.model = build_gpt(gpt_config(), {"vocab_size": VOCAB, "seq_len": SEQ})
            kwargs = {} if spe is None else {"steps_per_execution": spe}
            self.model.compile(
                optimizer=pk.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.01),
                loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True), **kwargs)
        self.run()  # compiles

    def run(self) -> float:
        start = time.perf_counter()
        self.model.fit(self.x, self.y, batch_size=BATCH, epochs=1, steps_per_epoch=self.steps,
                       verbose=0, shuffle=False)
        return self.steps / (time.perf_counter() - start)


class Hand:
    """The hand-written loop: k steps per call (a lax.scan when k > 1)."""

    def __init__(self, kind: str, steps: int, k: int):
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
        axes = data_axes if len(data_axes) > 1 else data_axes[0]
        batch_sh = NamedSharding(mesh, P(axes) if k == 1 else P(None, axes))

        # The rest (random-number state) goes in as an argument, a plain dict: NNX refuses
        # Variables made outside the trace inside its scan of the blocks (scan_layers).
        self.rest = nnx.to_pure_dict(rest)

        def loss_fn(p, xb, yb, rest):
            module = nnx.merge(graphdef, p, rest)
            logits = module(xb)
            return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

        def step(p, o, xb, yb, rest):
            loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb, rest)
            updates, o = tx.update(grads, o, p)
            return optax.apply_updates(p, updates), o, loss

        def scanned(p, o, xs, ys, rest):
            def body(carry, batch):
                p, o, loss = step(*carry, *batch, rest)
                return (p, o), loss

            (p, o), losses = jax.lax.scan(body, (p, o), (xs, ys))
            return p, o, losses[-1]

        self.step = jax.jit(step if k == 1 else scanned, donate_argnums=(0, 1))
        x, y = tokens(steps)
        shape = (steps, BATCH, SEQ) if k == 1 else (steps // k, k, BATCH, SEQ)
        self.batches = list(zip(jax.device_put(list(x.reshape(shape)), batch_sh),
                                jax.device_put(list(y.reshape(shape)), batch_sh), strict=True))
        self.state = [params, opt_state]
        self.steps, self.serial = steps, n > 1
        one = (x[:BATCH], y[:BATCH]) if k == 1 else (x[:k * BATCH].reshape(k, BATCH, SEQ),
                                                   y[:k * BATCH].reshape(k, BATCH, SEQ))
        # FLOPs counted on the jaxpr (podkit.train.flops): XLA's cost analysis counts a loop's
        # body once, and the config scans its blocks.
        from podkit.train import flops as flops_lib

        traced = self.step.trace(params, opt_state, *one, self.rest)
        self.flops = flops_lib.count(traced.jaxpr)[0] / k
        self.run()  # compiles

    def run(self) -> float:
        start = time.perf_counter()
        for i, (xb, yb) in enumerate(self.batches):
            self.state[0], self.state[1], loss = self.step(*self.state, xb, yb, self.rest)
            if self.serial and i % 2:  # at most two in flight (docs/design.md: CPU rendezvous)
                loss.block_until_ready()
        loss.block_until_ready()
        return self.steps / (time.perf_counter() - start)


def bench_setting(kind: str, steps: int, rounds: int, k: int | None) -> dict:
    """Every contestant in this process, interleaved over `rounds`: steps/s per round."""
    contestants = {"podkit": Podkit(kind, steps, None)}
    auto = contestants["podkit"].model.steps_per_execution
    k = k or auto
    if steps % k:
        raise SystemExit(f"--steps {steps} is not a multiple of k = {k}: pass --k or --steps")
    contestants.update({"hand 1": Hand(kind, steps, 1), "podkit 1": Podkit(kind, steps, 1),
                        "hand k": Hand(kind, steps, k), "podkit k": Podkit(kind, steps, k)})
    rates: dict[str, list[float]] = {who: [] for who in contestants}
    for r in range(rounds):
        # Odd rounds in reverse: each pair's order alternates (see bench/seed_mlp.py).
        for who in (list(contestants) if r % 2 == 0 else list(contestants)[::-1]):
            rates[who].append(contestants[who].run())
    return {"auto": auto, "k": k, "rates": rates,
            "flops_per_step": contestants["hand 1"].flops}


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
    else:
        out = bench_setting(kind, args.steps, args.rounds, args.k)
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
    parser.add_argument("--settings", nargs="+", default=["1:dp", "8:dp"],
                        help=f"of {' '.join(SETTINGS)}")
    parser.add_argument("--steps", type=int, default=20, help="steps per contestant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=None,
                        help="k of the k-step pairing (default: what 'auto' chose)")
    parser.add_argument("--child", choices=("setting", "peak"))
    parser.add_argument("--setting")
    args = parser.parse_args()
    if args.child:
        return child(args)
    for setting in args.settings:
        if setting not in SETTINGS:
            parser.error(f"--settings {setting}: choose from {' '.join(SETTINGS)}")
    peak = max(run_child("--child", "peak")["flops_per_s"] for _ in range(2))
    print(f"measured matmul peak (float32, one device): {peak / 1e9:.1f} GFLOP/s", flush=True)
    tokens_per_step = BATCH * SEQ
    for setting in args.settings:
        argv = ["--child", "setting", "--setting", setting, "--steps", str(args.steps),
                "--rounds", str(args.rounds)] + (["--k", str(args.k)] if args.k else [])
        got = run_child(*argv)
        rates, k = got["rates"], got["k"]
        flops = got["flops_per_step"]  # the whole step's, counted on the jaxpr
        med = {who: statistics.median(v) for who, v in rates.items()}

        def ratio(a: str, b: str, rates: dict = rates) -> str:
            each = [u / v for u, v in zip(rates[a], rates[b], strict=True)]
            return f"{statistics.median(each):.2f}x ({min(each):.2f}-{max(each):.2f})"

        print(f"\n{setting}: steps_per_execution='auto' chose {got['auto']}; k = {k}; "
              f"{args.rounds} rounds x {args.steps} steps; FLOPs/step {flops / 1e9:.2f} G")
        print(f"  {'contestant':10s} {'tokens/s (median)':>18s} {'MFU':>7s}")
        for who, v in med.items():
            label = who.replace(" k", f" {k}") if who.endswith(" k") else who
            print(f"  {label:10s} {v * tokens_per_step:>18,.0f} {flops * v / peak:>7.1%}")
        print(f"  podkit 1 / hand 1     {ratio('podkit 1', 'hand 1')}  target >= 1.0x")
        print(f"  podkit {k} / hand {k}{' ' * (10 - 2 * len(str(k)))}"
              f"{ratio('podkit k', 'hand k')}  target >= 1.0x")
        print(f"  podkit (auto) / hand 1 {ratio('podkit', 'hand 1')}  target >= 1.2x",
              flush=True)
    print("\nMFU against the one-device peak (8 virtual devices share the same cores)")


if __name__ == "__main__":
    main()
