"""Trains a small GPT one step on 8 CPU devices under a mesh that mixes `data` with `fsdp`
(argv: "fsdp" for {data 2, fsdp 4}, "three" for {data 2, fsdp 2, model 2}); "unfixed" drops
the GPT's token-table constraint, to show XLA's warning is seen when it happens. XLA prints
"Involuntary full rematerialization" to stderr while compiling; the test reads it there."""

import sys

import numpy as np

import podkit as pk

pk.connect(cpu_devices=8)

from podkit.config import GPTConfig  # noqa: E402
from podkit.models import gpt  # noqa: E402

mesh, *flags = sys.argv[1:]
if "unfixed" in flags:
    gpt.constrain = lambda x, axes: x
if mesh == "fsdp":
    strategy = pk.FSDP(data=2, fsdp=4)
else:
    strategy = pk.Strategy(mesh={"data": 2, "fsdp": 2, "model": 2},
                           rules=[("embed", "fsdp"), ("heads", "model"), ("mlp", "model"),
                                  ("vocab", "model")])
config = GPTConfig(layers=2, heads=4, embed=64, mlp=128, sample_tokens=0, scan_layers=False)
with strategy.scope():
    model = gpt.build_gpt(config, {"vocab_size": 512, "seq_len": 32}, seed=0)
    model.compile(optimizer="adamw",
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).integers(0, 512, (16, 33)).astype(np.int32)
history = model.fit(x[:, :-1], x[:, 1:], batch_size=16, epochs=1, verbose=0)
print("loss", history.history["loss"][-1])
