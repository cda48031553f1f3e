"""`podkit launch`: supervise the processes of a job on one machine.

`Supervisor`/`LaunchConfig` start N processes of a command, restart the group when one fails or
hangs, reshard to fewer processes when one slot keeps failing, and turn SIGTERM into a clean
preemption. `heartbeat.beat()` and `heartbeat.Beater` are the worker side of hang detection.
Only the standard library is imported here: the launcher never starts JAX.
"""

from podkit.launch.heartbeat import ENV_HEARTBEAT_FILE, Beater, beat, beater
from podkit.launch.supervisor import ENV_RESTART, LaunchConfig, Supervisor

__all__ = ["ENV_HEARTBEAT_FILE", "ENV_RESTART", "Beater", "LaunchConfig", "Supervisor", "beat",
           "beater"]
