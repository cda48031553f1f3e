"""One process of a multi-process job (started by test_multiprocess.py).

Reads PODKIT_* variables through connect(), trains the seed model on the digits and, on
process 0, writes the per-step losses and final weights to the path given as argv[1].
"""

import json
import sys

import numpy as np

import podkit as pk

cluster = pk.connect(timeout_s=60)
(x, y), _ = pk.datasets.load_digits()
losses = []


class Rec(pk.Callback):
    def on_log(self, step, logs):
        losses.append(logs["window/loss"])


# "slices": each process a slice of a multislice job (the dcn axis over the processes)
slices = 2 if len(sys.argv) > 3 and sys.argv[3] == "slices" else 1
strategy = pk.DataParallel(slices=slices)
with strategy.scope():
    model = pk.Sequential(
        [pk.layers.Dense(128, activation="relu"), pk.layers.Dense(10, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=int(sys.argv[2]))
if len(sys.argv) > 3 and sys.argv[3] == "bad_labels":
    # Only process 1 holds a bad label: every process must fail, none may wait forever.
    bad = y.copy()
    if cluster.process_index == 1:
        bad[5] = 99
    batches = [(x[i:i + 64], bad[i:i + 64]) for i in range(0, 640, 64)]
    try:
        model.fit(batches, epochs=1, steps_per_epoch=10, verbose=0)
    except pk.InputError as e:
        print(f"process {cluster.process_index}: InputError: {e}", flush=True)
        sys.exit(3)
    sys.exit(0)
if len(sys.argv) > 3 and sys.argv[3] == "not_probabilities":
    # Outputs that are not probabilities for a probability loss, on batches that differ per
    # process: the check before training compares every process's rows (it used to put one
    # process's rows onto the whole mesh, which JAX refuses with an AssertionError).
    with pk.DataParallel().scope():
        relu = pk.Sequential([pk.layers.Dense(10, activation="relu")])
        relu.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    own = slice(cluster.process_index * 320, (cluster.process_index + 1) * 320)
    try:
        relu.fit(pk.data.Dataset.from_tensor_slices((x[own], y[own])).batch(32), epochs=1,
                 verbose=0)
    except pk.InputError as e:
        print(f"process {cluster.process_index}: InputError: {e}", flush=True)
        sys.exit(3)
    sys.exit(0)
if len(sys.argv) > 3 and sys.argv[3] == "dataset":
    # The same batches from a pk.data pipeline; fit() gives each process its share.
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else None
    ds = pk.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(64)
    # The seed as drawn, before fit (the test starts its one-process run with process 0's
    # meanwhile); the one after fit is written below.
    with open(f"{sys.argv[1]}.drawn{cluster.process_index}", "w") as f:
        f.write(str(ds.shuffle_seeds()[0]))
    model.fit(ds, epochs=2, verbose=0, callbacks=[Rec()], log_every=1)
    with open(f"{sys.argv[1]}.seed{cluster.process_index}", "w") as f:
        f.write(str(ds.shuffle_seeds()[0]))
elif len(sys.argv) > 3 and sys.argv[3] == "microbatches":
    # Gradient accumulation over processes: a masked loss on rows of 1 to 12 tokens (their
    # counts follow the row modulo 4, so the parts' token counts differ), k = 4 against 1.
    rng = np.random.default_rng(0)
    tokens = np.zeros((32, 12), np.int32)
    for i in range(32):
        n = (12, 1, 7, 2)[i % 4]
        tokens[i, :n] = rng.integers(1, 20, n)
    labels = rng.integers(0, 5, (32, 12)).astype(np.int32)
    steps = {}
    for k in (1, 4):
        with pk.DataParallel().scope():
            tagger = pk.Sequential([pk.Input((12,), dtype="int32"),
                                    pk.layers.Embedding(20, 8, mask_zero=True),
                                    pk.layers.Dense(5)])
            tagger.compile(optimizer=pk.optimizers.SGD(1.0), microbatches=k,
                           loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                           steps_per_execution=1)
        loss = tagger.train_on_batch(tokens, labels)
        steps[k] = {"loss": float(loss), "weights": [w.tolist() for w in tagger.get_weights()]}
    if cluster.process_index == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"steps": steps, "processes": cluster.process_count}, f)
    sys.exit(0)
elif len(sys.argv) > 3 and sys.argv[3] == "run_dir":
    # A run directory on a URL ($TEST_RUN_DIR): every process logs, process 0 alone pushes.
    import os

    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[Rec()], log_every=1,
              run_dir=os.environ["TEST_RUN_DIR"])
else:
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[Rec()], log_every=1)
weights = model.get_weights()
pred = model.predict(x[:10], batch_size=8)
if cluster.process_index == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({
            "devices": len(cluster.devices),
            "processes": cluster.process_count,
            "losses": losses,
            "kernel0": np.asarray(weights[1]).ravel()[:200].tolist(),  # bias 0, kernel 0, ...
            "pred": pred.tolist(),
            "steps": len(losses),
            "mesh": dict(strategy.mesh.shape),
            # the process of each device, by its mesh coordinates (dcn first where there is)
            "processes_by_mesh": np.vectorize(lambda d: d.process_index)(
                strategy.mesh.devices).tolist(),
        }, f)
