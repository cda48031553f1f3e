"""`podkit launch`: real processes, real signals, no mocks.

Each test runs the launcher as `python -m podkit.launch.cli` (the light entry point: no JAX)
over tests/launch_scripts/worker.py, whose modes play the processes the supervisor must handle,
and reads the JSON-lines events the launcher writes. Every process a test starts carries a
token in its environment; after each test no process with that token may remain.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest

from podkit.launch import Beater, LaunchConfig, Supervisor, beat, cli, heartbeat
from podkit.launch.supervisor import _cut_noise, _pay_rank

SCRIPTS = Path(__file__).with_name("launch_scripts")
WORKER = SCRIPTS / "worker.py"
TOKEN_VAR = "PODKIT_LAUNCH_TEST_TOKEN"


@pytest.fixture
def token():
    """A token in the environment of every process the test starts; none may outlive it."""
    value = uuid.uuid4().hex
    yield value
    deadline = time.monotonic() + 5
    while True:
        left = _processes_with(value)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for p in left:
        p.kill()
    assert not left, f"orphans left: {[(p.pid, p.info['cmdline']) for p in left]}"


def _processes_with(value):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(TOKEN_VAR) == value:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def launch(tmp_path, token, *flags, mode=None, command=None, program=None):
    """Start the launcher; returns (Popen, events path)."""
    events = tmp_path / "events.jsonl"
    command = command or [sys.executable, str(WORKER), mode, str(tmp_path)]
    program = program or [sys.executable, "-m", "podkit.launch.cli"]
    env = {**os.environ, TOKEN_VAR: token}
    proc = subprocess.Popen(
        [*program, *flags, "--events", str(events), "--", *command],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    return proc, events


# SIGINT as a terminal delivers it. A test runner started in the background (`make test &`)
# hands its children SIGINT *ignored*, and the launcher rightly keeps an ignored SIGINT
# ignored (nohup): the SIGINT test would hang. (No preexec_fn: this process runs JAX threads.)
AS_IN_A_TERMINAL = [sys.executable, "-c", "import runpy, signal; "
                    "signal.signal(signal.SIGINT, signal.default_int_handler); "
                    "runpy.run_module('podkit.launch.cli', run_name='__main__')"]


def finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Which process is stuck, and in what: the launcher and each of its children.
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            where = "\n".join(f"{p.pid} {p.status()} threads={p.num_threads()} "
                              f"{' '.join(p.cmdline())[-120:]}" for p in tree)
        except psutil.Error as e:
            where = f"(could not list the processes: {e})"
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"launcher still running after {timeout}s:\n{where}\n{out}\n{err}")
    return proc.returncode, out, err


def read_events(path):
    """The complete records (a record being written while the test reads has no newline)."""
    text = path.read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]


def kinds(events):
    return [e["event"] for e in events]


def wait_for(paths, timeout=20):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never appeared: {[str(p) for p in paths]}"
        time.sleep(0.02)


def test_env_wiring_and_prefixes(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--cpu-devices-per-process", "3",
                          "--all-output", mode="env")
    code, out, err = finish(proc)
    assert code == 0, err
    envs = {}
    for line in out.splitlines():
        assert line[:4] in ("[0] ", "[1] "), line
        envs[int(line[1])] = json.loads(line[4:])
    assert sorted(envs) == [0, 1]
    assert "[0] stderr line of 0" in err.splitlines()
    assert "[1] stderr line of 1" in err.splitlines()
    assert "podkit launch: all 2 processes exited 0" in err
    coordinators = {e["PODKIT_COORDINATOR"] for e in envs.values()}
    assert len(coordinators) == 1 and coordinators.pop().startswith("127.0.0.1:")
    for i, env in envs.items():
        assert env["PODKIT_PROCESS_ID"] == str(i)
        assert env["PODKIT_NUM_PROCESSES"] == "2"
        assert env["PODKIT_CPU_DEVICES"] == "3"
        assert env["PODKIT_RESTART"] == "0"
        assert env["PODKIT_LAUNCH_SLOT"] == str(i)
        assert env["PODKIT_MAX_PROCESSES"] == "2"
    files = {env["PODKIT_HEARTBEAT_FILE"] for env in envs.values()}
    assert len(files) == 2
    assert not any(Path(f).parent.exists() for f in files)  # the launcher removed its dir
    ev = read_events(events)
    assert kinds(ev) == ["start", "exit"]
    assert ev[0]["processes"] == 2 and len(ev[0]["pids"]) == 2
    assert ev[-1]["code"] == 0


def test_failure_once_restarts_after_backoff(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--backoff", "0.5",
                          "--all-output", mode="fail_once")
    code, out, err = finish(proc)
    assert code == 0, err
    ev = read_events(events)
    assert kinds(ev) == ["start", "failure", "stopped", "restart", "start", "exit"]
    failure = ev[1]
    assert (failure["process"], failure["kind"], failure["exit_code"]) == (1, "exit", 1)
    assert "process 1 exited with code 1" in err
    assert ev[3]["backoff_s"] == 0.5
    assert ev[3]["elapsed"] - ev[2]["elapsed"] >= 0.5 - 1e-3  # the backoff was waited
    assert ev[0]["coordinator"] != ev[4]["coordinator"]  # a fresh port for every start
    assert "[0] restart 1" in out and "[1] restart 1" in out


def test_always_failing_gives_up_after_max_restarts(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--max-restarts", "2",
                          "--backoff", "0.05", mode="always_fail")
    code, _, err = finish(proc)
    assert code == 1
    ev = read_events(events)
    assert kinds(ev).count("start") == 3 and kinds(ev).count("failure") == 3
    backoffs = [e["backoff_s"] for e in ev if e["event"] == "restart"]
    assert backoffs == [0.05, 0.1]  # doubling
    assert "giving up after 2 restart(s)" in err
    assert "the last failure: process 0 exited with code 3" in err
    assert ev[-1] == {**ev[-1], "event": "exit", "code": 1,
                      "reason": "process 0 exited with code 3"}


def test_an_attempt_that_ran_past_backoff_reset_restarts_after_backoff_again(tmp_path, token):
    """--backoff-reset 0: every attempt counts as one that ran long enough, so no wait doubles
    (the default, 600 s, doubles for a crash loop: the test above)."""
    proc, events = launch(tmp_path, token, "--processes", "2", "--max-restarts", "2",
                          "--backoff", "0.05", "--backoff-reset", "0", mode="always_fail")
    code, _, _ = finish(proc)
    assert code == 1
    backoffs = [e["backoff_s"] for e in read_events(events) if e["event"] == "restart"]
    assert backoffs == [0.05, 0.05]


def test_sigkilled_child_restarts_group(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--backoff", "0.1",
                          mode="pid")
    wait_for([tmp_path / "pid-0-0", tmp_path / "pid-0-1"])
    survivor = int((tmp_path / "pid-0-0").read_text())
    os.kill(int((tmp_path / "pid-0-1").read_text()), signal.SIGKILL)
    code, _, err = finish(proc)
    assert code == 0, err
    assert "process 1 was killed by SIGKILL" in err
    assert not psutil.pid_exists(survivor) or psutil.Process(survivor).status() == "zombie"
    ev = read_events(events)
    assert kinds(ev) == ["start", "failure", "stopped", "restart", "start", "exit"]
    assert (ev[1]["kind"], ev[1]["signal"], ev[1]["process"]) == ("signal", "SIGKILL", 1)
    assert (tmp_path / "pid-1-0").exists() and (tmp_path / "pid-1-1").exists()


def test_stalled_heartbeat_is_detected(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--heartbeat-timeout", "2",
                          "--backoff", "0.1", mode="stall")
    code, _, err = finish(proc)
    assert code == 0, err
    ev = read_events(events)
    assert kinds(ev) == ["start", "failure", "stopped", "restart", "start", "exit"]
    failure = ev[1]
    assert (failure["process"], failure["kind"]) == (1, "heartbeat")
    assert "process 1 sent no heartbeat for" in err
    last_beat = float((tmp_path / "last_beat").read_text())
    assert 2.0 <= failure["time"] - last_beat < 4.0
    assert failure["silent_s"] >= 2.0


def test_sigterm_is_forwarded_and_children_exit_cleanly(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--grace", "20", mode="term")
    wait_for([tmp_path / "ready-0", tmp_path / "ready-1"])
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 0, err
    assert time.monotonic() - t0 < 10
    assert (tmp_path / "term-0").exists() and (tmp_path / "term-1").exists()
    ev = read_events(events)
    assert kinds(ev) == ["start", "preempt", "exit"]
    assert ev[1]["signal"] == "SIGTERM"
    assert "SIGTERM received: forwarding SIGTERM to 2 process(es)" in err


def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--grace", "1",
                          mode="term_ignore")
    wait_for([tmp_path / "ready-0", tmp_path / "ready-1"])
    stubborn = int((tmp_path / "ready-1").read_text())
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    took = time.monotonic() - t0
    assert code == 1
    assert 1.0 <= took < 8
    assert (tmp_path / "term-0").exists() and not (tmp_path / "term-1").exists()
    assert "process(es) 1 did not exit within --grace 1s of SIGTERM" in err
    assert not psutil.pid_exists(stubborn) or psutil.Process(stubborn).status() == "zombie"
    assert kinds(read_events(events)) == ["start", "preempt", "exit"]


def test_sigterm_during_backoff_exits_without_restart(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--backoff", "20",
                          mode="always_fail")
    deadline = time.monotonic() + 20
    while not (events.exists() and "stopped" in kinds(read_events(events))):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 1
    assert time.monotonic() - t0 < 5  # not after the 20 s backoff
    assert "SIGTERM received between attempts; not restarting; the last failure: process 0 " \
        "exited with code 3" in err
    assert kinds(read_events(events)) == ["start", "failure", "stopped", "preempt", "exit"]


def test_sigint_is_a_preemption_too(tmp_path, token):
    proc, _ = launch(tmp_path, token, "--processes", "1", mode="term",
                     program=AS_IN_A_TERMINAL)
    wait_for([tmp_path / "ready-0"])
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 0, err
    assert (tmp_path / "term-0").exists()


@pytest.mark.parametrize("max_restarts", [1, 2])
def test_reshards_to_fewer_processes(tmp_path, token, max_restarts):
    """Elastic: a slot that fails more than --max-restarts times is dropped."""
    proc, events = launch(tmp_path, token, "--processes", "2", "--min-processes", "1",
                          "--max-restarts", str(max_restarts), "--backoff", "0.05",
                          "--stop-timeout", "2", mode="reshard")
    code, out, err = finish(proc)
    assert code == 0, err
    ev = read_events(events)
    assert [e["processes"] for e in ev if e["event"] == "start"] == \
        [2] * (max_restarts + 1) + [1]
    reshard = next(e for e in ev if e["event"] == "reshard")
    assert (reshard["process"], reshard["slot"], reshard["previous"], reshard["processes"],
            reshard["failures"]) == (1, 1, 2, 1, max_restarts + 1)
    assert (f"slot 1 failed {max_restarts + 1} times (more than --max-restarts "
            f"{max_restarts}): dropping it; the job resumes on 1 of 2 processes") in err
    assert "[0] alone: process 0 of 1" in out


def test_elastic_gives_up_at_min_processes(tmp_path, token):
    """A slot over its budget when the job is at --min-processes ends the launch."""
    proc, events = launch(tmp_path, token, "--processes", "2", "--min-processes", "2",
                          "--max-restarts", "1", "--backoff", "0.05", "--stop-timeout", "1",
                          mode="reshard")
    code, _, _ = finish(proc)
    assert code == 1
    ev = read_events(events)
    assert [e["processes"] for e in ev if e["event"] == "start"] == [2, 2]
    assert "reshard" not in kinds(ev)


def test_grows_back_when_the_slot_returns(tmp_path, token):
    """Dropped slot 1 is tried again after --grow-after seconds of the shrunk job, which is
    stopped as on a preemption (SIGTERM, exit 0) and restarted at the full count."""
    (tmp_path / "broken").write_text("")
    proc, events = launch(tmp_path, token, "--processes", "2", "--min-processes", "1",
                          "--max-restarts", "1", "--grow-after", "0.3", "--backoff", "0.05",
                          "--stop-timeout", "1", mode="flaky")
    code, _, err = finish(proc)
    assert code == 0, err
    ev = read_events(events)
    starts = [e for e in ev if e["event"] == "start"]
    assert [e["processes"] for e in starts] == [2, 2, 1, 2]
    assert [e["slots"] for e in starts] == [[0, 1], [0, 1], [0], [0, 1]]
    assert (tmp_path / "term-2").exists()  # the shrunk job was stopped with its checkpoint
    grow = next(e for e in ev if e["event"] == "grow")
    assert (grow["previous"], grow["processes"], grow["slots"]) == (1, 2, [1])
    assert "to try slot(s) 1 again" in err
    # Every process knows the launch's full size and its slot.
    assert (tmp_path / "ran-2-0").read_text() == "0 2"
    assert (tmp_path / "ran-3-1").read_text() == "1 2"


def test_a_slot_that_fails_when_tried_again_is_dropped_at_once(tmp_path, token):
    (tmp_path / "broken").write_text("")
    proc, events = launch(tmp_path, token, "--processes", "2", "--min-processes", "1",
                          "--max-restarts", "1", "--grow-after", "0.3", "--backoff", "0.05",
                          "--stop-timeout", "1", mode="flaky_stays")
    code, _, err = finish(proc)
    assert code == 0, err
    ev = read_events(events)
    assert [e["processes"] for e in ev if e["event"] == "start"] == [2, 2, 1, 2, 1]
    assert [e["failures"] for e in ev if e["event"] == "reshard"] == [2, 3]
    assert "of 2 processes (--min-processes 1); the full count is tried again after 0.6s" in err


def test_no_reshard_below_min_processes(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--max-restarts", "2",
                          "--backoff", "0.05", mode="reshard")
    code, _, _ = finish(proc)
    assert code == 1
    ev = read_events(events)
    assert [e["processes"] for e in ev if e["event"] == "start"] == [2, 2, 2]
    assert "reshard" not in kinds(ev)


@pytest.mark.parametrize("flags,message", [
    (["--processes", "0", "--", "true"], "--processes 0 must be >= 1"),
    (["--processes", "2", "--min-processes", "3", "--", "true"],
     "--min-processes 3 must be between 1 and --processes 2"),
    (["--processes", "2"], "no command to launch. Fix: put it after --"),
    (["--processes", "2", "--"], "no command to launch"),
    (["--", "true"], "--processes is required"),
    (["--processes", "1", "--heartbeat-timeout", "-1", "--", "true"],
     "--heartbeat-timeout -1 is negative"),
    (["--processes", "1", "--grace", "-5", "--", "true"], "--grace -5 is negative"),
    (["--processes", "1", "--backoff", "-1", "--", "true"], "--backoff -1 is negative"),
    (["--processes", "1", "--exit-timeout", "nan", "--", "true"],
     "--exit-timeout nan is not a number of seconds"),
    (["--processes", "1", "--heartbeat-timeout", "NaN", "--", "true"],
     "--heartbeat-timeout nan is not a number of seconds"),
    (["--processes", "1", "--max-restarts", "-1", "--", "true"], "--max-restarts -1"),
    (["--processes", "2", "--grow-after", "-1", "--", "true"], "--grow-after -1 is negative"),
    (["--processes", "1", "--", "no-such-program-podkit"],
     "command 'no-such-program-podkit' was not found on PATH"),
    (["--processes", "1", "--", "/no/such/dir/train.sh"],
     "command '/no/such/dir/train.sh' does not exist"),
])
def test_bad_flags_exit_2(flags, message, capsys):
    assert cli.main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("podkit: error: "), err
    assert message in err


def test_missing_command_does_not_loop(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2",
                          command=["no-such-program-podkit", "x"])
    code, _, err = finish(proc)
    assert code == 2
    assert "podkit: error: command 'no-such-program-podkit' was not found on PATH" in err
    assert not events.exists()  # nothing started


def test_python_api_records_events(tmp_path, capfd):
    config = LaunchConfig(
        command=[sys.executable, "-c", "import os; print(os.environ['PODKIT_PROCESS_ID'])"],
        processes=3, events_file=str(tmp_path / "ev.jsonl"), all_output=True)
    supervisor = Supervisor(config)
    before = signal.getsignal(signal.SIGTERM)
    assert supervisor.run() == 0
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
    assert kinds(supervisor.events) == ["start", "exit"]
    assert read_events(tmp_path / "ev.jsonl") == supervisor.events
    assert all({"time", "elapsed"} <= e.keys() for e in supervisor.events)
    assert sorted(capfd.readouterr().out.splitlines()) == ["[0] 0", "[1] 1", "[2] 2"]


def test_console_script(tmp_path, token):
    """Through the real `podkit` command: the lead's parser keeps `--` and the command."""
    script = shutil.which("podkit", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the podkit console script is not installed")
    proc, _ = launch(tmp_path, token, "launch", "--processes", "2", "--all-output",
                     program=[script],
                     command=[sys.executable, "-c",
                              "import os; print('hello from', os.environ['PODKIT_PROCESS_ID'])"])
    code, out, err = finish(proc)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["[0] hello from 0", "[1] hello from 1"]


@pytest.mark.parametrize("output", ["default", "all"])
def test_real_jax_job(tmp_path, token, output):
    """Two processes x 2 CPU devices joined by connect() from the launcher's variables. By
    default only process 0's line shows, whole, without gloo's connection lines; with
    --all-output both processes' lines and gloo's, each whole (gloo's lines, C++ on the same
    fd, may land between a print()'s text and its newline: they are cut out of it)."""
    flags = ["--all-output"] if output == "all" else []
    proc, _ = launch(tmp_path, token, "--processes", "2", "--cpu-devices-per-process", "2",
                     "--max-restarts", "0", *flags,
                     command=[sys.executable, str(SCRIPTS / "jax_worker.py")])
    code, out, err = finish(proc, timeout=120)
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    expected = [f"[{i}] process {i} of 2, 4 devices, gathered [0, 1]" for i in (0, 1)]
    if output == "default":
        assert lines == expected[:1], out
        assert "Gloo" not in err, err[-3000:]
    else:
        # gloo's lines, whole or in pieces where a print() landed inside one, are each on
        # lines of their own.
        assert sorted(line for line in lines if "Gloo" not in line
                      and "peer ranks" not in line) == expected, out
        # Each on a line of its own, after its process's prefix. Their text is gloo's: two of
        # its threads in one process write at once, and characters of one line can land in
        # the other ("Rank  is ... is : 10", seen once in a full suite run).
        gloo = [line for line in lines if "Gloo" in line]
        assert gloo and all(line.startswith(("[0] [Gloo] Rank ", "[1] [Gloo] Rank "))
                            for line in gloo), out


GLOO = b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"
MIXED = GLOO.replace(b"Rank 0 ", b"Rank  ") + b"0\n"


@pytest.mark.parametrize("line, kept, noise", [
    (GLOO + b"\n", b"", [GLOO + b"\n"]),
    (b"step 1" + GLOO + b"\n", b"step 1", [GLOO + b"\n"]),
    # A print() inside gloo's line: its head, then the print, then the rest (seen).
    (b"[Gloo] Rank step 3\n", b"step 3\n", [b"[Gloo] Rank \n"]),
    (GLOO[12:] + b"\n", b"", [GLOO[12:] + b"\n"]),
    # ... or the print landed after "peer ranks. ": its rest is a line of its own.
    (GLOO[:44] + b"step 4\n", b"step 4\n", [GLOO[:44] + b"\n"]),
    (GLOO[44:] + b"\n", b"", [GLOO[44:] + b"\n"]),
    # Two gloo threads' characters mixed: a digit of one line in the other.
    (MIXED, b"", [MIXED]),
    # Text that only looks like it is kept whole, digits and all.
    (b"12 items; Rank 3 of 4\n", b"12 items; Rank 3 of 4\n", []),
])
def test_gloo_noise_is_cut_whole_or_in_pieces(line, kept, noise):
    assert _cut_noise(line)[:2] == (kept, noise)


def test_a_gloo_rank_split_off_its_line_is_cut_from_the_next_line():
    """Seen in process 0's stdout: "[Gloo] Rank " + gloo's other thread's whole line + " is
    connected ..." + "0" + print(): the "0" is the first line's rank."""
    lines = [b"[Gloo] Rank " + GLOO + b"\n", GLOO[13:] + b"\n", b"0process 0 of 2\n"]
    cut = [_cut_noise(line) for line in lines]
    assert [c[2] for c in cut] == [1, 0, 0]  # one rank owed, from the first line
    assert cut[2][0] == b"0process 0 of 2\n"
    assert _pay_rank(cut[2][0]) == (b"process 0 of 2\n", True)
    assert _pay_rank(b"10 steps\n") == (b"10 steps\n", False)  # a number, not a glued rank
    # A rank found at the start of the middle piece pays for the head that lacked it.
    assert _cut_noise(b"[Gloo] Rank step 3\n")[2] == 1
    assert _cut_noise(GLOO[12:] + b"\n")[2] == -1


# Plays a process that prints as a data-parallel job does, with library noise between: stdout
# and stderr lines; gloo's connection line whole and inside a print() cut in two (text, noise,
# newline: three writes, as PYTHONUNBUFFERED print() and C++ make), and a gloo line cut in two
# by a print() ("[Gloo] Rank " + print + "0 is connected ...", seen); a last line without a
# newline; and from process 1 a megabyte of stdout (hidden: the launcher must still drain it).
NOISY = r"""
import os, sys
i = os.environ["PODKIT_PROCESS_ID"]
gloo = f"[Gloo] Rank {i} is connected to 1 peer ranks. Expected number of connected peer " \
    "ranks is : 1\n".encode()
for data in (gloo, f"step 1 of {i}".encode(), gloo, b"\n", f"step 2 of {i}\n".encode(),
             b"[Gloo] Rank ", f"step 3 of {i}\n".encode(), gloo[len("[Gloo] Rank "):]):
    os.write(1, data)
os.write(2, f"warning from {i}\n".encode() + gloo + f"Traceback (most recent call last) "
         f"of {i}\n".encode())
if i == "1":
    for _ in range(1024):
        os.write(1, b"x" * 1023 + b"\n")
os.write(1, f"tail of {i}".encode())
"""


@pytest.mark.parametrize("output", ["default", "all"])
def test_output_is_process_0s_stdout_and_every_stderr_without_gloo_noise(tmp_path, token,
                                                                         output):
    """By default: process 0's stdout and every process's stderr, each line prefixed with its
    process, gloo's connection lines dropped (also the one that landed inside a line: no
    garbage left); --all-output: every process's stdout too, and the gloo lines, each whole on
    a line of its own."""
    flags = ["--all-output"] if output == "all" else []
    proc, _ = launch(tmp_path, token, "--processes", "2", "--max-restarts", "0", *flags,
                     command=[sys.executable, "-c", NOISY])
    code, out, err = finish(proc)
    assert code == 0, err
    outs = {i: [line[4:] for line in out.splitlines() if line.startswith(f"[{i}] ")]
            for i in (0, 1)}
    assert all(line[:4] in ("[0] ", "[1] ") for line in out.splitlines())
    errs = {i: [line[4:] for line in err.splitlines() if line.startswith(f"[{i}] ")]
            for i in (0, 1)}
    gloo = "[Gloo] Rank {} is connected to 1 peer ranks. Expected number of connected peer " \
        "ranks is : 1"
    if output == "default":
        assert outs == {0: ["step 1 of 0", "step 2 of 0", "step 3 of 0", "tail of 0"], 1: []}, out
        for i in (0, 1):
            assert errs[i] == [f"warning from {i}", f"Traceback (most recent call last) of {i}"]
        assert "Gloo" not in out
        assert "stdout is shown from process 0 only (--all-output: from every process)" in err
    else:
        for i in (0, 1):
            g = gloo.format(i)
            assert outs[i][:7] == [g, g, f"step 1 of {i}", f"step 2 of {i}", "[Gloo] Rank ",
                                   f"step 3 of {i}", g.removeprefix("[Gloo] Rank ")], out[:3000]
            assert outs[i][-1] == f"tail of {i}"
            assert errs[i] == [f"warning from {i}", g, f"Traceback (most recent call last) "
                               f"of {i}"]
        assert outs[1][7:-1] == ["x" * 1023] * 1024
        assert "stdout is shown from process 0 only" not in err


def test_beat_and_beater(tmp_path, monkeypatch):
    path = tmp_path / "hb"
    monkeypatch.delenv(heartbeat.ENV_HEARTBEAT_FILE, raising=False)
    beat(force=True)  # unset: a no-op
    assert not Beater().start().active
    monkeypatch.setenv(heartbeat.ENV_HEARTBEAT_FILE, str(path))
    beat(force=True)
    assert path.exists()  # the first beat creates the file
    first = path.stat().st_mtime_ns
    beat()  # within 0.5 s of the last one: rate-limited, no syscall
    assert path.stat().st_mtime_ns == first
    with Beater(interval_s=0.05) as b:
        assert b.active
        time.sleep(0.3)
        moved = path.stat().st_mtime_ns
        assert moved > first
        with b.paused():
            assert not b.active
            time.sleep(0.15)  # a beat in flight when pausing may still land
            frozen = path.stat().st_mtime_ns
            time.sleep(0.3)
            assert path.stat().st_mtime_ns == frozen
        time.sleep(0.2)
        assert path.stat().st_mtime_ns > frozen
    assert not b.active
    assert heartbeat.beater() is heartbeat.beater()


def test_hung_after_training_is_reported_with_its_phase_and_stacks(tmp_path, token):
    """Process 1 leaves its training loop and hangs in its text sample: nothing beats after
    training, and --exit-timeout catches it, names the phase, keeps its stacks and stops the
    group."""
    proc, events = launch(tmp_path, token, "--processes", "2", "--exit-timeout", "2",
                          "--max-restarts", "0", mode="after")
    code, _, err = finish(proc)
    assert code == 1, err
    ev = read_events(events)
    assert kinds(ev) == ["start", "failure", "stopped", "exit"]
    failure = ev[1]
    assert (failure["process"], failure["kind"]) == (1, "exit_timeout")
    assert failure["phase"] == "after training: text sample"
    trained = float((tmp_path / "trained-1").read_text())
    assert 2.0 <= failure["time"] - trained < 4.0, failure["time"] - trained
    assert "process 1 is hung in phase 'after training: text sample': still running" in err
    assert "(--exit-timeout 2); stopping the group" in err
    stacks = tmp_path / "run-1" / "stacks-p1-r0.txt"
    assert failure["stacks"] == str(stacks)
    text = stacks.read_text()
    assert "Current thread" in text or "Thread 0x" in text
    assert "in forever" in text and "worker.py" in text  # where the main thread hangs
    assert f"process 1's thread stacks: {stacks}" in err


def test_work_after_training_within_the_exit_timeout_is_fine(tmp_path, token):
    proc, events = launch(tmp_path, token, "--processes", "2", "--exit-timeout", "5",
                          "--max-restarts", "0", mode="after_quick")
    code, _, err = finish(proc)
    assert code == 0, err
    assert kinds(read_events(events)) == ["start", "exit"]


def test_exit_timeout_is_validated(capsys):
    assert cli.main(["--processes", "1", "--exit-timeout", "0", "--", "true"]) == 2
    assert "--exit-timeout 0 would fail every process" in capsys.readouterr().err
    assert cli.main(["--processes", "1", "--exit-timeout", "-3", "--", "true"]) == 2
    assert "--exit-timeout -3 is negative" in capsys.readouterr().err


@pytest.mark.parametrize("moment", ["at_start", "while_starting", "running"])
def test_sigkill_of_the_launcher_leaves_no_process_behind(tmp_path, token, moment):
    """SIGKILL runs no clean-up in the launcher: its reaper kills the job's process groups and
    every process carrying the launch's id (here also a helper that left its group)."""
    proc, _ = launch(tmp_path, token, "--processes", "2", mode="escape")
    rng = np.random.default_rng()
    if moment == "at_start":
        time.sleep(rng.uniform(0.0, 0.3))  # the launcher may not have started anything yet
    elif moment == "while_starting":
        deadline = time.monotonic() + 20
        while not _processes_with(token)[2:]:  # the launcher, its reaper, a first child
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
    else:
        wait_for([tmp_path / f"helper-{i}" for i in (0, 1)])
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    while _processes_with(token) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    left = _processes_with(token)
    assert not left, f"alive 5 s after the launcher's SIGKILL: {[p.info for p in left]}"
    if moment == "running":  # the helpers had left their process groups
        for i in (0, 1):
            assert not psutil.pid_exists(int((tmp_path / f"helper-{i}").read_text())) or \
                psutil.Process(int((tmp_path / f"helper-{i}").read_text())).status() == "zombie"


def test_heartbeat_status_through_nested_loops_and_phases(tmp_path, monkeypatch):
    """The content the launcher reads: phase, watch mode, since; a nested loop (validation)
    returns to its outer loop, the outermost leaves the process "after" it."""
    path = tmp_path / "hb"
    monkeypatch.setenv(heartbeat.ENV_HEARTBEAT_FILE, str(path))
    heartbeat.set_run_dir(tmp_path / "run")
    with heartbeat.loop("training") as hb:
        st = heartbeat.read_status(path)
        assert (st["phase"], st["watch"], st["pid"]) == ("training", "beats", os.getpid())
        assert st["run_dir"] == str(tmp_path / "run")
        with heartbeat.loop("evaluation"):
            assert heartbeat.read_status(path)["phase"] == "evaluation"
        assert heartbeat.read_status(path)["phase"] == "training"
        hb.running()
    t = time.time()
    st = heartbeat.read_status(path)
    assert (st["phase"], st["watch"]) == ("after training", "exit")
    assert t - 1 < st["since"] <= t
    with heartbeat.phase("text sample"):
        assert heartbeat.read_status(path)["phase"] == "after training: text sample"
        assert heartbeat.read_status(path)["since"] == st["since"]
    assert heartbeat.read_status(path)["phase"] == "after training"
    assert heartbeat.read_status(tmp_path / "missing") is None


def test_real_jax_job_hung_after_fit_is_caught_with_its_stacks(tmp_path, token):
    """podkit's own loop and run directory: fit() ends, the script hangs in a phase of its
    own; the launcher reports that phase, puts the stacks in the run directory and stops both
    processes (each ends on the forwarded SIGTERM)."""
    proc, events = launch(tmp_path, token, "--processes", "2", "--cpu-devices-per-process", "1",
                          "--exit-timeout", "3", "--max-restarts", "0",
                          command=[sys.executable, str(SCRIPTS / "term_job.py"), "after_fit",
                                   str(tmp_path)])
    code, out, err = finish(proc, timeout=120)
    assert code == 1, err[-3000:]
    failure = read_events(events)[1]
    assert failure["kind"] == "exit_timeout" and failure["phase"] == "after training: sleeping"
    assert 3.0 <= failure["silent_s"] < 5.0
    stacks = Path(failure["stacks"])
    assert stacks.parent == tmp_path / "run" and stacks.name.startswith("stacks-p")
    assert "term_job.py" in stacks.read_text()
    assert "SIGTERM received outside training: exiting with status 143" in err


def test_a_stalled_fit_is_named_by_the_launcher(tmp_path, token):
    """fit(watchdog=2) in a process under the launcher: no step completes for 5 s (a callback
    sleeps), the process writes its stacks into its run directory and the launcher names it,
    once; the job then finishes (a stall that ends is not a failure)."""
    run = tmp_path / "run"
    proc, events = launch(tmp_path, token, "--processes", "1", "--max-restarts", "0",
                          command=[sys.executable, str(SCRIPTS / "stall_worker.py"), str(run)])
    code, out, err = finish(proc, timeout=120)
    assert code == 0, err[-3000:]
    dump = run / "watchdog-p0.txt"
    assert "process 0 stalled: no step completed for" in err
    assert f"its stacks: {dump}" in err
    assert "on_train_batch_end" in dump.read_text()
    stall = [e for e in read_events(events) if e["event"] == "stall"]
    # Once per stall: no step is named twice. (On a loaded machine the first steps, while
    # the state's initialization still compiles, can be a stall of their own, named once.)
    steps = [e["step"] for e in stall]
    assert len(steps) == len(set(steps)), stall
    slept = [e for e in stall if e["step"] >= 5]  # the callback sleeps after batch 10
    assert len(slept) == 1 and slept[0]["process"] == 0 and slept[0]["file"] == str(dump), stall
