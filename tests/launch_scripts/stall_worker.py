"""A fit() whose loop stalls once (a callback sleeps past the watchdog's limit), under
`podkit launch`: its watchdog writes the stacks and the launcher names the process."""

import sys
import time

import numpy as np

import podkit as pk

pk.connect()


class StallOnce(pk.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 10:  # past the first steps (start-up work there can be slow too)
            time.sleep(5.0)


rng = np.random.default_rng(0)
x = rng.standard_normal((256, 4)).astype(np.float32)
y = rng.integers(0, 2, 256)
model = pk.Sequential([pk.layers.Dense(8, activation="relu"), pk.layers.Dense(2)])
model.compile(optimizer="sgd", loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=16, verbose=0, run_dir=sys.argv[1], watchdog=2.0,
          callbacks=[StallOnce()])
print("trained")
