"""A training job for the checkpoint tests: the seed model on the digits, with checkpoints.

    python ckpt_job.py OUT.json CKPT_DIR [epochs=3] [spe=4] [every=8] [stop_at=N] [sleep=S]
                       [resume=PATH] [nan_rows=1] [term_at_begin=P] [steps_log=PATH]
                       [local=N local_dir=PATH] [fsdp=1] [kill_at=N]

Joins a job from PODKIT_* (or runs alone), trains with fit(checkpoint=CheckpointManager(
CKPT_DIR, every_steps=every)), and on process 0 writes the losses of every execution, the
history and a hash of the parameters to OUT.json. stop_at=N leaves fit() with exit status 5
once step N is reached (a crash the test can aim); sleep=S waits S seconds after every
execution (time for the test to send a signal); term_at_begin=P has process P send itself
SIGTERM as training begins. local=N: a local tier every N steps in local_dir; fsdp=1: the
parameters sharded over the processes (FSDP), so each holds other shards; kill_at=N: the last
process SIGKILLs itself once its local step N (its own part and its peer's copy) is written.
"""

import json
import sys
import time

import numpy as np
import xxhash

import podkit as pk

out, ckpt_dir = sys.argv[1], sys.argv[2]
opts = dict(a.split("=", 1) for a in sys.argv[3:])
cluster = pk.connect(timeout_s=60)
(x, y), _ = pk.datasets.load_digits()
if "nan_rows" in opts:  # a poisoned stretch of rows: the loss becomes NaN on those batches
    x = x.copy()
    x[640:704] = np.nan
losses = []


class Probe(pk.Callback):
    def on_log(self, step, logs):
        losses.append([step, logs["window/loss"]])
        if "steps_log" in opts:  # every logged step, as it is logged (the job may not end)
            with open(opts["steps_log"], "a") as f:
                f.write(f"{step}\n")

    def on_train_begin(self, logs=None):
        if opts.get("term_at_begin") == str(cluster.process_index):  # before any step
            import os
            import signal

            os.kill(os.getpid(), signal.SIGTERM)

    stamped = False

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.state.step)
        if "stamp" in opts and not self.stamped:  # for bench/checkpoint.py's recovery time
            self.stamped = True
            import os

            print(f"first-step {time.time():.3f} pid {os.getpid()}"
                  + (" resumed" if int(os.environ.get("PODKIT_RESTART", "0")) else ""),
                  flush=True)
        if "sleep" in opts:
            time.sleep(float(opts["sleep"]))
        if "stop_at" in opts and step >= int(opts["stop_at"]):
            raise SystemExit(5)
        if "kill_at" in opts and step > int(opts["kill_at"]) \
                and cluster.process_index == cluster.process_count - 1:
            import os
            import signal
            from pathlib import Path

            # A local step: its save was dispatched after the callbacks of its execution.
            at = int(opts["kill_at"])
            me, peer = cluster.process_index, cluster.process_index - 1
            done = Path(opts["local_dir"]) / f"process_{me}" / f"step_{at:010d}"
            while not all((done / f"part_{p}" / "COMMIT.json").exists() for p in (me, peer)):
                time.sleep(0.005)
            os.kill(os.getpid(), signal.SIGKILL)


with (pk.FSDP() if opts.get("fsdp") else pk.DataParallel()).scope():
    model = pk.Sequential(
        [pk.layers.Dense(128, activation="relu"), pk.layers.Dense(10, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=int(opts.get("spe", 4)))
manager = pk.checkpoint.CheckpointManager(
    ckpt_dir, every_steps=int(opts.get("every", 8)),
    local_every_steps=int(opts["local"]) if "local" in opts else None,
    local_dir=opts.get("local_dir"))
history = model.fit(x, y, batch_size=64, epochs=int(opts.get("epochs", 3)), verbose=0,
                    callbacks=[Probe()], log_every=1, checkpoint=manager,
                    resume=opts.get("resume"), on_nan=opts.get("on_nan"))
h = xxhash.xxh3_128()
for w in model.get_weights():
    h.update(np.ascontiguousarray(w).tobytes())
if cluster.process_index == 0:
    with open(out, "w") as f:
        json.dump({"losses": losses, "history": history.history, "params": h.hexdigest(),
                   "step": int(model.state.step), "devices": len(cluster.devices),
                   "processes": cluster.process_count}, f)
