"""`podkit launch`: supervise the processes of a job on one machine.

`Supervisor`/`LaunchConfig` start N processes of a command, restart the group when one fails or
hangs (in training or after it), reshard to fewer processes when one slot keeps failing, turn
SIGTERM into a clean preemption, and never leave a process behind (`reaper.py`).
`heartbeat.beat()`, `heartbeat.Beater`, `heartbeat.loop()` and `heartbeat.phase()` are the
worker side of hang detection. Only the standard library is imported here: the launcher never
starts JAX.
"""

from podkit.heartbeat import ENV_HEARTBEAT_FILE, Beater, beat, beater, phase
from podkit.launch.options import LaunchConfig
from podkit.launch.reaper import ENV_LAUNCH_ID
from podkit.launch.supervisor import ENV_RESTART, Supervisor

__all__ = ["ENV_HEARTBEAT_FILE", "ENV_LAUNCH_ID", "ENV_RESTART", "Beater", "LaunchConfig",
           "Supervisor", "beat", "beater", "phase"]
