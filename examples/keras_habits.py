"""Keras habits on podkit: the functional API, logits, callbacks, evaluate, save and load.

    .venv/bin/python examples/keras_habits.py

A two-input model on the digits that ship with podkit (the top 6 rows of pixels and the bottom
2, as if they came from two sources), trained from logits with a warmup-cosine schedule, early
stopping and TensorBoard scalars, then saved and loaded on a different number of devices.
"""

import tempfile

import numpy as np

import podkit as pk

pk.connect(cpu_devices=4)
(x, y), (vx, vy) = pk.datasets.load_digits()
split = lambda a: {"top": a[:, :48], "bottom": a[:, 48:]}

top = pk.Input((48,), name="top")
bottom = pk.Input((16,), name="bottom")
h = pk.layers.Concatenate()([pk.layers.Dense(64, activation="relu")(top),
                             pk.layers.Dense(16, activation="relu")(bottom)])
h = pk.layers.Dropout(0.1)(h)
logits = pk.layers.Dense(10, name="digit")(h)  # no softmax: the loss takes logits

with pk.DataParallel().scope():
    model = pk.Model([top, bottom], logits)
    schedule = pk.optimizers.schedules.CosineDecay(
        0.0, decay_steps=800, warmup_target=3e-3, warmup_steps=100)
    model.compile(optimizer=pk.optimizers.AdamW(learning_rate=schedule),
                  loss=pk.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["acc", pk.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])

logs = tempfile.mkdtemp(prefix="podkit-example-")
model.fit(split(x), y, batch_size=64, epochs=30, validation_data=(split(vx), vy), verbose=2,
          callbacks=[pk.callbacks.EarlyStopping(monitor="val_acc", patience=4,
                                                restore_best_weights=True),
                     pk.callbacks.TensorBoard(f"{logs}/tensorboard")])
loss, acc, top2 = model.evaluate(split(vx), vy, verbose=0)
print(f"validation: loss {loss:.4f}, accuracy {acc:.4f}, top-2 {top2:.4f}")

model.save(f"{logs}/model")
one_device = pk.Strategy(mesh={"data": 1}, devices=pk.connect().devices[:1])
with one_device.scope():
    loaded = pk.models.load_model(f"{logs}/model")
same = np.array_equal(loaded.predict(split(vx), verbose=0), model.predict(split(vx), verbose=0))
print(f"saved on 4 devices, loaded on 1: identical predictions: {same}; files in {logs}")
