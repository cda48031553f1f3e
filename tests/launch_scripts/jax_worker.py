"""One process of a real JAX job under `podkit launch`: joins through connect() from the
PODKIT_* variables the launcher sets, then all-gathers the process indices."""

import numpy as np
from jax.experimental import multihost_utils

import podkit as pk

cluster = pk.connect(timeout_s=60)
gathered = multihost_utils.process_allgather(np.array([cluster.process_index]))
print(f"process {cluster.process_index} of {cluster.process_count}, "
      f"{cluster.device_count} devices, gathered {sorted(gathered.ravel().tolist())}")
