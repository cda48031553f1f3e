"""The GPT's compiled train step, compiled and not run: temporary memory (XLA's memory
analysis) and compile seconds, for whole logits against vocabulary chunks, each remat policy,
and scanned against unrolled blocks.

    .venv/bin/python bench/gpt_memory.py                 # GPT-2 small's shape, batch 4 x 1024
    .venv/bin/python bench/gpt_memory.py --layers 4 --embed 128 --heads 4 --mlp 512 \\
        --seq 128 --vocab 2048 --batch 16                  # configs/gpt_small.toml's

One device of whatever platform JAX finds (CPU here: XLA:CPU's figures; a TPU's differ).
Nothing is allocated but the state, so the shapes may exceed the machine's memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def measure(config, vocab: int, seq: int, batch: int) -> tuple[int, float]:
    """(temporary bytes, compile seconds) of one train step of `config`."""
    import jax
    import numpy as np

    import podkit as pk
    from podkit.models.gpt import build_gpt
    from podkit.train.feeds.inputs import BatchInputs

    with pk.Strategy(mesh={"data": 1}, devices=jax.devices()[:1]).scope():
        model = build_gpt(config, {"vocab_size": vocab, "seq_len": seq})
        model.compile(optimizer="adamw", metrics=["accuracy"],
                      loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.build((seq,), dtype=np.int32)
    program = model._program
    x = jax.ShapeDtypeStruct((1, batch, seq), np.int32)
    ones = jax.ShapeDtypeStruct((1, batch), np.float32)
    lowered = program.train.lower(model.state, program.zeros(), BatchInputs(x, x, ones, ones))
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
    return compiled.memory_analysis().temp_size_in_bytes, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("layers", 12), ("heads", 12), ("embed", 768), ("mlp", 3072),
                          ("seq", 1024), ("vocab", 32768), ("batch", 4), ("chunk", 4096)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--remat", default="none", help="the policy of the loss and scan runs")
    parser.add_argument("--only", nargs="*", default=["loss", "remat", "scan"],
                        help="which comparisons: loss remat scan")
    args = parser.parse_args()

    import jax

    from podkit.config import GPTConfig

    base = GPTConfig(layers=args.layers, heads=args.heads, embed=args.embed, mlp=args.mlp,
                     precision=args.precision, vocab_chunk=args.chunk, remat=args.remat,
                     sample_tokens=0)
    shape = (f"{args.layers} layers, width {args.embed}, batch {args.batch} x {args.seq}, "
             f"vocab {args.vocab}, {args.precision}, remat {args.remat}, "
             f"{jax.devices()[0].platform}")
    print(f"GPT train step ({shape}); temporary memory from XLA's memory analysis")
    runs = []
    if "loss" in args.only:
        runs += [("whole logits (vocab_chunk 0)", dict(vocab_chunk=0)),
                 (f"vocab_chunk {args.chunk}", {})]
    if "remat" in args.only:
        runs += [(f"remat {r}", dict(remat=r))
                 for r in ("none", "minimal", "save_qkv_proj", "full")]
    if "scan" in args.only:
        runs += [("unrolled blocks", dict(scan_layers=False)), ("scanned blocks", {})]
    measured: dict[str, tuple[int, float]] = {}  # by config: equal configs compile once
    for label, changes in runs:
        config = dataclasses.replace(base, **changes)
        if repr(config) not in measured:
            measured[repr(config)] = measure(config, args.vocab, args.seq, args.batch)
        temp, seconds = measured[repr(config)]
        print(f"  {label:32s} temp {temp / 2**30:7.3f} GiB   compile {seconds:6.1f} s",
              flush=True)


if __name__ == "__main__":
    main()
