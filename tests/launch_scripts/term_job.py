"""A podkit process for the SIGTERM tests (tests/test_termination.py); argv: MODE DIR.

    after_fit   connect, fit a small model (run_dir=DIR/run), then wait in phase "sleeping"
    blocked     connect, then block the main thread in native code (an XLA loop that never
                ends): the case where Python's own signal handler can never run
    thread      connect; the main thread sleeps while another thread is the one SIGTERM is
                delivered to (as the kernel may choose): it sends the signal to itself and
                prints `sent <time>`

Each prints `ready <process> <pid> <time>` when it reaches the waiting part.
"""

import os
import sys
import time

import podkit as pk

mode, out = sys.argv[1], sys.argv[2]
cluster = pk.connect(timeout_s=60)


def ready():
    print(f"ready {cluster.process_index} {os.getpid()} {time.time():.3f}", flush=True)


if mode == "after_fit":
    (x, y), _ = pk.datasets.load_digits()
    with pk.DataParallel().scope():
        model = pk.Sequential([pk.layers.Dense(16, activation="relu"),
                               pk.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x[:512], y[:512], batch_size=64, epochs=1, verbose=0, run_dir=f"{out}/run")
    with pk.launch.phase("sleeping"):
        ready()
        time.sleep(600)
elif mode == "blocked":
    import jax
    from jax import lax

    forever = jax.jit(lambda x: lax.while_loop(lambda c: c[0] != -1, lambda c: c + 2, x))
    ready()
    # Never returns: XLA:CPU may run it in this thread while dispatching, or JAX waits here.
    jax.block_until_ready(forever(jax.numpy.zeros((1,), jax.numpy.int32)))
elif mode == "thread":
    import signal
    import threading

    def deliver():
        time.sleep(0.5)  # the main thread is asleep in time.sleep by then
        print(f"sent {time.time():.3f}", flush=True)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    ready()
    threading.Thread(target=deliver).start()
    time.sleep(600)
else:
    sys.exit(f"unknown mode {mode}")
