"""The reaper: a launcher's processes never outlive it, not even a SIGKILLed launcher.

A SIGKILLed process runs no clean-up, so the launcher cannot stop its own processes then
(under torchrun they run on, reparented to init, often hung in a collective). The launcher
starts this tiny process first, in a session of its own (so a kill of the launcher's process
group or a closed terminal does not reach it), and keeps the write end of a pipe to it:

    launcher                            reaper (python -I reaper.py LAUNCH_ID)
      "+<pgid>\n" after each start  ->  remembers the process group
      "-<pgid>\n" after each reap   ->  forgets it
      "exit\n", then close          ->  exits: the launcher cleaned up itself
      (killed: end of file)         ->  SIGKILLs every remembered group and every process
                                        whose environment carries PODKIT_LAUNCH_ID=LAUNCH_ID,
                                        three times 0.2 s apart, then exits

The environment scan (Linux /proc) catches what the process groups miss: a process started in
the instant between the launcher's fork and its "+" line, and helpers that left the group. The
kernel closes a dead process's pipes at once, so the processes die within milliseconds of
their launcher.

Only the standard library: this file runs as a script (`python -I`, no site-packages, no
podkit import, ~20 ms to start) and `Reaper` is the launcher's side.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ENV_LAUNCH_ID = "PODKIT_LAUNCH_ID"
ROUNDS, ROUND_GAP_S = 3, 0.2


class Reaper:
    """The launcher's side: start the reaper, tell it about process groups, stop it."""

    def __init__(self, launch_id: str) -> None:
        self.launch_id = launch_id
        self._proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), launch_id],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)

    def _send(self, line: str) -> None:
        try:
            self._proc.stdin.write(f"{line}\n".encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the reaper is gone (killed by hand): the launcher still cleans up itself

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """The launcher is done and cleaned up: the reaper leaves without killing."""
        self._send("exit")
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False


def _kill_all(groups: set[int], launch_id: str) -> None:
    entry = f"{ENV_LAUNCH_ID}={launch_id}".encode()
    me = os.getpid()
    for _ in range(ROUNDS):
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        if os.path.isdir("/proc"):
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) != me and _environ_has(int(name), entry):
                    try:
                        os.kill(int(name), signal.SIGKILL)
                    except OSError:
                        pass
        time.sleep(ROUND_GAP_S)


def main(launch_id: str) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the launcher's end of file ends the reaper
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip().decode()
        if line == "exit":
            return 0
        if line[:1] in "+-" and line[1:].isdigit():
            (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
    _kill_all(groups, launch_id)  # end of file without "exit": the launcher died
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
