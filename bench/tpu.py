"""GPT-124M (or a Llama) and ResNet-50 on one TPU chip: podkit fit() against hand-written JAX
loops, one run.

    python bench/tpu.py                      # on a TPU host (see docs/tpu.md), ~5 minutes
    python bench/tpu.py --only podkit expert --steps 30
    python bench/tpu.py --model llama --only podkit expert    # configs/llama_tpu.toml
    python bench/tpu.py --only podkit:batch=32,microbatches=2 podkit:vocab_chunk=0,label=whole

Each contestant may take settings after a colon (an unknown key is an error): `grad_norm`
(podkit's compile(grad_norm=), true/false), `batch`, `microbatches` (gradient
accumulation: the batch in this many sequential parts, one optimizer update), any
configs/gpt_124m.toml `[model]` key (`vocab_chunk=0`, `scan_layers=true`, `remat=minimal`),
and `label` (the row's name).

Model: configs/gpt_124m.toml's decoder (12 layers, width 768, 12 heads, MLP 3072, context
1024, vocabulary 32,768: 136M parameters), bfloat16 compute with float32 master weights,
AdamW, the config's batch (32 sequences in 2 microbatches) of random token ids (a step costs
the same whatever the text); `--batch` and `--microbatches` change it for every contestant.

Contestants, one after another in this process (one program at a time holds the chip):
  podkit  `model.fit(x, y)` with the config's model and settings ("auto": splash attention on
          a TPU; whole logits, unrolled blocks), the config's [train] steps_per_execution (k:
          10 in both configs), data staged on the chip
  expert  the loop a TPU engineer would write for the same module: `jax.jit` of a pure step
          over (params, opt_state) with donation, the same splash kernel, the same logits (in
          vocabulary chunks when the model's vocab_chunk is set), gradient accumulation over
          the same microbatches, the same k steps per call (a `lax.scan` of k steps, as
          podkit's execution), batches on the chip before the clock starts
  naive   a hand loop with XLA's attention and the full (batch, time, vocab) logits, no
          accumulation, one step per call: one microbatch's sequences per step. Not equal
          terms, on purpose (what a first hand loop looks like); its ratio says so
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
import os
import time


def spec_peak(device) -> float | None:
    """The device kind's dense bf16 peak: podkit's own table (podkit/hardware.py), the one
    fit()'s MFU divides by."""
    from podkit.hardware import spec_peak as table_peak

    return table_peak(device)


def measured_peak() -> float:
    from gpt import matmul_peak  # bench/gpt.py, beside this script

    return matmul_peak(8192, "bfloat16", calls=10, repeats=3)


# --model: the config each decoder's contestants run (its [model], [data] and [train]).
CONFIGS = {"gpt": "configs/gpt_124m.toml", "llama": "configs/llama_tpu.toml"}
MODEL = "gpt"  # set by --model


def steps_per_call() -> int:
    """k: the optimizer steps podkit's fit() runs per device call, the --model config's
    [train] steps_per_execution; the expert loop runs the same k per call."""
    _, table = gpt_config()
    k = table.get("train", {}).get("steps_per_execution", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SystemExit(f"{CONFIGS[MODEL]}: [train] steps_per_execution = {k!r}; this bench "
                         "runs the expert at podkit's steps per call, so it needs a number")
    return k


def gpt_config(**over):
    """The --model config's model section (GPTConfig or LlamaConfig) and its whole table."""
    import tomllib
    from pathlib import Path

    from podkit.config import GPTConfig, LlamaConfig

    table = tomllib.loads((Path(__file__).parent.parent / CONFIGS[MODEL]).read_text())
    cls = LlamaConfig if MODEL == "llama" else GPTConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(over) - fields)
    if unknown:  # never run the default and report it as the setting
        raise SystemExit(f"{', '.join(unknown)}: not a key of {cls.__name__} (--model {MODEL})")
    return cls(**{**table["model"], "sample_tokens": 0, **over}), table


def build_decoder(config, seq: int, vocab: int):
    """The --model decoder as a pk.Model (uncompiled)."""
    from podkit.models.gpt import build_gpt
    from podkit.models.llama import build_llama

    build = build_llama if MODEL == "llama" else build_gpt
    return build(config, {"vocab_size": vocab, "seq_len": seq})


def decoder_module(config, vocab: int, seq: int, rngs):
    """The --model decoder as the NNX module the hand loops train."""
    from podkit.models.gpt import GPT
    from podkit.models.llama import Llama

    return (Llama if MODEL == "llama" else GPT)(config, vocab, seq, rngs)


def flops_per_token(config, params: int, seq: int, vocab: int) -> float:
    """The matmul FLOPs a train step runs per token: 6 x the parameters a token's matmuls
    use (the Llama's untied token table is a lookup, not a matmul: left out; the GPT-2 count
    keeps its tied table, which is its output layer) plus causal attention's scores and
    values, half of 12 x layers x context x the query width."""
    if MODEL == "llama":
        from podkit.models.llama import head_dim_of

        matmul_params = params - (0 if config.tie_embeddings else vocab * config.embed)
        return 6 * matmul_params + 6 * config.layers * seq * config.heads * head_dim_of(config)
    return 6 * params + 6 * config.layers * seq * config.embed


def parse_contestant(text: str) -> tuple[str, dict]:
    """"podkit:batch=32,remat=minimal" -> ("podkit", {"batch": 32, "remat": "minimal"})."""
    import tomllib

    who, _, rest = text.partition(":")
    settings = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{text!r}: settings are key=value, comma-separated")
        try:
            settings[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            settings[key] = value  # a bare word: a string
    if who not in ("podkit", "expert", "naive", "resnet"):
        raise SystemExit(f"{who!r} is not a contestant: podkit, expert, naive or resnet")
    return who, settings


def check_settings(who: str, settings: dict) -> None:
    """Every setting of a contestant is one it takes (a typo would otherwise run the default
    and be reported under the typo's name): resnet a `label`; the others `batch`,
    `microbatches`, `label`, podkit `grad_norm`, and the --model config's keys."""
    own = {"label"} if who == "resnet" else {"batch", "microbatches", "label"} | (
        {"grad_norm"} if who == "podkit" else set())
    rest = {k: v for k, v in settings.items() if k not in own}
    kinds = {"batch": int, "microbatches": int, "grad_norm": bool, "label": str}
    for key, kind in kinds.items():
        value = settings.get(key)
        if key in settings and (not isinstance(value, kind) or isinstance(value, bool) != (
                kind is bool) or (kind is int and value < 1)):
            raise SystemExit(f"{who}:{key}={value!r}: {key} takes "
                             f"{'a positive int' if kind is int else kind.__name__}")
    if who == "resnet" and rest:
        raise SystemExit(f"{', '.join(sorted(rest))}: resnet takes only label")
    gpt_config(**rest)  # a key the model's config lacks: SystemExit naming it


class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling, from its monitoring events."""

    EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
              "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
              "/jax/core/compile/backend_compile_duration": "compile"}

    def __init__(self) -> None:
        import jax

        self.seconds: dict[str, float] = {}
        self.compiles = 0
        self.longest: list[float] = []
        jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, seconds: float, **_) -> None:
        name = self.EVENTS.get(event)
        if name is not None:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            if name == "compile":
                self.compiles += 1
                self.longest = sorted([*self.longest, round(seconds, 1)], reverse=True)[:3]

    def take(self) -> dict:
        out = {**{k: round(v, 2) for k, v in self.seconds.items()}, "compiles": self.compiles,
               "longest": self.longest}
        self.seconds, self.compiles, self.longest = {}, 0, []
        return out


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


def gpt_model(config, seq: int, vocab: int, microbatches: int = 1, grad_norm=None):
    """podkit's GPT as the podkit contestant trains it (bench/sim_calibrate.py too).
    `grad_norm`: compile()'s (None: podkit's default, measured for large models)."""
    import podkit as pk

    with pk.DataParallel().scope():
        net = build_decoder(config, seq, vocab)
        net.compile(optimizer=pk.optimizers.AdamW(learning_rate=6e-4, weight_decay=0.1),
                    loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                    steps_per_execution=steps_per_call(), microbatches=microbatches,
                    grad_norm=grad_norm)
    return net


def resnet50_model():
    """ResNet-50 as the resnet contestant trains it (bench/sim_calibrate.py too)."""
    import podkit as pk
    from podkit.config import ResNetConfig
    from podkit.models.resnet import build_resnet

    with pk.DataParallel().scope():
        model = build_resnet(ResNetConfig(depth=50, precision="mixed_bfloat16"),
                             {"classes": 1000, "image_shape": (224, 224, 3)})
        model.compile(optimizer=pk.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=4)
    return model


def bench_podkit(args, batch: int, microbatches: int = 1, profile: str | None = None,
                 grad_norm=None, **model) -> dict:

    config, table = gpt_config(**model)
    seq, vocab = table["data"]["seq_len"], table["data"]["vocab_size"]
    steps, k = args.steps, steps_per_call()
    x, y = tokens((steps + k) * batch, seq, vocab)
    net = gpt_model(config, seq, vocab, microbatches, grad_norm)
    start = time.perf_counter()
    net.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=k, verbose=0)
    first = time.perf_counter() - start  # compile + one execution of k steps
    clock = args.clock.take()
    start = time.perf_counter()
    net.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=steps, verbose=0,
            shuffle=False)
    seconds = time.perf_counter() - start
    rate = steps / seconds
    if profile:  # a trace of 2 executions (20 steps) for Perfetto / bench/tpu_profile.py
        import jax

        with jax.profiler.trace(profile, create_perfetto_trace=True):
            net.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=20, verbose=0,
                    shuffle=False)
    return {"steps_per_s": rate, "compile_s": first - k / rate, "first_fit_s": first,
            "jax_compile": clock, "params": net.count_params(), "hbm_gib": hbm_peak_gib(),
            "tokens_per_step": batch * seq, "steps_per_call": net.steps_per_execution}


def bench_hand(args, expert: bool, batch: int, microbatches: int = 1,
               profile: str | None = None, **model) -> dict:
    import flax.nnx as nnx
    import jax
    import jax.numpy as jnp
    import optax

    # The expert loop: splash attention, the loss in chunks, scanned blocks (as podkit's
    # "auto" on a TPU); the naive one: XLA's attention, whole logits, a Python loop of blocks.
    config, table = gpt_config(**{"attention": "splash" if expert else "xla",
                                  **({} if expert else {"scan_layers": False, "vocab_chunk": 0}),
                                  **model})
    seq, vocab = table["data"]["seq_len"], table["data"]["vocab_size"]
    with nnx.use_eager_sharding(False):  # one chip: no mesh to lay the parameters on
        module = decoder_module(config, vocab, seq, nnx.Rngs(0))
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    params, rest = nnx.to_pure_dict(params), nnx.to_pure_dict(rest)
    tx = optax.adamw(6e-4, weight_decay=0.1)
    opt_state = jax.jit(tx.init)(params)

    # `rest` (the random-number state: no dropout here, so nothing changes it) goes in as an
    # argument, a plain dict: NNX refuses Variables made outside the trace in its scan.
    def loss_fn(p, r, xb, yb):
        net = nnx.merge(graphdef, p, r)
        if expert and config.vocab_chunk:  # the loss in vocabulary chunks (as podkit's)
            net.train(lazy_logits=True)
            return net(xb).cross_entropy(yb).mean()
        logits = net(xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    def grads_of(p, r, xb, yb):
        if microbatches == 1:
            return jax.value_and_grad(loss_fn)(p, r, xb, yb)
        # Gradient accumulation: the parts one after another, their gradients summed.
        parts = jax.tree.map(lambda a: a.reshape(microbatches, -1, *a.shape[1:]), (xb, yb))

        def part(acc, xy):
            loss, g = jax.value_and_grad(loss_fn)(p, r, *xy)
            return jax.tree.map(jnp.add, acc, (loss, g)), None

        zero = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, p))
        total, _ = jax.lax.scan(part, zero, parts)
        return jax.tree.map(lambda a: a / microbatches, total)

    def step(p, o, r, xb, yb):
        loss, grads = grads_of(p, r, xb, yb)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    def k_steps(p, o, r, xs, ys):  # podkit's steps_per_execution: k steps in one call
        def body(carry, batch):
            p, o, loss = step(*carry, r, *batch)
            return (p, o), loss

        (p, o), losses = jax.lax.scan(body, (p, o), (xs, ys))
        return p, o, losses[-1]

    # The expert at podkit's steps per call; the naive loop at one, a plain step (no scan).
    k = steps_per_call() if expert else 1
    program = jax.jit(k_steps if k > 1 else step, donate_argnums=(0, 1))
    x, y = tokens(args.steps * batch, seq, vocab)
    shape = (-1, batch, seq) if k == 1 else (-1, k, batch, seq)
    batches = [(jnp.asarray(xc), jnp.asarray(yc))  # one entry per call
               for xc, yc in zip(x.reshape(shape), y.reshape(shape), strict=True)]
    start = time.perf_counter()
    compiled = program.lower(params, opt_state, rest, *batches[0]).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    for xb, yb in batches[:-(-3 // k)]:  # warm-up: 3 steps, or one call of k
        params, opt_state, loss = compiled(params, opt_state, rest, xb, yb)
    loss.block_until_ready()
    start = time.perf_counter()
    for xb, yb in batches:
        params, opt_state, loss = compiled(params, opt_state, rest, xb, yb)
    loss.block_until_ready()
    seconds = time.perf_counter() - start
    if profile:  # 20 steps, as podkit's trace, for bench/tpu_profile.py
        with jax.profiler.trace(profile, create_perfetto_trace=True):
            for xb, yb in batches[:max(1, 20 // k)]:
                params, opt_state, loss = compiled(params, opt_state, rest, xb, yb)
            loss.block_until_ready()
    return {"steps_per_s": args.steps / seconds, "compile_s": compile_s,
            "hbm_gib": hbm_peak_gib(), "loss": float(loss), "tokens_per_step": batch * seq,
            "temp_gib": getattr(memory, "temp_size_in_bytes", 0) / 2**30,
            "steps_per_call": k}


def bench_resnet(args, batch: int = 128) -> dict:
    import numpy as np

    steps = 20
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * 4, 224, 224, 3), dtype=np.float32)
    y = rng.integers(0, 1000, (batch * 4,), dtype=np.int32)
    model = resnet50_model()
    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=4, verbose=0)
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=steps, verbose=0)
    rate = steps * batch / (time.perf_counter() - start)
    # ResNet-50 at 224x224: 4.1 GFLOPs (multiply-adds x 2) forward per image, x3 with backward.
    return {"images_per_s": rate, "flops_per_image": 3 * 2 * 4.1e9, "hbm_gib": hbm_peak_gib()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", default=["podkit", "expert", "naive", "resnet"],
                        help="contestants, each optionally with settings: "
                             "podkit:batch=32,microbatches=2")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="gpt",
                        help="the decoder: gpt (configs/gpt_124m.toml) or llama "
                             "(configs/llama_tpu.toml)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, help="sequences per step (default: the config's)")
    parser.add_argument("--microbatches", type=int,
                        help="gradient accumulation (default: the config's)")
    parser.add_argument("--profile", help="trace 20 steps of the first podkit and the first "
                        "hand-loop contestant into DIR/podkit, DIR/expert (or DIR/naive)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    contestants = [parse_contestant(c) for c in args.only]
    global MODEL
    MODEL = args.model
    for who, settings in contestants:  # every setting checked before the chip is touched
        check_settings(who, settings)
    k = steps_per_call()
    if args.steps % k and any(who in ("podkit", "expert") for who, _ in contestants):
        raise SystemExit(f"--steps {args.steps}: podkit and the expert run {k} steps per call "
                         f"({CONFIGS[MODEL]}'s [train] steps_per_execution); give a multiple "
                         f"of {k}, so that both time whole calls")

    import jax

    device = jax.devices()[0]
    spec = spec_peak(device)
    measured = measured_peak()
    args.clock = CompileClock()
    print(f"device: {device.device_kind} ({device.platform}); spec bf16 peak "
          f"{(spec or 0) / 1e12:.0f} TFLOP/s; measured bf16 matmul {measured / 1e12:.1f} TFLOP/s",
          flush=True)
    config, table = gpt_config()
    seq = table["data"]["seq_len"]
    args.batch = args.batch or table["data"]["batch_size"]
    args.microbatches = args.microbatches or table["train"].get("microbatches", 1)
    results: dict = {"device": device.device_kind, "spec_peak": spec, "measured_peak": measured}
    rows = []
    profiled: set[str] = set()
    for who, settings in contestants:
        settings = dict(settings)
        label = str(settings.pop("label", who if not settings else
                                 f"{who}:" + ",".join(f"{k}={v}" for k, v in settings.items())))
        if label in results:  # the same contestant again (rounds): its own row
            label = f"{label} #{sum(1 for _, seen in rows if seen.split(' #')[0] == label) + 1}"
        if who == "naive":  # no gradient accumulation: podkit's microbatch as its batch
            settings.setdefault("microbatches", 1)
            settings.setdefault("batch", args.batch // args.microbatches)
        batch = settings.pop("batch", args.batch)
        if who != "resnet":
            settings.setdefault("microbatches", args.microbatches)
        gc.collect()
        jax.clear_caches()  # the previous contestant's executables leave the chip
        try:
            profile = (os.path.join(args.profile, who)
                       if args.profile and who not in profiled else None)
            profiled.add(who)  # the first contestant of each kind only
            if who == "podkit":
                r = bench_podkit(args, batch, profile=profile, **settings)
            elif who in ("expert", "naive"):
                r = bench_hand(args, expert=who == "expert", batch=batch, profile=profile,
                               **settings)
            else:
                r = bench_resnet(args)
        except Exception as e:  # a contestant that fails (e.g. out of memory) is reported
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        results[label] = r
        rows.append((who, label))
        print(label, json.dumps(r, default=str), flush=True)
    vocab = table["data"]["vocab_size"]
    params = next((results[label]["params"] for who, label in rows
                   if "params" in results[label]), None)
    if params is None:  # no podkit contestant ran: count the module's parameters
        import flax.nnx as nnx

        with nnx.use_eager_sharding(False):
            shapes = nnx.eval_shape(lambda: decoder_module(config, vocab, seq, nnx.Rngs(0)))
        params = sum(v.size for v in jax.tree.leaves(nnx.state(shapes, nnx.Param)))
    per_token = flops_per_token(config, params, seq, vocab)
    print(f"\n{CONFIGS[MODEL]} ({params / 1e6:.0f}M parameters), {seq} tokens per sequence, "
          f"{per_token / 1e9:.3f} GFLOP per token (matmuls)")
    print(f"{'who':<40} {'tokens/s':>10} {'MFU spec':>9} {'MFU meas.':>10} {'compile s':>10} "
          f"{'HBM GiB':>8} {'steps/call':>10}")
    for who, label in rows:
        r = results[label]
        if who == "resnet":
            continue
        if "error" in r:
            print(f"{label:<40} {r['error']}")
            continue
        tps = r["steps_per_s"] * r["tokens_per_step"]
        r["tokens_per_s"] = tps
        r["mfu_spec"] = tps * per_token / spec if spec else None
        r["mfu_measured"] = tps * per_token / measured
        print(f"{label:<40} {tps:>10,.0f} {r['mfu_spec'] or 0:>9.1%} {r['mfu_measured']:>10.1%} "
              f"{r['compile_s']:>10.1f} {r['hbm_gib'] or 0:>8.1f} {r['steps_per_call']:>10}")
    first = {who: label for who, label in reversed(rows) if "tokens_per_s" in results[label]}
    for a, b in (("podkit", "expert"), ("podkit", "naive")):
        if a in first and b in first:
            ra, rb = results[first[a]], results[first[b]]
            ka, kb = ra["steps_per_call"], rb["steps_per_call"]
            terms = f"both at {ka} steps per call" if ka == kb else \
                f"NOT equal terms: {ka} against {kb} steps per call"
            if b == "naive":
                terms += "; the naive loop: XLA attention, whole logits, no accumulation"
            print(f"ratio {first[a]} / {first[b]}: {ra['tokens_per_s'] / rb['tokens_per_s']:.2f}x"
                  f" ({terms}); first fit() to first step / hand compile: "
                  f"{ra['compile_s'] / rb['compile_s']:.2f}x")
    for who, label in rows:
        r = results[label]
        if who != "resnet":
            continue
        if "error" in r:
            print(f"ResNet-50: {r['error']}")
            continue
        mfu = r["images_per_s"] * r["flops_per_image"] / spec if spec else 0
        print(f"ResNet-50 bf16 224x224 batch 128: {r['images_per_s']:,.0f} images/s, "
              f"MFU {mfu:.1%} (spec)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
