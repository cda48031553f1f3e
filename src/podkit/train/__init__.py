"""The compiled steps (step.py), the feeds that supply them (feeds/), the loop (loop.py) and
its callbacks (hooks.py)."""
