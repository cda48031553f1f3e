"""GPT-124M and ResNet-50 on one TPU chip: podkit fit() against hand-written JAX loops, one run.

    python bench/tpu.py                      # on a TPU host (see docs/tpu.md), ~6 minutes
    python bench/tpu.py --only podkit expert --steps 30

Model: configs/gpt_124m.toml's decoder (12 layers, width 768, 12 heads, MLP 3072, context
1024, vocabulary 32,768: 136M parameters), bfloat16 compute with float32 master weights,
AdamW, batch `--batch` sequences of random token ids (a step costs the same whatever the text).

Contestants, one after another in this process (one program at a time holds the chip):
  podkit  `model.fit(x, y)` on the config's model ("auto": splash attention on TPU, the loss
          in vocabulary chunks, scanned blocks), steps_per_execution 10, data staged on the chip
  expert  the loop a TPU engineer would write for the same module: `jax.jit` of a pure step
          over (params, opt_state) with donation, the same splash kernel and chunked loss,
          batches on the chip before the clock starts
  naive   the same hand loop with XLA's attention and the full (batch, time, vocab) logits
  resnet  ResNet-50, bfloat16, synthetic 224x224 images, podkit fit(): images/s and MFU

MFU counts 6 x parameters + 6 x layers x context x width FLOPs per token (causal attention:
half of the 12 L T E of full attention), against the device kind's spec peak (table below) and
against a bfloat16 matmul measured here. Also printed: compile seconds (first fit() to its
first step for podkit, lower+compile for the hand loops) and peak HBM in use.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import time

# bf16 dense peak per chip, FLOP/s, from the vendors' spec sheets (docs/tpu.md has sources).
PEAK_BF16 = {"TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
             "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12}


def spec_peak(device) -> float | None:
    kind = device.device_kind
    for name, peak in sorted(PEAK_BF16.items(), key=lambda kv: -len(kv[0])):
        if kind.startswith(name):
            return peak
    return None


def measured_peak() -> float:
    from gpt import matmul_peak  # bench/gpt.py, beside this script

    return matmul_peak(8192, "bfloat16", calls=10, repeats=3)


def gpt_config(**over):
    import tomllib
    from pathlib import Path

    from podkit.config import GPTConfig

    table = tomllib.loads((Path(__file__).parent.parent / "configs/gpt_124m.toml").read_text())
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    over = {k: v for k, v in over.items() if k in fields}  # options this podkit has
    return GPTConfig(**{**table["model"], "sample_tokens": 0, **over}), table


def tokens(n: int, seq: int, vocab: int):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (n, seq + 1), dtype=np.int32)
    return x[:, :-1], x[:, 1:]


def hbm_peak_gib() -> float | None:
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**30


def bench_podkit(args) -> dict:
    import podkit as pk
    from podkit.models.gpt import build_gpt

    config, table = gpt_config()
    seq, vocab = table["data"]["seq_len"], table["data"]["vocab_size"]
    steps = args.steps
    x, y = tokens((steps + 10) * args.batch, seq, vocab)
    with pk.DataParallel().scope():
        model = build_gpt(config, {"vocab_size": vocab, "seq_len": seq})
        model.compile(optimizer=pk.optimizers.AdamW(learning_rate=6e-4, weight_decay=0.1),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=10)
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, steps_per_epoch=10, verbose=0)
    first = time.perf_counter() - start  # compile + 10 steps
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, steps_per_epoch=steps, verbose=0,
              shuffle=False)
    seconds = time.perf_counter() - start
    rate = steps / seconds
    return {"steps_per_s": rate, "compile_s": first - 10 / rate,
            "params": model.count_params(), "hbm_gib": hbm_peak_gib()}


def bench_hand(args, expert: bool) -> dict:
    import flax.nnx as nnx
    import jax
    import jax.numpy as jnp
    import optax

    from podkit.models.gpt import GPT

    # The expert loop: splash attention, the loss in chunks, scanned blocks (as podkit's
    # "auto" on a TPU); the naive one: XLA's attention, whole logits, a Python loop of blocks.
    config, table = gpt_config(attention="splash" if expert else "xla",
                               **({} if expert else {"scan_layers": False, "vocab_chunk": 0}))
    seq, vocab = table["data"]["seq_len"], table["data"]["vocab_size"]
    with nnx.use_eager_sharding(False):  # one chip: no mesh to lay the parameters on
        module = GPT(config, vocab, seq, nnx.Rngs(0))
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    tx = optax.adamw(6e-4, weight_decay=0.1)
    opt_state = jax.jit(tx.init)(params)

    def loss_fn(p, xb, yb):
        net = nnx.merge(graphdef, p, rest)
        if expert:  # the loss in vocabulary chunks: the (B, T, V) logits never exist
            net.train(lazy_logits=True)
            return net(xb).cross_entropy(yb).mean()
        logits = net(xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    def step(p, o, xb, yb):
        loss, grads = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    x, y = tokens(args.steps * args.batch, seq, vocab)
    batches = [(jnp.asarray(x[i * args.batch:(i + 1) * args.batch]),
                jnp.asarray(y[i * args.batch:(i + 1) * args.batch])) for i in range(args.steps)]
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, *batches[0]).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    for xb, yb in batches[:3]:  # warm-up
        params, opt_state, loss = compiled(params, opt_state, xb, yb)
    loss.block_until_ready()
    start = time.perf_counter()
    for xb, yb in batches:
        params, opt_state, loss = compiled(params, opt_state, xb, yb)
    loss.block_until_ready()
    seconds = time.perf_counter() - start
    return {"steps_per_s": args.steps / seconds, "compile_s": compile_s,
            "hbm_gib": hbm_peak_gib(), "loss": float(loss),
            "temp_gib": getattr(memory, "temp_size_in_bytes", 0) / 2**30}


def bench_resnet(args) -> dict:
    import numpy as np

    import podkit as pk
    from podkit.config import ResNetConfig
    from podkit.models.resnet import build_resnet

    batch, steps = 128, 20
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * 4, 224, 224, 3), dtype=np.float32)
    y = rng.integers(0, 1000, (batch * 4,), dtype=np.int32)
    with pk.DataParallel().scope():
        model = build_resnet(ResNetConfig(depth=50, precision="mixed_bfloat16"),
                             {"classes": 1000, "image_shape": (224, 224, 3)})
        model.compile(optimizer=pk.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=4)
    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=4, verbose=0)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=steps, verbose=0)
    rate = steps * batch / (time.perf_counter() - start)
    # ResNet-50 at 224x224: 4.1 GFLOPs (multiply-adds x 2) forward per image, x3 with backward.
    return {"images_per_s": rate, "flops_per_image": 3 * 2 * 4.1e9, "hbm_gib": hbm_peak_gib()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+",
                        default=["podkit", "expert", "naive", "resnet"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import jax

    device = jax.devices()[0]
    spec = spec_peak(device)
    measured = measured_peak()
    print(f"device: {device.device_kind} ({device.platform}); spec bf16 peak "
          f"{(spec or 0) / 1e12:.0f} TFLOP/s; measured bf16 matmul {measured / 1e12:.1f} TFLOP/s",
          flush=True)
    config, table = gpt_config()
    seq = table["data"]["seq_len"]
    results: dict = {"device": device.device_kind, "spec_peak": spec, "measured_peak": measured}
    for who in args.only:
        gc.collect()
        try:
            if who == "podkit":
                results[who] = bench_podkit(args)
            elif who in ("expert", "naive"):
                results[who] = bench_hand(args, expert=who == "expert")
            elif who == "resnet":
                results[who] = bench_resnet(args)
        except Exception as e:  # a contestant that fails (e.g. out of memory) is reported
            results[who] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(who, json.dumps(results[who]), flush=True)
    params = results.get("podkit", {}).get("params") or 136_000_000
    flops_per_token = 6 * params + 6 * config.layers * seq * config.embed
    tokens_per_step = args.batch * seq
    print(f"\nGPT-124M ({params / 1e6:.0f}M parameters), batch {args.batch} x {seq} tokens, "
          f"{flops_per_token / 1e9:.3f} GFLOP per token")
    print(f"{'who':<8} {'tokens/s':>10} {'MFU spec':>9} {'MFU meas.':>10} {'compile s':>10} "
          f"{'HBM GiB':>8}")
    for who in ("podkit", "expert", "naive"):
        r = results.get(who)
        if not r or "error" in r:
            print(f"{who:<8} {r['error'] if r else 'not run'}")
            continue
        tps = r["steps_per_s"] * tokens_per_step
        r["tokens_per_s"] = tps
        r["mfu_spec"] = tps * flops_per_token / spec if spec else None
        r["mfu_measured"] = tps * flops_per_token / measured
        print(f"{who:<8} {tps:>10,.0f} {r['mfu_spec'] or 0:>9.1%} {r['mfu_measured']:>10.1%} "
              f"{r['compile_s']:>10.1f} {r['hbm_gib'] or 0:>8.1f}")
    for a, b in (("podkit", "expert"), ("podkit", "naive")):
        if "tokens_per_s" in results.get(a, {}) and "tokens_per_s" in results.get(b, {}):
            ratio = results[a]["tokens_per_s"] / results[b]["tokens_per_s"]
            print(f"ratio {a} / {b}: {ratio:.2f}x")
    if "podkit" in results and "expert" in results and "compile_s" in results["expert"]:
        print(f"first fit() to first step / hand compile: "
              f"{results['podkit'].get('compile_s', 0) / results['expert']['compile_s']:.2f}x")
    r = results.get("resnet")
    if r and "error" not in r:
        mfu = r["images_per_s"] * r["flops_per_image"] / spec if spec else 0
        print(f"ResNet-50 bf16 224x224 batch 128: {r['images_per_s']:,.0f} images/s, "
              f"MFU {mfu:.1%} (spec)")
    elif r:
        print(f"ResNet-50: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
