"""SIGKILL a consumer of input workers at random moments and time how long its workers last.

    python tests/kill_harness.py ROUNDS SEED       # prints one JSON line per round

This process makes itself a child subreaper (Linux), so that processes orphaned by the killed
consumer are re-parented here and can be counted and reaped — including a worker or server
that was still starting when its consumer died. Run by tests/test_data_lifecycle.py.
"""

import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import psutil

CONSUMER = """
import time
import podkit as pk

def slow(x):
    time.sleep(0.002)
    return x

print("imported", flush=True)
it = iter(pk.data.Dataset.range(10**7).map(slow, num_parallel_calls=2).batch(4))
computing = False
for i, b in enumerate(it):
    if not computing and it.stats().worker_s > 0:
        computing = True
        print("workers", flush=True)
    if i % 20 == 0:
        print("batch", i, flush=True)
"""
# A server still importing watches its parent from a thread: on a loaded 2-core machine
# (the suite's other processes) that thread was once starved past 5 s, so allow 10.
GRACE_S = 10.0
PR_SET_CHILD_SUBREAPER = 36


def orphans() -> list[psutil.Process]:
    """Descendants re-parented to this process that are still running."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_for(said: list, line: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while line not in said:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def one_round(rng: random.Random, after: str) -> dict:
    """Kill at a random moment after the consumer said `after`: "imported" (its worker
    server and workers still starting) or "workers" (they compute)."""
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline().strip()
    if line != "imported":
        proc.kill()
        return {"error": f"consumer did not start: {line!r}"}
    said = [line]
    # Read on a thread: orphaned workers inherit the pipe, so it may not end with the consumer.
    threading.Thread(target=lambda: said.extend(x.strip() for x in proc.stdout),
                     daemon=True).start()
    if not wait_for(said, after):
        proc.kill()
        return {"error": f"consumer never said {after!r}: {said[-3:]}"}
    delay = rng.uniform(0.0, 2.0 if after == "imported" else 0.5)
    time.sleep(delay)
    try:
        below = [p.name() for p in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        below = []
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    last = said[-1]  # what it had said before it died
    killed = time.monotonic()
    seen = 0
    while True:
        reap()
        left = orphans()
        seen = max(seen, len(left))
        waited = time.monotonic() - killed
        if not left:
            return {"after": after, "delay_s": round(delay, 3), "last": last,
                    "below_at_kill": below, "gone_after_s": round(waited, 3)}
        if waited > GRACE_S:
            names = [p.name() for p in left]
            for p in left:
                p.kill()
            reap()
            return {"after": after, "delay_s": round(delay, 3), "last": last,
                    "below_at_kill": below, "gone_after_s": None, "alive": names}
        time.sleep(0.05)


def main() -> None:
    rounds, seed = int(sys.argv[1]), int(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    rng = random.Random(seed)
    for i in range(rounds):
        print(json.dumps(one_round(rng, "imported" if i % 2 == 0 else "workers")), flush=True)


if __name__ == "__main__":
    main()
