"""One process under `podkit launch` in tests/test_launch.py; argv: MODE DIR.

No JAX here (start-up in ~50 ms). Each mode plays one kind of process the supervisor must
handle; DIR holds the files the test and the process use to talk (pids, markers).
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

mode, out = sys.argv[1], Path(sys.argv[2])
index = int(os.environ["PODKIT_PROCESS_ID"])
count = int(os.environ["PODKIT_NUM_PROCESSES"])
restart = int(os.environ["PODKIT_RESTART"])


def forever():
    while True:
        signal.pause()


def mark(name, text=""):
    """Write a file atomically, so the test never reads half of one."""
    tmp = out / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(out / name)


if mode == "env":
    env = {k: v for k, v in os.environ.items() if k.startswith("PODKIT_")}
    print(json.dumps(env))
    print(f"stderr line of {index}", file=sys.stderr)
elif mode == "fail_once":
    print(f"restart {restart}")
    if index == 1 and not (out / "failed").exists():
        mark("failed")
        sys.exit(1)
elif mode == "always_fail":
    if index == 0:
        sys.exit(3)
    forever()  # stopped by the supervisor
elif mode == "pid":
    mark(f"pid-{restart}-{index}", str(os.getpid()))
    if restart == 0:
        forever()  # until the test kills one of us
elif mode == "stall":
    from podkit.launch.heartbeat import beat

    if index == 1 and restart == 0:
        for _ in range(4):
            beat()
            time.sleep(0.2)
        beat(force=True)
        # The file's own mtime (the kernel's coarse clock), the time the launcher judges by.
        mark("last_beat", repr(os.stat(os.environ["PODKIT_HEARTBEAT_FILE"]).st_mtime))
        forever()  # hung: no more beats
elif mode in ("term", "term_ignore"):
    def on_term(signum, frame):
        mark(f"term-{index}")  # "the final checkpoint"
        sys.exit(0)

    if mode == "term_ignore" and index == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    mark(f"ready-{index}", str(os.getpid()))
    forever()
elif mode in ("after", "after_quick"):
    # A training loop that beats, then work after it: forever ("after"), or briefly.
    from podkit.launch import heartbeat

    heartbeat.arm()  # what connect() does: beats from a thread, stacks on request
    heartbeat.set_run_dir(out / f"run-{index}")
    with heartbeat.loop("training") as hb:
        for _ in range(3):
            time.sleep(0.1)
            heartbeat.beat(force=True)
        hb.running()
    mark(f"trained-{index}", repr(time.time()))
    with heartbeat.phase("text sample"):
        if mode == "after" and index == 1:
            forever()
        time.sleep(0.5)
elif mode == "escape":
    # A helper that leaves the process group (its own session): killpg does not reach it.
    import subprocess

    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              start_new_session=True)
    mark(f"pid-{index}", str(os.getpid()))
    mark(f"helper-{index}", str(helper.pid))
    forever()
elif mode in ("flaky", "flaky_stays"):
    # Slot 1 fails at start while DIR/broken exists. Alone, the job "trains" until stopped
    # (SIGTERM: a final checkpoint, exit 0); in "flaky" its process removes the cause first
    # (the slot comes back), in "flaky_stays" the cause stays and the second shrunk attempt
    # finishes by itself.
    slot = int(os.environ["PODKIT_LAUNCH_SLOT"])
    mark(f"ran-{restart}-{index}", f"{slot} {os.environ['PODKIT_MAX_PROCESSES']}")
    if slot == 1 and (out / "broken").exists():
        sys.exit(1)
    if count == 1:
        if mode == "flaky":
            (out / "broken").unlink(missing_ok=True)
        elif restart >= 4:
            sys.exit(0)
        signal.signal(signal.SIGTERM, lambda s, f: (mark(f"term-{restart}"), sys.exit(0)))
        from podkit.launch import heartbeat

        heartbeat.arm()
        with heartbeat.loop("training"):  # the launcher's --grow-after clock starts here
            forever()
elif mode == "reshard":
    if count == 2 and index == 1:
        sys.exit(1)  # this slot is broken
    if count == 2:
        forever()  # waits for its peer, as a process in a collective would
    print(f"alone: process {index} of {count}")
else:
    sys.exit(f"unknown mode {mode}")
