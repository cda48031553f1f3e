"""The supervisor behind `podkit launch`: start N processes of a job, watch them, restart.

Over 500 lines on purpose: one state machine (start, watch, judge a hang, collect stacks, stop,
restart, preempt) whose steps share the children, their output pumps and the event record;
split further, that state would be passed between modules. Its flags and their checks are in
`options.py`, the process that outlives a SIGKILLed supervisor in `reaper.py`.

One machine, N processes of one command, joined by podkit's PODKIT_* variables (see
`podkit.cluster.connect`). The job is restarted as a whole group on any failure because a JAX
multi-controller job cannot lose a process and go on: the survivors wait in the next
collective. What a failure is:

- a process exits non-zero or is killed by a signal (a process that exits 0 while the others
  run is fine: it has finished its part);
- a hung process, judged by its heartbeat file (PODKIT_HEARTBEAT_FILE, see `heartbeat.py`)
  from its start to its exit: while it starts up or runs a loop (fit, evaluate, predict), a
  file older than `heartbeat_timeout` seconds; once it has left its last loop, still running
  `exit_timeout` seconds after that (the work after training, such as a text sample or a final
  save, must end). The check is armed by a process's first heartbeat, so a command that never
  beats is never judged by heartbeat; `startup_timeout`, when set, bounds the time to that
  first beat (off by default: start-up may include a long first compilation). Before a hung
  process is stopped it writes every thread's stack (faulthandler, on SIGUSR1) and the
  supervisor copies them into the run directory the process reported
  (`RUN_DIR/stacks-p{index}-r{restart}.txt`), or prints them when it reported none.

On a failure the others are stopped (SIGTERM to each process group, SIGKILL after
`stop_timeout`), the supervisor waits `backoff * 2**k` seconds (capped at 30 s; k counts the
failures in a row of attempts that ran less than `backoff_reset` seconds) and starts the
group again with a fresh coordinator port. Each failure is charged to the slot (the process
index of the first start, PODKIT_LAUNCH_SLOT) of the process that failed first. Without
`min_processes` below `processes`, the group is restarted up to `max_restarts` times in all.
Elastic (`min_processes` K < N, torchrun's min:max): `max_restarts` is each slot's budget
instead: a slot that has failed more than `max_restarts` times is dropped and the job goes on
with the remaining slots (renumbered 0..n-1; a job that checkpoints through podkit resumes onto
any number of processes with the same global batch, see podkit.elastic), as long as at least K
remain; a failure that would drop a slot below K ends the launch. A slot fails at most
max_restarts + 1 times before it is dropped, so an elastic launch ends too. Grow back: once a
shrunk job has trained `grow_after` seconds (from its process 0's entering its first loop, by
its heartbeat status: a command that reports no loop is not grown back), the supervisor stops
it as on a preemption (SIGTERM: a final checkpoint, exit 0) and starts the full N again from
that checkpoint; a dropped slot that fails again in that attempt is dropped again at once and
the next try waits twice as long. Children get PODKIT_MAX_PROCESSES = N, so a shrunk job knows
the size its batch was set for.

SIGTERM or SIGINT (or SIGHUP) to the supervisor is a preemption: SIGTERM goes to every
process, which writes its final checkpoint and exits 0 when it is training with checkpoints,
and exits 143 otherwise (podkit.termination); after `grace` seconds what is left gets SIGKILL.
No restart follows. A second SIGINT (Ctrl-C twice) skips the rest of the grace. The exit code
is 0 when every process exited 0 or 143, else 1; a preemption between attempts (during a
backoff) is 1, as no process wrote a checkpoint for it.

Signals go to each process's process group (every process leads its own session), so a shell
wrapper's children or a process's helpers are reached too, and at the end of every attempt the
groups get SIGKILL so nothing of an attempt outlives it. A SIGKILLed supervisor cannot do this
itself: its reaper (`reaper.py`, a process in a session of its own that holds a pipe from the
supervisor) sees the pipe close and SIGKILLs every process of the job within milliseconds.

Children get the supervisor's environment plus PODKIT_COORDINATOR, PODKIT_NUM_PROCESSES,
PODKIT_PROCESS_ID, PODKIT_LAUNCH_SLOT, PODKIT_MAX_PROCESSES, PODKIT_CPU_DEVICES (with
cpu_devices_per_process), PODKIT_RESTART (0 on the first start), PODKIT_HEARTBEAT_FILE and
PODKIT_LAUNCH_ID (one per launch: how the reaper recognizes the job's processes), and
PYTHONUNBUFFERED=1 unless it is set: output passes through pipes, and a Python child would
otherwise print in 8 KB blocks (the price: print() is then two writes, text and newline, and a
line that C code or another thread writes at that moment can land between them; seen with
gloo's start-up lines). Each output line is prefixed with `[i] ` (stdout to stdout, stderr to
stderr); the supervisor's own lines start with `podkit launch: ` on stderr.

What is shown by default: process 0's stdout, and every process's stderr (so an error or a
traceback of any process is never lost). The other processes' stdout is read and dropped:
in a data-parallel job they print what process 0 prints. Library noise (`NOISE`: gloo's
"[Gloo] Rank N is connected to M peer ranks..." lines) is dropped from every stream, also where
it landed inside another line and where another write landed inside it: the noise is cut out
and the text around it, the first half of a print() that it interrupted, joins the rest of its
line. `--all-output` (`all_output`) shows every process's stdout and the noise, each piece cut
out and shown on a line of its own, after the `[i] ` of its process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import IO, Any

from podkit.elastic import ENV_MAX_PROCESSES  # the launch's full size
from podkit.heartbeat import ENV_HEARTBEAT_FILE, STACKS_SIGNAL, read_status
from podkit.launch.options import LaunchConfig
from podkit.launch.reaper import ENV_LAUNCH_ID, Reaper
from podkit.termination import EXIT_CODE as SIGTERM_EXIT

ENV_RESTART = "PODKIT_RESTART"
ENV_SLOT = "PODKIT_LAUNCH_SLOT"  # the process index of the first start: a slot's identity
MAX_BACKOFF_S = 30.0
POLL_S = 0.05
"""How often the supervisor looks at its processes: the bound on detection latency for exits;
heartbeat staleness is detected within this of the timeout."""
NOISE = re.compile(
    rb"\[Gloo\] Rank (?P<rank>\d*) ?is connected to \d* ?peer ranks\. ?"
    rb"(?:Expected number of connected peer ranks is : (?P<expect>\d*))?\n?"  # the whole line
    rb"|(?:^(?P<found>\d+) )? ?is connected to \d* ?peer ranks\. ?"  # its middle, cut from its head
    rb"|Expected number of connected peer ranks is : (?P<tail>\d*)\n?"  # its tail
    rb"|\[Gloo\] Rank (?P<head>\d*)")  # its head, cut from the rest
"""Lines libraries write that say nothing a user acts on (gloo's "[Gloo] Rank R is connected
to N peer ranks. Expected number of connected peer ranks is : N", one per process at start),
matched anywhere in a line, whole or in pieces: C++ writes each piece of it apart, so another
thread's write (a print(), or gloo's other thread's line) can land between two pieces (seen:
"[Gloo] Rank " + print + "0 is connected ..."; "[Gloo] Rank " + a whole line + " is
connected ..." + "0" + print). Dropped unless `all_output`.

A number split off its line is the one piece that cannot be told from text: a stream that
saw a gloo line without one of its numbers owes it (`_cut_noise`'s third value), and the next
line, if it starts with digits glued to a word or alone ("0process ...", "1"), pays it
(`_pay_rank`). `connect()` makes a process write whole lines (podkit/console.py), so its
print()s and gloo's pieces no longer mix; the pieces of gloo's two threads still can."""
_STRAY_RANK = re.compile(rb"\d+(?=[^\d ]|$)")


def _cut_noise(line: bytes) -> tuple[bytes, list[bytes], int]:
    """`line` without the NOISE in it; the noise cut out (adjacent pieces joined, each ending
    in a newline); and the numbers this line's gloo pieces lack (a rank, or the expected
    count; negative: found a rank a piece before it lacked)."""
    noise: list[bytes] = []
    kept: list[bytes] = []
    owed = end = 0
    for m in NOISE.finditer(line):
        kept.append(line[end:m.start()])
        if noise and m.start() == end and not noise[-1].endswith(b"\n"):
            noise[-1] += m.group()  # the next piece of the same gloo line
        else:
            noise.append(m.group())
        end = m.end()
        owed += sum(m.group(slot) == b"" for slot in ("rank", "head", "expect", "tail"))
        owed -= bool(m.group("found"))
    if not noise:
        return line, [], 0
    kept.append(line[end:])
    return b"".join(kept), [n if n.endswith(b"\n") else n + b"\n" for n in noise], owed


def _pay_rank(line: bytes) -> tuple[bytes, bool]:
    """`line` without a gloo rank number glued to its start, and whether it had one."""
    m = _STRAY_RANK.match(line)
    return (line[m.end():], True) if m else (line, False)


@dataclasses.dataclass
class _Failure:
    process: int
    kind: str  # exit | signal | heartbeat | exit_timeout | startup
    reason: str
    exit_code: int | None = None
    signal: str | None = None
    silent_s: float | None = None
    phase: str | None = None  # what a hung process said it was doing
    stacks: str | None = None  # where its threads' stacks were written


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _free_port() -> int:
    """A port nothing listens on right now; chosen again for every start, so a coordinator
    port held by a dying process of the previous attempt never blocks the next one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Child:
    """One process of the group, its process group and the threads that prefix its output."""

    def __init__(self, index: int, popen: subprocess.Popen, heartbeat: str) -> None:
        self.index = index
        self.popen = popen
        self.heartbeat = heartbeat
        self.started = time.monotonic()
        self.readers: list[threading.Thread] = []
        self.status: dict[str, Any] = {}  # what the process last wrote (heartbeat.py)
        self.stall_reported: Any = None  # the watchdog's stall last named (heartbeat.py)
        self._status_mtime: int | None = None

    def last_beat(self) -> float | None:
        """The heartbeat file's modification time (Unix time), None before the first beat;
        reads the status again when the file changed."""
        try:
            st = os.stat(self.heartbeat)
        except FileNotFoundError:
            return None
        if st.st_mtime_ns != self._status_mtime:
            self._status_mtime = st.st_mtime_ns
            self.status = read_status(self.heartbeat) or self.status
        return st.st_mtime

    def signal_group(self, sig: int) -> None:
        """Signal the child's whole process group (it leads its own session): a shell wrapper
        or the child's own helpers go too."""
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class Supervisor:
    """Runs one launch: `Supervisor(LaunchConfig(...)).run()` returns the exit code.

    `events` records what happened, in order, as dicts with at least `event` (start, failure,
    stopped, restart, reshard, preempt, exit), `time` (Unix time) and `elapsed` (seconds since
    `run()` began, monotonic); `config.events_file` receives the same records as JSON lines,
    written as they happen.
    """

    def __init__(
        self,
        config: LaunchConfig,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.events: list[dict[str, Any]] = []
        self._stdout = stdout
        self._stderr = stderr
        self._write_lock = threading.Lock()
        self._t0 = time.monotonic()
        self._preempt_signal: int | None = None
        self._hurry = False  # a second SIGINT: kill now
        self._events_fh: IO[str] | None = None
        self._children: list[_Child] = []  # the current attempt's, for the last-resort clean-up
        self._launch_id = uuid.uuid4().hex
        self._reaper: Reaper | None = None
        self._restart = 0

    # -- public --------------------------------------------------------------------------------

    def preempt(self, sig: int = signal.SIGTERM) -> None:
        """Ask the running launch to stop as on a preemption (safe from any thread)."""
        if self._preempt_signal is None:
            self._preempt_signal = sig
        elif sig == signal.SIGINT:
            self._hurry = True

    def run(self) -> int:
        """Start, supervise and restart the group; return 0 when every process exited 0."""
        c = self.config
        self._t0 = time.monotonic()
        if c.events_file:
            self._events_fh = open(c.events_file, "w", encoding="utf-8")
        workdir = tempfile.mkdtemp(prefix="podkit-launch-")
        restore = self._install_signal_handlers()
        self._reaper = Reaper(self._launch_id)  # first: nothing starts before it watches
        try:
            return self._supervise(workdir)
        finally:
            if any(ch.popen.poll() is None for ch in self._children):  # only after a bug
                self._kill_rest(self._children)
            self._reaper.close()
            for sig, handler in restore.items():
                signal.signal(sig, handler)
            shutil.rmtree(workdir, ignore_errors=True)
            if self._events_fh is not None:
                self._events_fh.close()
                self._events_fh = None

    # -- the loop ------------------------------------------------------------------------------

    def _supervise(self, workdir: str) -> int:
        c = self.config
        elastic = c.min_processes is not None and c.min_processes < c.processes
        minimum = c.min_processes if c.min_processes is not None else c.processes
        slots = list(range(c.processes))  # the slot each process index runs in
        failures = dict.fromkeys(slots, 0)  # per slot (elastic), charged to the first to fail
        grow_wait = c.grow_after
        probing: list[int] = []  # dropped slots taken back for this attempt
        restarts = 0
        quick = 0  # failures in a row of attempts shorter than --backoff-reset: the doubling
        last: _Failure | None = None
        while True:
            processes = len(slots)
            if self._preempt_signal is not None:  # between attempts: nothing runs
                sig = _signal_name(self._preempt_signal)
                self._record("preempt", signal=sig, processes=0)
                why = f"; the last failure: {last.reason}" if last else ""
                self._say(f"{sig} received between attempts; not restarting{why}")
                return self._exit(1, f"preempted by {sig} before restart {restarts}{why}")
            started = time.monotonic()
            try:
                children = self._start(slots, restarts, workdir)
            except OSError as e:  # the checks passed but exec failed: no point retrying
                reason = f"could not start `{shlex.join(c.command)}`: {e}"
                self._say(reason)
                return self._exit(2, reason)
            grow = grow_wait if elastic and processes < c.processes and grow_wait else None
            outcome = self._watch(children, grow)
            if outcome == "ok":
                self._say(f"all {processes} processes exited 0")
                return self._exit(0, "all processes exited 0")
            if outcome == "preempted":
                return self._finish_preemption(children)
            if outcome == "grow":
                back = sorted(set(range(c.processes)) - set(slots))
                self._say(f"the job ran {grow:g}s on {processes} of {c.processes} processes "
                          f"(--grow-after {c.grow_after:g}); stopping it with a checkpoint to "
                          f"try slot(s) {', '.join(map(str, back))} again")
                if self._stop_to_grow(children) == "ok":
                    self._say(f"all {processes} processes exited 0")
                    return self._exit(0, "all processes exited 0")
                probing, slots = back, list(range(c.processes))
                self._record("grow", processes=c.processes, previous=processes, slots=back)
                restarts += 1
                self._record("restart", restart=restarts, backoff_s=0.0)
                continue
            failure: _Failure = outcome
            last = failure
            slot = slots[failure.process]
            failure.reason += f" (slot {slot})" if slot != failure.process else ""
            self._say(f"{failure.reason}; stopping the group")
            if failure.kind in ("heartbeat", "exit_timeout"):
                failure.stacks = self._collect_stacks(children[failure.process])
            self._record("failure", restart=restarts, slot=slot, processes=processes,
                         **dataclasses.asdict(failure))
            t_stop = time.monotonic()
            self._stop_group(children, c.stop_timeout)
            self._record("stopped", restart=restarts, stop_s=round(time.monotonic() - t_stop, 3))
            failures[slot] += 1
            if probing and slot in probing:  # it failed again when taken back
                grow_wait *= 2
                failures[slot] = max(failures[slot], c.max_restarts + 1)
            probing = []
            if not elastic and restarts >= c.max_restarts:
                self._say(f"giving up after {restarts} restart(s) (--max-restarts "
                          f"{c.max_restarts}); the last failure: {failure.reason}")
                return self._exit(1, failure.reason)
            if elastic and failures[slot] > c.max_restarts:
                if processes <= minimum:
                    self._say(f"slot {slot} failed {failures[slot]} times (--max-restarts "
                              f"{c.max_restarts}) and {processes} process(es) is "
                              f"--min-processes {minimum}: giving up; the last failure: "
                              f"{failure.reason}")
                    return self._exit(1, failure.reason)
                slots.remove(slot)
                self._say(f"slot {slot} failed {failures[slot]} times (more than --max-restarts "
                          f"{c.max_restarts}): dropping it; the job resumes on "
                          f"{processes - 1} of {c.processes} processes (--min-processes "
                          f"{minimum}); the full count is tried again after "
                          f"{grow_wait:g}s of training (--grow-after)")
                self._record("reshard", processes=processes - 1, previous=processes,
                             process=failure.process, slot=slot, failures=failures[slot])
            restarts += 1
            # A job that trained a while before it failed is no crash loop: its restart waits
            # --backoff again, not a wait doubled by failures hours apart.
            quick = quick + 1 if time.monotonic() - started < c.backoff_reset else 1
            delay = min(c.backoff * 2 ** (quick - 1), MAX_BACKOFF_S)
            budget = (f" of {c.max_restarts}" if not elastic else
                      f" (slot {slot}: {failures[slot]} failure(s) of {c.max_restarts + 1} "
                      "allowed)" if slot in slots else "")
            self._say(f"restart {restarts}{budget} in {delay:g} s")
            self._sleep(delay)
            if self._preempt_signal is None:
                self._record("restart", restart=restarts, backoff_s=delay)

    def _stop_to_grow(self, children: list[_Child]) -> str:
        """Stop a shrunk job as a preemption does (SIGTERM: every process saves a final
        checkpoint and exits 0); "ok" when it had finished by itself meanwhile."""
        c = self.config
        if all(ch.popen.poll() == 0 for ch in children):
            return "ok"
        t_stop = time.monotonic()
        for ch in children:
            if ch.popen.poll() is None:
                ch.signal_group(signal.SIGTERM)
        self._wait_all(children, c.grace)
        self._kill_rest(children)
        codes = sorted({ch.popen.returncode for ch in children})
        self._record("stopped", restart=self._restart, stop_s=round(time.monotonic() - t_stop, 3),
                     codes=codes, why="grow")
        return "stopped"

    def _start(self, slots: list[int], restart: int, workdir: str) -> list[_Child]:
        c = self.config
        processes = len(slots)
        coordinator = f"127.0.0.1:{_free_port()}"
        base = dict(os.environ)
        base.setdefault("PYTHONUNBUFFERED", "1")  # a Python child's lines appear as printed
        base.update(
            PODKIT_COORDINATOR=coordinator,
            PODKIT_NUM_PROCESSES=str(processes),
            **{ENV_RESTART: str(restart), ENV_LAUNCH_ID: self._launch_id,
               ENV_MAX_PROCESSES: str(c.processes)},
        )
        self._restart = restart
        if c.cpu_devices_per_process is not None:
            base["PODKIT_CPU_DEVICES"] = str(c.cpu_devices_per_process)
        children: list[_Child] = []
        try:
            for index in range(processes):
                heartbeat = os.path.join(workdir, f"heartbeat-r{restart}-p{index}")
                env = {**base, "PODKIT_PROCESS_ID": str(index), ENV_SLOT: str(slots[index]),
                       ENV_HEARTBEAT_FILE: heartbeat}
                popen = subprocess.Popen(
                    list(c.command), env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                )
                self._reaper.watch(popen.pid)  # its process group: it leads its session
                child = _Child(index, popen, heartbeat)
                for pipe, stream, show in (
                        (popen.stdout, self._out(), index == 0 or c.all_output),
                        (popen.stderr, self._err(), True)):
                    t = threading.Thread(target=self._pump, args=(index, pipe, stream, show),
                                         name=f"podkit-launch-out-{index}", daemon=True)
                    t.start()
                    child.readers.append(t)
                children.append(child)
        except OSError:
            self._stop_group(children, 0)
            raise
        finally:
            self._children = children
        shown = ("; stdout is shown from process 0 only (--all-output: from every process)"
                 if processes > 1 and restart == 0 and not c.all_output else "")
        of = f" of {c.processes} (slots {', '.join(map(str, slots))})" \
            if processes < c.processes else ""
        self._say(f"started {processes}{of} process(es) of `{shlex.join(c.command)}` (restart "
                  f"{restart}, coordinator {coordinator}){shown}")
        self._record("start", restart=restart, processes=processes, slots=list(slots),
                     coordinator=coordinator, pids=[ch.popen.pid for ch in children])
        return children

    def _watch(self, children: list[_Child], grow: float | None = None) -> _Failure | str:
        """Poll until every process exited 0 ("ok"), a failure, a preemption, or ("grow") the
        job trained `grow` seconds (from process 0's entering its first loop: its heartbeat
        status names a phase other than "starting"; see the module docstring)."""
        since = None
        while True:
            if self._preempt_signal is not None:
                return "preempted"
            if grow is not None and since is None and children[0].last_beat() is not None \
                    and children[0].status.get("phase") not in (None, "starting"):
                since = time.monotonic()  # the clock starts in its loop
            if since is not None and time.monotonic() - since >= grow:
                return "grow"
            done = 0
            for ch in children:
                code = ch.popen.poll()
                if code == 0:
                    done += 1
                    continue
                if code is not None:
                    return self._exit_failure(ch.index, code)
                self._report_stall(ch)
                hung = self._hung(ch)
                if hung is not None:
                    return hung
            if done == len(children):
                self._join_readers(children)
                return "ok"
            time.sleep(POLL_S)

    def _report_stall(self, ch: _Child) -> None:
        """Name a process whose watchdog saw no step complete (once per stall)."""
        stall = ch.status.get("stalled")
        if stall == ch.stall_reported:
            return
        ch.stall_reported = stall
        if isinstance(stall, dict):
            where = f"; its stacks: {stall['file']}" if stall.get("file") else ""
            self._say(f"process {ch.index} stalled: no step completed for "
                      f"{stall.get('silent_s')}s after step {stall.get('step')}{where}")
            self._record("stall", process=ch.index, **{k: stall.get(k) for k in
                                                       ("step", "silent_s", "file")})

    def _hung(self, ch: _Child) -> _Failure | None:
        """The failure a running process is in by its heartbeat file, if any."""
        c = self.config
        last = ch.last_beat()
        now = time.time()
        if last is None:
            waited = time.monotonic() - ch.started
            if c.startup_timeout is not None and waited > c.startup_timeout:
                return _Failure(
                    ch.index, "startup",
                    f"process {ch.index} sent no heartbeat within --startup-timeout "
                    f"{c.startup_timeout:g}s of its start", silent_s=round(waited, 3))
            return None
        phase = ch.status.get("phase")
        if ch.status.get("watch") == "exit" and ch.status.get("since") is not None:
            after = now - float(ch.status["since"])
            if after > c.exit_timeout:
                return _Failure(
                    ch.index, "exit_timeout",
                    f"process {ch.index} is hung in phase {phase!r}: still running {after:.1f}s "
                    f"after its last loop ended (--exit-timeout {c.exit_timeout:g})",
                    silent_s=round(after, 3), phase=phase)
        elif now - last > c.heartbeat_timeout:
            silent = now - last
            where = f" in phase {phase!r}" if phase else ""
            return _Failure(
                ch.index, "heartbeat",
                f"process {ch.index} sent no heartbeat for {silent:.1f}s "
                f"(--heartbeat-timeout {c.heartbeat_timeout:g}){where}",
                silent_s=round(silent, 3), phase=phase)
        return None

    def _collect_stacks(self, ch: _Child) -> str | None:
        """Have a hung process write every thread's stack (faulthandler) and put them in its
        run directory, or print them when it named none. Returns where they went."""
        stacks, pid = ch.status.get("stacks"), ch.status.get("pid")
        if not stacks or not isinstance(pid, int):
            return None
        try:  # only a process of this child's group: never a stranger with a reused pid
            if os.getpgid(pid) != ch.popen.pid:
                return None
            before = os.path.getsize(stacks)
            os.kill(pid, STACKS_SIGNAL)
        except OSError:
            return None
        deadline, size, stable = time.monotonic() + 2.0, before, 0
        while time.monotonic() < deadline and stable < 3:  # written at once, in the handler
            time.sleep(POLL_S)
            now = os.path.getsize(stacks) if os.path.exists(stacks) else size
            stable = stable + 1 if now == size and now > before else 0
            size = now
        with open(stacks, "rb") as f:
            f.seek(before)
            text = f.read().decode("utf-8", "replace")
        if not text.strip():
            return None
        run_dir = ch.status.get("run_dir")
        if run_dir:
            target = os.path.join(run_dir, f"stacks-p{ch.index}-r{self._restart}.txt")
            try:
                os.makedirs(run_dir, exist_ok=True)
                with open(target, "w", encoding="utf-8") as f:
                    f.write(text)
                self._say(f"process {ch.index}'s thread stacks: {target}")
                return target
            except OSError as e:
                self._say(f"could not write {target} ({e}); the stacks follow")
        self._write(self._err(), "".join(f"[{ch.index}] {line}\n"
                                         for line in text.splitlines()).encode())
        return "stderr"

    @staticmethod
    def _exit_failure(index: int, code: int) -> _Failure:
        if code < 0:
            name = _signal_name(-code)
            return _Failure(index, "signal", f"process {index} was killed by {name}",
                            signal=name)
        return _Failure(index, "exit", f"process {index} exited with code {code}",
                        exit_code=code)

    def _stop_group(self, children: list[_Child], timeout: float) -> None:
        """SIGTERM every process group, SIGKILL what is left after `timeout`, reap all."""
        for ch in children:
            if ch.popen.poll() is None:
                ch.signal_group(signal.SIGTERM)
        self._wait_all(children, timeout)
        self._kill_rest(children)

    def _wait_all(self, children: list[_Child], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for ch in children:
            while ch.popen.poll() is None and time.monotonic() < deadline and not self._hurry:
                time.sleep(POLL_S)

    def _kill_rest(self, children: list[_Child]) -> None:
        """SIGKILL every group, also of processes that exited (their helpers may linger)."""
        for ch in children:
            ch.signal_group(signal.SIGKILL)
        for ch in children:
            try:
                ch.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # unkillable (D state): report, don't hang
                self._say(f"process {ch.index} (pid {ch.popen.pid}) did not die on SIGKILL")
                continue
            if self._reaper is not None:
                self._reaper.forget(ch.popen.pid)
        self._join_readers(children)

    def _finish_preemption(self, children: list[_Child]) -> int:
        c = self.config
        sig = _signal_name(self._preempt_signal or signal.SIGTERM)
        running = [ch for ch in children if ch.popen.poll() is None]
        self._say(f"{sig} received: forwarding SIGTERM to {len(running)} process(es), "
                  f"waiting up to {c.grace:g}s (--grace)")
        self._record("preempt", signal=sig, processes=len(running))
        for ch in running:
            ch.signal_group(signal.SIGTERM)
        self._wait_all(children, c.grace)
        late = [ch.index for ch in children if ch.popen.poll() is None]
        self._kill_rest(children)
        reasons = []
        if late:
            why = "a second SIGINT" if self._hurry else f"--grace {c.grace:g}s"
            reasons.append(f"process(es) {', '.join(map(str, late))} did not exit within {why} "
                           "of SIGTERM and were killed with SIGKILL")
        for ch in children:
            code = ch.popen.returncode
            # 143: a podkit process that was not training with checkpoints ended as asked.
            if ch.index not in late and code not in (0, SIGTERM_EXIT):
                reasons.append(self._exit_failure(ch.index, code).reason + " after SIGTERM")
        if reasons:
            reason = "; ".join(reasons)
            self._say(f"preempted; {reason}")
            return self._exit(1, reason)
        codes = sorted({ch.popen.returncode for ch in children})
        said = " or ".join(map(str, codes))
        self._say(f"preempted; all {len(children)} processes exited {said}")
        return self._exit(0, f"preempted by {sig}; all processes exited {said}")

    # -- plumbing ------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGTERM, SIGINT and SIGHUP become a preemption (the processes lead their own
        sessions, so a closed terminal would otherwise orphan them); a signal that was ignored
        (nohup) stays ignored. Only the main thread may install handlers, so a Supervisor run
        from another thread relies on `preempt()` instead."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if sig != signal.SIGTERM and signal.getsignal(sig) is signal.SIG_IGN:
                continue
            previous[sig] = signal.signal(sig, lambda s, _f: self.preempt(s))
        return previous

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self._preempt_signal is None and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _out(self) -> IO[str]:
        return self._stdout or sys.stdout

    def _err(self) -> IO[str]:
        return self._stderr or sys.stderr

    def _write(self, stream: IO[str], data: bytes) -> None:
        with self._write_lock:
            try:
                binary = getattr(stream, "buffer", None)
                if binary is not None:
                    stream.flush()
                    binary.write(data)
                    binary.flush()
                else:
                    stream.write(data.decode("utf-8", "replace"))
                    stream.flush()
            except (BrokenPipeError, ValueError):  # our own output went away: keep draining
                pass

    def _pump(self, index: int, pipe: IO[bytes], stream: IO[str], show: bool = True) -> None:
        """Copy one child stream line by line, each line prefixed with `[index] `, with the
        NOISE cut out (dropped, or on lines of its own with `all_output`); `show` False reads
        the stream and drops it (a full pipe would block the child)."""
        prefix = f"[{index}] ".encode()
        with pipe:
            if not show:
                while pipe.read1(1 << 16):  # whatever is there (a BufferedReader)
                    pass
                return
            pending = b""  # the text before a cut-out noise line: the rest of its line follows
            owed = 0  # gloo rank numbers split off their lines (NOISE)
            for line in iter(pipe.readline, b""):
                line, noise, lacking = _cut_noise(line)
                owed = max(0, owed + lacking)
                if self.config.all_output:
                    for n in noise:
                        self._write(stream, prefix + n)
                if noise and line == b"\n" and not pending:
                    continue  # gloo's own newline, written apart from its line
                if owed and not pending and not noise:
                    line, paid = _pay_rank(line)
                    # A debt is paid by the line right after gloo's, or never: a later line
                    # that starts with a digit is the user's.
                    owed = 0
                    if paid and line.strip() == b"":
                        continue
                pending += line
                if pending.endswith(b"\n"):
                    self._write(stream, prefix + pending)
                    pending = b""
            if pending:  # the last line had no newline
                self._write(stream, prefix + pending + b"\n")

    @staticmethod
    def _join_readers(children: list[_Child]) -> None:
        # A grandchild that escaped the process group could hold a pipe open: don't hang on it.
        deadline = time.monotonic() + 5
        for ch in children:
            for t in ch.readers:
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _say(self, message: str) -> None:
        self._write(self._err(), f"podkit launch: {message}\n".encode())

    def _record(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": round(time.time(), 6),
                  "elapsed": round(time.monotonic() - self._t0, 6), **fields}
        self.events.append(record)
        if self._events_fh is not None:
            self._events_fh.write(json.dumps(record) + "\n")
            self._events_fh.flush()

    def _exit(self, code: int, reason: str) -> int:
        self._record("exit", code=code, reason=reason)
        return code
