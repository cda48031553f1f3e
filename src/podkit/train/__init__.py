"""Training without a model: compile()'s arguments resolved per output (compile.py), the
jitted programs (program.py, steps in step.py), the feeds that supply them (feeds/), the loops
(loop.py) and the one protocol of their hooks (hooks.py), the everyday hooks (instruments.py,
checkpointing.py)."""
