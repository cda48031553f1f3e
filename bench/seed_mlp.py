"""Seed-model training throughput: podkit fit() against hand-written loops on equal terms,
measured in one process, contestants interleaved round by round.

    .venv/bin/python bench/seed_mlp.py                 # 1 CPU device
    .venv/bin/python bench/seed_mlp.py --devices 8     # DataParallel on 8 virtual devices

Model: Dense(128, relu) -> Dense(10, softmax), sparse categorical cross-entropy, Adam, batch 128,
60,000 synthetic 784-feature samples (a fixed linear teacher makes the labels learnable).
Every contestant is warmed up (compilation excluded), then each round times `--epochs` epochs
of every contestant in turn (odd rounds in reverse order); a ratio is taken within each
round (the machine's speed drifts between rounds, hitting both sides of a pair alike) and
the median over rounds is reported.

The pairings (every peer gets what podkit uses: the data on the device, donation):
  hand 1    a hand-written jax.jit + optax step, one step per call; the data staged on the
            device once, each call's row ids gathered there (podkit's feed does the same)
  podkit 1  fit() with compile(steps_per_execution=1)
  hand k    the same step in a lax.scan of k steps per call, (k, B) row ids per call
  podkit k  fit() with compile(steps_per_execution=k)
  podkit    fit() as a Keras user calls it: compile() without steps_per_execution ("auto":
            podkit chooses k, printed), against `hand 1` (target >= 1.2x)
  hand 1 (host batches)  the loop most people write: each batch cut on the host and put on
            the device per step (the issue's "hand jax.jit step per call")
  keras k   Keras 3 on the JAX backend when installed (`make bench-setup`), with
            compile(steps_per_execution=k) and its data staged on the device, each step's
            rows gathered there (a PyDataset: Keras's array input would cut every batch on
            the host); Keras runs the k steps as k jitted calls (its JAX trainer has no
            k-step program) and its gather as a call of its own
Also: `fit(epochs=1)` called again and again (a notebook's habit), the limit (a whole epoch as
one device call, 1 device only). k defaults to what "auto" chose, so the k pairing is the
default's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

N, D, C, B = 60_000, 784, 10, 128


def make_data(seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D), dtype=np.float32)
    teacher = rng.standard_normal((D, C), dtype=np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    return x, y


def _mlp_loss_and_opt():
    import jax
    import jax.numpy as jnp
    import optax

    glorot = jax.nn.initializers.glorot_uniform()

    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "w1": glorot(k1, (D, 128)), "b1": jnp.zeros(128),
            "w2": glorot(k2, (128, C)), "b2": jnp.zeros(C),
        }

    def loss_fn(p, xb, yb):
        h = jax.nn.relu(xb @ p["w1"] + p["b1"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"] + p["b2"], yb).mean()

    return init, loss_fn, optax.adam(1e-3, eps=1e-7)


class Podkit:
    """fit() over the arrays; `spe` None is compile()'s default ("auto")."""

    def __init__(self, x, y, spe, per_call=False):
        import podkit as pk

        self.x, self.y, self.per_call = x, y, per_call
        with pk.DataParallel().scope():
            self.model = pk.Sequential([pk.layers.Dense(128, activation="relu"),
                                        pk.layers.Dense(10, activation="softmax")])
            kwargs = {} if spe is None else {"steps_per_execution": spe}
            self.model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                               **kwargs)
        self.model.fit(x, y, batch_size=B, epochs=1, verbose=0)  # compiles

    def run(self, epochs: int) -> float:
        t = time.perf_counter()
        if self.per_call:  # one epoch per fit() call, as a notebook cell does
            for _ in range(epochs):
                self.model.fit(self.x, self.y, batch_size=B, epochs=1, verbose=0)
        else:
            self.model.fit(self.x, self.y, batch_size=B, epochs=epochs, verbose=0)
        return epochs * len(self.x) / (time.perf_counter() - t)


class Hand:
    """A hand-written loop over data staged on the devices: `k` steps per call (a lax.scan
    when k > 1; `k` None: the whole epoch as one call). Rows gathered on the devices from
    numpy row ids, each epoch's order a fresh permutation, every batch of the epoch run
    (the last one short, as podkit's is padded)."""

    def __init__(self, x, y, k):
        import jax
        import numpy as np
        import optax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        init, loss_fn, opt = _mlp_loss_and_opt()
        mesh = jax.make_mesh((len(jax.devices()),), ("data",), (jax.sharding.AxisType.Auto,))
        rep = NamedSharding(mesh, P())
        self.rows_sharding = NamedSharding(mesh, P("data") if k == 1 else P(None, "data"))

        def one(p, o, data, rows):
            loss, g = jax.value_and_grad(loss_fn)(p, data[0][rows], data[1][rows])
            u, o = opt.update(g, o, p)
            return optax.apply_updates(p, u), o, loss

        def steps(p, o, data, rows):  # rows (k, B)
            def body(carry, r):
                p, o, loss = one(*carry[:2], data, r)
                return (p, o, carry[2] + loss), None

            (p, o, total), _ = jax.lax.scan(body, (p, o, jax.numpy.zeros(())), rows)
            return p, o, total

        # One step per call is a plain jitted step over (B,) row ids, no scan around it.
        self.step = jax.jit(one if k == 1 else steps, donate_argnums=(0, 1))
        self.data = jax.device_put((x, y), rep)
        params = jax.jit(init, out_shardings=rep)(jax.random.key(0))
        self.state = [params, jax.jit(opt.init, out_shardings=rep)(params)]
        self.rng = np.random.default_rng(0)
        self.n, self.k = len(x), k
        self.serial = len(jax.devices()) > 1  # as podkit: see docs/benchmarks.md (8 devices)
        self.epoch()  # compiles (and the short last call's program)

    def epoch(self) -> None:
        import jax
        import numpy as np

        steps = -(-self.n // B)
        perm = self.rng.permutation(self.n).astype(np.int32)
        rows = [perm[i * B:(i + 1) * B] for i in range(steps)]
        rows[-1] = np.resize(rows[-1], B)  # the short last batch, filled (podkit pads it)
        rows = np.stack(rows)
        k = self.k or steps
        loss = None
        for s in range(0, steps, k):
            ids = rows[s] if k == 1 else rows[s:s + k]
            if self.serial:
                ids = jax.device_put(ids, self.rows_sharding)
            self.state[0], self.state[1], loss = self.step(*self.state, self.data, ids)
            if self.serial:
                loss.block_until_ready()
        loss.block_until_ready()

    def run(self, epochs: int) -> float:
        t = time.perf_counter()
        for _ in range(epochs):
            self.epoch()
        return epochs * self.n / (time.perf_counter() - t)


class HandHostBatches:
    """The hand-written loop most people write: one jitted step per call, each batch cut
    from the numpy arrays on the host and put on the devices (what the issue measured
    `fit()` at 0.91x against)."""

    def __init__(self, x, y):
        import jax
        import numpy as np
        import optax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        init, loss_fn, opt = _mlp_loss_and_opt()
        mesh = jax.make_mesh((len(jax.devices()),), ("data",), (jax.sharding.AxisType.Auto,))
        rep, self.batch = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

        def step(p, o, xb, yb):
            loss, g = jax.value_and_grad(loss_fn)(p, xb, yb)
            u, o = opt.update(g, o, p)
            return optax.apply_updates(p, u), o, loss

        self.step = jax.jit(step, donate_argnums=(0, 1))
        params = jax.jit(init, out_shardings=rep)(jax.random.key(0))
        self.state = [params, jax.jit(opt.init, out_shardings=rep)(params)]
        self.x, self.y, self.rng = x, y, np.random.default_rng(0)
        self.epoch()

    def epoch(self) -> None:
        import jax

        perm = self.rng.permutation(len(self.x))
        losses = []
        for i in range(len(self.x) // B):
            idx = perm[i * B:(i + 1) * B]
            xb, yb = jax.device_put((self.x[idx], self.y[idx]), self.batch)
            self.state[0], self.state[1], loss = self.step(*self.state, xb, yb)
            losses.append(loss)
            if len(losses) > 2:  # at most 2 in flight (8 CPU devices: XLA's rendezvous)
                losses.pop(0).block_until_ready()
        losses[-1].block_until_ready()

    def run(self, epochs: int) -> float:
        t = time.perf_counter()
        for _ in range(epochs):
            self.epoch()
        return epochs * (len(self.x) // B) * B / (time.perf_counter() - t)


class Keras:
    """Keras 3 on the JAX backend with what podkit uses: `compile(steps_per_execution=k)`
    and the data on the devices. Keras's array adapter turns jax arrays back into numpy and
    cuts each batch on the host (keras/src/trainers/data_adapters/array_slicing.py), so the
    data goes in as a `keras.utils.PyDataset` over data staged on the devices once: each
    step's rows gathered there from the epoch's permutation (as podkit's step and the hand
    loop gather theirs), the last batch filled as podkit pads it. Keras's train step takes a
    batch, so the gather is a jitted call of its own per step, where podkit's is inside its
    step (gathering a whole epoch's batches in one call per epoch was tried: on XLA:CPU its
    188 MB of fresh buffers each epoch made Keras slower than from numpy). Keras's JAX
    trainer runs its k steps per execution as k jitted calls from one Python loop
    (`_make_function`), not one device program: that is what Keras has, and all of it is
    used. Donation is Keras's own (its train step donates the state)."""

    def __init__(self, x, y, devices, k):
        os.environ["KERAS_BACKEND"] = "jax"
        import jax
        import keras
        import numpy as np
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        rng, n, steps = np.random.default_rng(0), len(x), -(-len(x) // B)
        # The batches where Keras's own step expects them: on one device the default
        # device's placement (batches on a 1-device mesh halved Keras's rate: its state is
        # not on that mesh); on several, the data layout of Keras's DataParallel.
        out = None
        data = jax.device_put((x, y))
        if devices > 1:  # Keras's DataParallel distribution on the same devices
            keras.distribution.set_distribution(keras.distribution.DataParallel())
            dist = keras.distribution.distribution()
            out = tuple(dist.get_data_layout(shape).backend_layout for shape in ((B, D), (B,)))
            data = jax.device_put((x, y), NamedSharding(out[0].mesh, P()))
        gather = jax.jit(lambda d, rows: (d[0][rows], d[1][rows]), out_shardings=out)

        class OnDevice(keras.utils.PyDataset):
            def __init__(self):
                super().__init__()  # workers=1, no multiprocessing: no enqueuer thread
                self.on_epoch_end()

            def __len__(self):
                return steps

            def __getitem__(self, i):
                return gather(data, self.rows[i])

            def on_epoch_end(self):  # the next epoch's order, (steps, B) row ids
                perm = rng.permutation(n).astype(np.int32)
                self.rows = np.resize(perm, steps * B).reshape(steps, B)

        self.n, self.data = n, OnDevice()
        self.model = keras.Sequential(
            [keras.Input((D,)), keras.layers.Dense(128, activation="relu"),
             keras.layers.Dense(10, activation="softmax")])
        self.model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                           steps_per_execution=k)
        self.model.fit(self.data, epochs=1, verbose=0)  # compiles

    def run(self, epochs: int) -> float:
        t = time.perf_counter()
        self.model.fit(self.data, epochs=epochs, verbose=0)
        return epochs * self.n / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2, help="epochs per contestant and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--spe", type=int, default=None,
                   help="k of the k-step pairing (default: what steps_per_execution='auto' "
                        "chooses)")
    p.add_argument("--no-keras", action="store_true")
    args = p.parse_args()
    import jax

    import podkit as pk

    pk.connect(cpu_devices=args.devices)
    x, y = make_data()
    print(f"seed MLP, {N:,} samples x {D} features, batch {B}, adam, {args.devices} CPU "
          f"device(s), {jax.__version__=}; one process, {args.rounds} rounds x "
          f"{args.epochs} epochs each", flush=True)
    contestants = {"podkit": Podkit(x, y, None)}
    auto = contestants["podkit"].model.steps_per_execution
    k = args.spe or auto
    print(f"steps_per_execution='auto' chose {auto}; k = {k}", flush=True)
    contestants.update({
        "hand 1": Hand(x, y, 1), "podkit 1": Podkit(x, y, 1),
        "hand 1 (host batches)": HandHostBatches(x, y),
        f"hand {k}": Hand(x, y, k), f"podkit {k}": Podkit(x, y, k),
        "podkit fit(epochs=1) calls": Podkit(x, y, None, per_call=True),
    })
    if args.devices == 1:
        contestants["limit"] = Hand(x, y, None)
    if not args.no_keras:
        try:
            contestants[f"keras {k}"] = Keras(x, y, args.devices, k)
        except ImportError:
            print("keras not installed (make bench-setup): no Keras row")
    rates: dict[str, list[float]] = {who: [] for who in contestants}
    for r in range(args.rounds):
        # Odd rounds run the contestants in reverse: each pair's order alternates, so what a
        # contestant leaves behind (caches, the allocator, the CPU's clock) favours neither.
        order = list(contestants) if r % 2 == 0 else list(contestants)[::-1]
        for who in order:
            rates[who].append(contestants[who].run(args.epochs))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{who} {v[-1]:,.0f}" for who, v in rates.items()), flush=True)

    def ratio(a: str, b: str) -> str:
        each = [u / v for u, v in zip(rates[a], rates[b], strict=True)]
        return (f"{statistics.median(each):.2f}x (rounds {min(each):.2f}-{max(each):.2f})")

    print(f"\n{'contestant':42s} {'median samples/s':>17s} {'best':>10s}")
    for who, v in rates.items():
        label = f"podkit (compile() default: auto, k={auto})" if who == "podkit" else who
        print(f"{label:42s} {statistics.median(v):>17,.0f} {max(v):>10,.0f}")
    print("\nratios (per round, median):")
    print(f"  podkit 1 / hand 1         {ratio('podkit 1', 'hand 1')}   target >= 1.0x")
    print(f"  podkit {k} / hand {k}{' ' * (17 - 2 * len(str(k)))}"
          f"{ratio(f'podkit {k}', f'hand {k}')}   target >= 1.0x")
    print(f"  podkit (auto) / hand 1    {ratio('podkit', 'hand 1')}   target >= 1.2x")
    print(f"  podkit (auto) / hand 1 (host batches) "
          f"{ratio('podkit', 'hand 1 (host batches)')}")
    print(f"  podkit 1 / hand 1 (host batches)      "
          f"{ratio('podkit 1', 'hand 1 (host batches)')}")
    print(f"  podkit (auto) / hand {k}{' ' * (4 - len(str(k)))}    "
          f"{ratio('podkit', f'hand {k}')}")
    if "limit" in rates:
        print(f"  podkit (auto) / limit     {ratio('podkit', 'limit')}")
        print(f"  fit(epochs=1) calls / limit {ratio('podkit fit(epochs=1) calls', 'limit')}")
    if f"keras {k}" in rates:
        print(f"  podkit (auto) / keras {k}{' ' * (4 - len(str(k)))}   "
              f"{ratio('podkit', f'keras {k}')}   (Keras: {k} steps per execution, each a "
              "jitted call of its own, and a gather call per step from data on the device)")


if __name__ == "__main__":
    main()
