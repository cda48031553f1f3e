"""One process of a sharded job (started by test_sharding.py): a tiny GPT under the strategy
named in argv[2] for a few steps; process 0 writes the step losses and the parameters' digest
to argv[1]."""

import json
import sys

import numpy as np

import podkit as pk
from podkit.strategy import FSDP, TensorParallel

cluster = pk.connect(timeout_s=60)

from test_sharding import TINY_GPT, gpt, step_losses  # noqa: E402

strategies = {
    "fsdp": FSDP, "tp": lambda: TensorParallel(model=2),
    "custom": lambda: pk.Strategy(mesh={"data": 2, "fsdp": 2, "model": 2},
                                  rules=[("embed", "fsdp"), ("mlp", "model"),
                                         ("heads", "model"), ("vocab", "model")]),
}
model = gpt(strategies[sys.argv[2]]())
losses = step_losses(model)
weights = model.get_weights()  # gathered on every process
if cluster.process_index == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"processes": cluster.process_count,
                   "devices": len(model.strategy.mesh.devices.flat),
                   "config": str(TINY_GPT), "losses": losses.tolist(),
                   "weights_sum": float(sum(np.abs(w).sum() for w in weights))}, f)
