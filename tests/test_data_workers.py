"""Input worker processes as users start them: from every kind of script, without a
`__main__` guard, with a lambda, a resume and a failing map — and the same elements whatever
the number of workers."""

import json
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import podkit as pk
from helpers import warm_workers

D = pk.data.Dataset

# One body for every form. Markers are built at run time so that an interactive session's echo
# of the source never counts as output; blocks end with a blank line for the REPL.
BODY = textwrap.dedent('''
    import json
    import time
    import numpy as np
    import podkit as pk

    print("TOP-LEVEL" + " RAN", flush=True)
    OFFSET = 5

    def augment(x):
        time.sleep(0.01)  # slow enough that the workers, not this process, compute most
        return np.full(2, x * 3 + OFFSET, np.int64)

    def fails_on_30(x):
        time.sleep(0.01)
        if x == 30:
            raise ValueError("cannot decode record 30")
        return x

    # Until the worker server is up, this process computes the first elements itself; wait
    # for it, so that what follows is the workers' work.
    warm = iter(pk.data.Dataset.range(10**6).map(abs, num_parallel_calls=1))
    while warm.stats().worker_s == 0:
        next(warm)

    warm.close()
    ds = (pk.data.Dataset.range(40).shuffle(40, seed=1)
          .map(lambda x: x + 1, num_parallel_calls=2)
          .map(augment, num_parallel_calls=2).batch(4))
    it = iter(ds)
    head = [next(it).tolist() for _ in range(3)]
    workers = it.stats().workers
    state = it.get_state()
    it.close()
    again = iter(ds)
    again.set_state(state)
    rest = [b.tolist() for b in again]
    error = None
    bad = iter(pk.data.Dataset.range(40).map(fails_on_30, num_parallel_calls=2))
    try:
        list(bad)
    except pk.DataError as e:
        error = str(e)

    print("@@" + "RESULT", json.dumps({"head": head, "rest": rest, "workers": workers,
                                      "error": error, "worker_s": [again.stats().worker_s,
                                                                   bad.stats().worker_s]}),
          flush=True)
''')

# What the headline complaint does: a flat script that trains from a worker-based pipeline.
FIT = textwrap.dedent('''
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    train = (pk.data.Dataset.from_tensor_slices((x, y))
             .map(lambda a, b: (a * 2, b), num_parallel_calls=2).batch(32))
    model = pk.Sequential([pk.layers.Dense(16, activation="relu"),
                           pk.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(train, epochs=2, verbose=0)
    print("@@" + "FIT", json.dumps(history.history["loss"]), flush=True)
''')


def expected():
    ds = (D.range(40).shuffle(40, seed=1).map(lambda x: x + 1)
          .map(lambda x: np.full(2, x * 3 + 5, np.int64)).batch(4))
    return [b.tolist() for b in ds._iterator(workers=False)]


def guarded(body):
    lines = body.strip().splitlines()
    cut = lines.index("warm = iter(pk.data.Dataset.range(10**6).map(abs, num_parallel_calls=1))")
    inner = textwrap.indent("\n".join(lines[cut:]), "    ")
    return "\n".join(lines[:cut]) + '\nif __name__ == "__main__":\n' + inner + "\n"


def run_interactive(source, timeout=240):
    """`python -i` on a terminal (a pty), the source typed in line by line."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-q", "-i"], stdin=slave, stdout=slave,
                            stderr=slave, start_new_session=True)
    os.close(slave)
    out = bytearray()
    pending = (source + "\nexit()\n").encode()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            writable = [master] if pending else []
            r, w, _ = select.select([master], writable, [], 0.5)
            if w:  # a line at a time: the terminal's input queue is small
                cut = pending.index(b"\n") + 1
                os.write(master, pending[:cut])
                pending = pending[cut:]
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the session ended
                    break
                if not chunk:
                    break
                out += chunk
        proc.wait(timeout=30)
    finally:
        proc.kill()
        os.close(master)
    return proc.returncode, out.decode(errors="replace")


def run_form(form, tmp_path):
    body = BODY + (FIT if form == "flat" else "")
    path = tmp_path / "job.py"
    path.write_text(guarded(body) if form == "guarded" else body)
    if form == "interactive":
        return run_interactive(body)
    args = {"guarded": [str(path)], "flat": [str(path)], "dash_c": ["-c", body],
            "stdin": ["-"]}[form]
    with open(path) as stdin:
        proc = subprocess.run([sys.executable, *args], stdin=stdin if form == "stdin" else None,
                              capture_output=True, text=True, timeout=240, cwd=tmp_path)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("form", ["guarded", "flat", "dash_c", "stdin", "interactive"])
def test_every_script_form_gets_the_same_elements_from_workers(form, tmp_path):
    code, out = run_form(form, tmp_path)
    assert code == 0, out[-3000:]
    assert out.count("TOP-LEVEL RAN") == 1, out[-3000:]  # workers never re-ran the script
    result = json.loads(out.split("@@RESULT", 1)[1].strip().splitlines()[0])
    want = expected()
    assert result["workers"] == 2
    assert result["head"] == want[:3]
    assert result["rest"] == want[3:]  # resumed exactly, in a new iterator
    assert all(s > 0 for s in result["worker_s"])  # the workers did compute
    assert "fails_on_30 raised ValueError: cannot decode record 30 on element 30" in result[
        "error"]
    assert re.search(r", in fails_on_30\n(.*\n)?ValueError: cannot decode record 30",
                     result["error"])  # the worker's own traceback
    if form in ("guarded", "flat"):  # the worker's traceback shows the user's source line
        assert re.search(r'job.py", line \d+, in fails_on_30\n    raise ValueError\(',
                         result["error"])
    noise = "\n".join(line for line in out.splitlines() if "@@RESULT" not in line)
    assert "leaked" not in noise and "Traceback" not in noise, noise[-3000:]
    if form == "flat":
        losses = json.loads(out.split("@@FIT", 1)[1].strip().splitlines()[0])
        assert len(losses) == 2 and all(np.isfinite(losses))


# -- the number of workers never changes the elements ------------------------------------------
def pipelines():
    """Built inside a function, so the functions reach the workers by value (a module-level
    function would make each new worker import this test module, pytest and all, first)."""
    def cube_plus(x):
        # Costly enough (~0.3 s a pipeline) that the workers take over from this process's
        # warm-up even on a loaded machine, where forking them can take 100 ms.
        time.sleep(0.004)
        return np.asarray([x, x ** 3], np.int64) + 1

    return {
        "map_batch": lambda b, p: D.range(103).shuffle(103, seed=2).map(
            cube_plus, num_parallel_calls=p).batch(b),
        "padded": lambda b, p: D.range(1, 80).map(
            lambda n: cube_plus(n)[: n % 3], num_parallel_calls=p).padded_batch(b),
        "repeat_then_filter": lambda b, p: D.range(37).map(
            cube_plus, num_parallel_calls=p).repeat(2).batch(b).filter(
            lambda v: v[0, 0] % 3 != 0),
        "dict_elements": lambda b, p: D.from_tensor_slices(
            {"a": np.arange(90.0), "b": np.arange(90) % 7}).map(
            lambda e: {"a": cube_plus(e["a"]), "b": e["b"]}, num_parallel_calls=p).batch(b, True),
    }


def elements_and_worker_s(ds):
    it = ds._iterator(workers=True)
    out = [[np.asarray(v).tolist() for v in pk.data.structure.leaves(e)] for e in it]
    return out, it.stats().worker_s


@pytest.mark.parametrize("name", ["map_batch", "padded", "repeat_then_filter", "dict_elements"])
def test_same_elements_with_0_1_and_3_workers_for_several_batch_sizes(name):
    warm_workers()
    make = pipelines()[name]
    for batch in (1, 7, 32):
        results = {}
        for workers in (None, 1, 3):
            results[workers], worker_s = elements_and_worker_s(make(batch, workers))
            assert (worker_s > 0) == (workers is not None), (name, batch, workers)
        assert results[None], name
        assert results[1] == results[None], (name, batch)
        assert results[3] == results[None], (name, batch)


def tenth_ms(x):
    end = time.perf_counter() + 1e-4
    while time.perf_counter() < end:
        pass
    return x


def test_autotune_decides_per_element_not_per_batch():
    from podkit.data.autotune import usable_cores

    decided = {}
    for batch in (1, 8, 64):
        with iter(D.range(50_000).map(tenth_ms, num_parallel_calls=pk.data.AUTOTUNE)
                  .batch(batch)) as it:
            next(it)
            decided[batch] = it.stats().workers
    assert len(set(decided.values())) == 1, decided  # the batch size changes nothing
    assert decided[8] == (usable_cores() if usable_cores() > 1 else 0)


def test_unordered_map_is_honoured_and_resumes_exactly():
    def uneven(x):
        time.sleep(0.3 if x == 150 else 0.001)  # element 150 is slow: others overtake it
        return x

    warm_workers()  # the worker server is up: this pipeline's workers start at once
    ds = D.range(300).map(uneven, num_parallel_calls=3, deterministic=False)
    it = ds._iterator()
    head = [int(next(it)) for _ in range(200)]
    assert 150 not in head[:160]  # overtaken: deterministic=False is honoured
    state = json.loads(json.dumps(it.get_state()))
    tail = [int(v) for v in it]
    assert sorted(head + tail) == list(range(300))  # each element exactly once
    for workers in (True, False):  # a resumed iterator gives exactly the rest
        again = ds._iterator(workers=workers)
        again.set_state(state)
        assert sorted(int(v) for v in again) == sorted(tail)
    ordered = [int(v) for v in D.range(300).map(uneven, num_parallel_calls=3)]
    assert ordered == list(range(300))


def test_bfloat16_elements_cross_from_workers_out_of_band():
    """numpy gives no out-of-band buffer for an extension dtype: a bfloat16 batch would be
    pickled in band and rebuilt element by element (a batch of 128 images: ~15 ms). The
    transfer sends its bytes as an unsigned view and views them back."""
    import ml_dtypes

    from podkit.data import transfer

    x = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3).astype(ml_dtypes.bfloat16)
    items = [(x, x[:, ::2], np.int64(7)), {"f8": x.astype(ml_dtypes.float8_e4m3fn)}]
    slot = transfer.Slot()
    layout, _ = transfer.pack(items, slot)
    assert layout["head"] < 1024 and len(layout["buffers"]) == 3  # every array out of band
    back = transfer.unpack(slot.map, layout)
    assert back[0][0].dtype == ml_dtypes.bfloat16 and back[1]["f8"].dtype == x.astype(
        ml_dtypes.float8_e4m3fn).dtype
    np.testing.assert_array_equal(back[0][0], x)
    np.testing.assert_array_equal(back[0][1], x[:, ::2])  # a strided view arrives contiguous
    np.testing.assert_array_equal(back[1]["f8"].astype(np.float32),
                                  x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    assert back[0][2] == 7


def _podkit_segments() -> int:
    """Shared-memory slots this process maps now (each is one memfd named podkit-input)."""
    with open("/proc/self/maps") as f:
        return sum("podkit-input" in line for line in f)


def _in_shared_memory(a) -> bool:
    """Whether an array's memory is a worker's shared-memory slot (its bases end in an mmap)."""
    import mmap

    obj = a
    while True:
        nxt = getattr(obj, "base", None) if isinstance(obj, np.ndarray) else getattr(
            obj, "obj", None)
        if nxt is None:
            return isinstance(obj, mmap.mmap)
        obj = nxt


def _slow_pair(i):
    """An image-sized array (2 MB) and a label, slow enough (30 ms) to be a chunk alone."""
    time.sleep(0.03)
    return np.full((512, 1024), i, np.float32), np.full(4, i)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc (Linux)")
def test_large_items_are_lent_as_views_held_intact_and_their_slots_come_back():
    """A chunk of one large item (a batch of images) is not copied out of its shared-memory
    slot: the consumer gets writable views of it (its small arrays copied), and the slot
    returns to its worker when they are dropped. Holding more items than the workers have
    slots neither stalls the pipeline nor lets a later item overwrite a held one; the slots
    made meanwhile are unmapped when the items go."""
    warm_workers()
    with iter(D.range(10**6).map(_slow_pair, num_parallel_calls=2)) as it:
        start = 0
        while it.stats().worker_s == 0:  # computed here while the workers start
            next(it)
            start += 1
        held = [next(it) for _ in range(30)]  # 30 held at once: 2 workers x 2 slots
        for i, (image, label) in enumerate(held, start):
            assert image[0, 0] == i and image[-1, -1] == i and label[0] == i, i
        assert all(_in_shared_memory(image) for image, _ in held)
        assert not any(_in_shared_memory(label) for _, label in held)
        assert held[-1][0].flags.writeable
        held[-1][0][:] = -1  # the consumer's own: later items are unaffected
        grown = _podkit_segments()
        del held, image, label
        seen, labels = [], []
        for i in range(start + 30, start + 80):  # each dropped before the next: slots reused
            image, label = next(it)
            assert image[0, 0] == i and image[-1, -1] == i and label[0] == i
            labels.append(label)  # a copy: keeping it keeps no slot
            del image
            seen.append(_podkit_segments())
    assert grown >= 30, grown  # holding the items took a slot each
    # and those went again: what is left is the workers' chunks in flight, not one per item
    assert max(seen[10:]) <= grown - 20 and seen[-1] <= seen[10], (grown, seen)
    assert [int(v[0]) for v in labels] == list(range(start + 30, start + 80))
