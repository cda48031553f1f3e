"""The seed model trained from a pk.data pipeline over ArrayRecord files, stopped and resumed.

    .venv/bin/python examples/data_pipeline.py

Writes the digits to ArrayRecord files, reads them back with decoding and augmentation in
worker processes (when AUTOTUNE finds them worth it), trains, and shows that an iterator
restored from its saved state continues with exactly the batch that comes next.
"""

import json
import tempfile

import numpy as np

import podkit as pk


def encode(x, y):
    return np.concatenate([x.astype(np.float32), [np.float32(y)]]).tobytes()


def decode_and_jitter(record):
    v = np.frombuffer(record, np.float32)
    x, y = v[:-1], np.int32(v[-1])
    rng = np.random.default_rng(int(v[:8].sum() * 1e4))  # the same jitter for the same record
    return np.clip(x + rng.normal(0, 0.02, x.shape).astype(np.float32), 0, 1), y


def pipeline(files):
    return (pk.data.ArrayRecordDataset(files)
            .shuffle(2000, seed=0)
            .map(decode_and_jitter, num_parallel_calls=pk.data.AUTOTUNE)
            .batch(32)
            .prefetch(pk.data.AUTOTUNE))


# A flat script, as with tf.data: no `if __name__ == "__main__":` guard is needed.
(x, y), (vx, vy) = pk.datasets.load_digits()
with tempfile.TemporaryDirectory() as tmp:
    records = pk.data.Dataset.from_sequence([encode(a, b) for a, b in zip(x, y, strict=True)])
    files = pk.data.write_array_record(records, f"{tmp}/digits", num_shards=4)

    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Dense(128, activation="relu"),
                               pk.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=9)
    model.fit(pipeline(files), epochs=10, validation_data=(vx, vy), verbose=2)

    it = iter(pipeline(files))
    for _ in range(5):
        next(it)
    state = json.dumps(it.get_state())  # what a checkpoint stores
    expected = next(it)[1]
    it.close()
    resumed = iter(pipeline(files))  # e.g. after a restart
    resumed.set_state(json.loads(state))
    assert (next(resumed)[1] == expected).all()
    resumed.close()
    print(f"resumed at batch 5 of {len(pipeline(files))}: same labels {expected[:8]}...")
