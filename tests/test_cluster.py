"""connect() in fresh processes: virtual devices, late requests, a silent coordinator."""

import os
import subprocess
import sys
import textwrap
import time

from helpers import free_port


def run_python(code: str, env: dict | None = None, timeout: float = 120):
    full_env = {**os.environ, **(env or {})}
    for key in ("PODKIT_COORDINATOR", "PODKIT_NUM_PROCESSES", "PODKIT_PROCESS_ID",
                "PODKIT_CPU_DEVICES"):
        if env is None or key not in env:
            full_env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=full_env,
    )


def test_cpu_devices_from_argument_and_environment():
    out = run_python("""
        import podkit as pk
        c = pk.connect(cpu_devices=3)
        assert pk.connect(cpu_devices=3) is c   # idempotent
        print(len(c.devices), c.process_count, c.platform)
        print(c)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "3 1 cpu"
    assert "3 cpu device(s)" in out.stdout
    out = run_python(
        "import podkit as pk; print(len(pk.connect().devices))", env={"PODKIT_CPU_DEVICES": "5"}
    )
    assert out.stdout.strip() == "5", out.stderr


def test_virtual_devices_asked_for_after_the_backend_started():
    out = run_python("""
        import jax, podkit as pk
        jax.numpy.zeros(1)      # starts the backend with one CPU device
        try:
            pk.connect(cpu_devices=4)
        except pk.ConnectError as e:
            print("ERR", e)
    """)
    assert "ERR cpu_devices=4 was asked for after JAX's backend started" in out.stdout, out.stderr
    assert "before any JAX computation" in out.stdout


def test_strategy_connects_by_itself():
    out = run_python(
        """
        import podkit as pk
        print(pk.DataParallel().data_parallel_size)
        """,
        env={"PODKIT_CPU_DEVICES": "4"},
    )
    assert out.stdout.strip() == "4", out.stderr


def test_coordinator_that_does_not_answer_raises_within_timeout():
    port = free_port()  # nobody listens here
    t = time.monotonic()
    out = run_python(f"""
        import podkit as pk
        try:
            pk.connect(coordinator="127.0.0.1:{port}", num_processes=2, process_id=1, timeout_s=2)
        except pk.ConnectError as e:
            print("ERR", e)
    """)
    elapsed = time.monotonic() - t
    assert f"ERR coordinator 127.0.0.1:{port} did not answer within timeout_s=2s" in out.stdout, (
        out.stdout + out.stderr
    )
    assert "start process 0" in out.stdout
    assert elapsed < 60


def test_incomplete_multi_process_settings():
    out = run_python(
        """
        import podkit as pk
        try:
            pk.connect()
        except pk.ConfigError as e:
            print("ERR", e)
        """,
        env={"PODKIT_COORDINATOR": "127.0.0.1:1234", "PODKIT_NUM_PROCESSES": "2"},
    )
    assert "ERR a multi-process job needs coordinator, num_processes and process_id" in out.stdout
    out = run_python(
        """
        import podkit as pk
        try:
            pk.connect(coordinator="nohostport", num_processes=2, process_id=0)
        except pk.ConfigError as e:
            print("ERR", e)
        """
    )
    assert "ERR coordinator='nohostport' is not host:port" in out.stdout, out.stderr


def test_a_script_and_its_launcher_disagreeing_on_devices_is_an_error():
    """`podkit launch --cpu-devices-per-process 2` (PODKIT_CPU_DEVICES=2) and a script's
    connect(cpu_devices=4): neither wins in silence."""
    out = run_python("""
        import podkit as pk
        try:
            pk.connect(cpu_devices=4)
        except pk.ConfigError as e:
            print(e)
    """, env={"PODKIT_CPU_DEVICES": "2"})
    assert out.returncode == 0, out.stderr
    assert "connect(cpu_devices=4) disagrees with PODKIT_CPU_DEVICES=2" in out.stdout
    assert "drop cpu_devices= from the script" in out.stdout
    out = run_python("import podkit as pk; print(len(pk.connect(cpu_devices=2).devices))",
                     env={"PODKIT_CPU_DEVICES": "2"})
    assert out.stdout.strip() == "2", out.stderr  # the same value is no conflict
