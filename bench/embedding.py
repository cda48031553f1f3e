"""What a training step costs as a sharded embedding table grows, the batch fixed.

    .venv/bin/python bench/embedding.py                  # 8 virtual devices, Adam and SGD
    .venv/bin/python bench/embedding.py --rows 16384 1048576 4194304 --devices 8

Model: `Embedding(rows, 16, sharded=True)` over 26 categorical features per example (power-law
ids, as click logs have), flattened, then Dense(64, relu) -> Dense(1); batch 1,024; binary
cross-entropy. The table's rows are split over every device (`table` -> all mesh axes).

Two updates of the same sharded table, side by side in one run:

  dense   `Embedding(..., sharded=True, sparse_updates=False)`: JAX's gradient of the gather is
          a table-sized scatter-add, and the optimizer reads and writes the whole table (with
          Adam also both moments: dense Adam decays every row's moments every step), 1/N of
          it per device;
  sparse  `Embedding(..., sharded=True)` (the default): the step differentiates with respect
          to the rows looked up and updates only those (podkit.train.sparse).

Printed per table size: the table's bytes per device, ms per step of each, each relative to
its own smallest table (a step whose cost grows with the table although the batch touches at
most 26,624 rows is rewriting the table), and dense / sparse. See docs/sharding.md.
"""

from __future__ import annotations

import argparse
import time

FEATURES, DIM, BATCH = 26, 16, 1024


def run(rows: int, optimizer: str, steps: int, sparse: bool) -> float:
    import numpy as np

    import podkit as pk

    rng = np.random.default_rng(0)
    n = BATCH * 20
    ids = np.minimum(rng.zipf(1.2, (n, FEATURES)) - 1, rows - 1).astype(np.int32)
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Embedding(rows, DIM, sharded=True,
                                                   sparse_updates=sparse),
                               pk.layers.Flatten(), pk.layers.Dense(64, activation="relu"),
                               pk.layers.Dense(1)])
        model.compile(optimizer=optimizer,
                      loss=pk.losses.BinaryCrossentropy(from_logits=True),
                      steps_per_execution=10)
    model.fit(ids, y, batch_size=BATCH, epochs=1, verbose=0)  # compiles
    start = time.perf_counter()
    model.fit(ids, y, batch_size=BATCH, epochs=steps // 20, verbose=0)
    return (time.perf_counter() - start) / (steps // 20 * 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+",
                        default=[1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--optimizers", nargs="+", default=["adam", "sgd"])
    args = parser.parse_args()
    import podkit as pk

    pk.connect(cpu_devices=args.devices)
    print(f"{args.devices} devices, batch {BATCH} x {FEATURES} ids, dim {DIM}")
    print(f"{'optimizer':<9} {'rows':>10} {'MB/device':>10} {'dense ms':>9} {'growth':>7} "
          f"{'sparse ms':>10} {'growth':>7} {'dense/sparse':>13}")
    for opt in args.optimizers:
        base: dict[bool, float] = {}
        for rows in args.rows:
            t = {sparse: run(rows, opt, args.steps, sparse) for sparse in (False, True)}
            for sparse in t:
                base.setdefault(sparse, t[sparse])
            mb = rows * DIM * 4 / args.devices / 2**20
            print(f"{opt:<9} {rows:>10,} {mb:>10.2f} {t[False] * 1e3:>9.2f} "
                  f"{t[False] / base[False]:>6.2f}x {t[True] * 1e3:>10.2f} "
                  f"{t[True] / base[True]:>6.2f}x {t[False] / t[True]:>12.2f}x", flush=True)


if __name__ == "__main__":
    main()
