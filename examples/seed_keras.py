"""The tf.distribute seed example, on podkit. Run: .venv/bin/python examples/seed_keras.py

TensorFlow wrote it as

    strategy = tf.distribute.MirroredStrategy()        # or TPUStrategy(resolver)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=20, validation_data=(x_val, y_val))
"""

import podkit as pk

pk.connect(cpu_devices=4)  # 4 virtual CPU devices; leave it out to use the devices you have
(x_train, y_train), (x_val, y_val) = pk.datasets.load_digits()

strategy = pk.DataParallel()
with strategy.scope():
    model = pk.Sequential([pk.layers.Dense(128, activation="relu"),
                           pk.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=8)
history = model.fit(x_train, y_train, batch_size=32, epochs=20,
                    validation_data=(x_val, y_val))
model.summary()
print("validation accuracy:", round(history.history["val_accuracy"][-1], 4))
