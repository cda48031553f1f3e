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

D = pk.data.Dataset

# One body for every form. Markers are built at run time so that an interactive session's echo
# of the source never counts as output; blocks end with a blank line for the REPL.
BODY = textwrap.dedent('''
    import json
    import numpy as np
    import podkit as pk

    print("TOP-LEVEL" + " RAN", flush=True)
    OFFSET = 5

    def augment(x):
        return np.full(2, x * 3 + OFFSET, np.int64)

    def fails_on_7(x):
        if x == 7:
            raise ValueError("cannot decode record 7")
        return x

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
    try:
        list(pk.data.Dataset.range(20).map(fails_on_7, num_parallel_calls=2))
    except pk.DataError as e:
        error = str(e)

    print("@@" + "RESULT", json.dumps({"head": head, "rest": rest, "workers": workers,
                                      "error": error}), flush=True)
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
    cut = lines.index("ds = (pk.data.Dataset.range(40).shuffle(40, seed=1)")
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
    assert "fails_on_7 raised ValueError: cannot decode record 7 on element 7" in result[
        "error"]
    assert re.search(r", in fails_on_7\n(.*\n)?ValueError: cannot decode record 7",
                     result["error"])  # the worker's own traceback
    if form in ("guarded", "flat"):  # the worker's traceback shows the user's source line
        assert re.search(r'job.py", line 1\d, in fails_on_7\n    raise ValueError\(',
                         result["error"])
    noise = "\n".join(line for line in out.splitlines() if "@@RESULT" not in line)
    assert "leaked" not in noise and "Traceback" not in noise, noise[-3000:]
    if form == "flat":
        losses = json.loads(out.split("@@FIT", 1)[1].strip().splitlines()[0])
        assert len(losses) == 2 and all(np.isfinite(losses))


# -- the number of workers never changes the elements ------------------------------------------
def cube_plus(x):
    return np.asarray([x, x ** 3], np.int64) + 1


PIPELINES = {
    "map_batch": lambda b, p: D.range(103).shuffle(103, seed=2).map(
        cube_plus, num_parallel_calls=p).batch(b),
    "padded": lambda b, p: D.range(1, 50).map(
        lambda n: np.arange(n % 9), num_parallel_calls=p).padded_batch(b),
    "repeat_then_filter": lambda b, p: D.range(37).map(
        cube_plus, num_parallel_calls=p).repeat(2).batch(b).filter(lambda v: v[0, 0] % 3 != 0),
    "dict_elements": lambda b, p: D.from_tensor_slices(
        {"a": np.arange(60.0), "b": np.arange(60) % 7}).map(
        lambda e: {"a": e["a"] * 2, "b": e["b"]}, num_parallel_calls=p).batch(b, True),
}


def as_lists(ds):
    return [[np.asarray(v).tolist() for v in pk.data.structure.leaves(e)]
            for e in ds._iterator(workers=True)]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_same_elements_with_0_1_and_3_workers_for_several_batch_sizes(name):
    for batch in (1, 7, 32):
        results = {}
        for workers in (None, 1, 3):
            ds = PIPELINES[name](batch, workers)
            results[workers] = as_lists(ds)
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
        time.sleep(0.3 if x == 0 else 0.001)  # element 0 is slow: others overtake it
        return x

    ds = D.range(60).map(uneven, num_parallel_calls=3, deterministic=False)
    it = ds._iterator()
    head = [int(next(it)) for _ in range(20)]
    assert head[0] != 0 and 0 not in head[:3]  # out of order: deterministic=False honoured
    state = json.loads(json.dumps(it.get_state()))
    tail = [int(v) for v in it]
    assert sorted(head + tail) == list(range(60))  # each element exactly once
    for workers in (True, False):  # a resumed iterator gives exactly the rest
        again = ds._iterator(workers=workers)
        again.set_state(state)
        assert sorted(int(v) for v in again) == sorted(tail)
    ordered = [int(v) for v in D.range(60).map(uneven, num_parallel_calls=3)]
    assert ordered == list(range(60))
