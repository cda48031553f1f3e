"""The launcher's view of heartbeats: the protocol and the process's side live in
`podkit.heartbeat` (below the training loop, which must not import launch/); this name keeps
working for code written against it (`from podkit.launch.heartbeat import beat`)."""

from podkit.heartbeat import (
    ENV_HEARTBEAT_FILE,
    MIN_INTERVAL_S,
    STACKS_SIGNAL,
    Beater,
    Loop,
    arm,
    beat,
    beater,
    loop,
    phase,
    read_status,
    set_run_dir,
)

__all__ = ["ENV_HEARTBEAT_FILE", "MIN_INTERVAL_S", "STACKS_SIGNAL", "Beater", "Loop", "arm",
           "beat", "beater", "loop", "phase", "read_status", "set_run_dir"]
