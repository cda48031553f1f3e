"""The compiled steps (step.py), the feeds that supply them (feed.py), the loop (loop.py) and
its callbacks (hooks.py)."""
