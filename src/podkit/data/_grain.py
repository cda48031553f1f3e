"""Grain, imported once and ready: the one place podkit.data imports it from.

Grain reads absl flags; a program that did not run absl.app has not parsed them. Importing
Grain (and JAX under it) costs about a second, so `import podkit` does not: this module loads
with the first iterator, source file or random-access build.
"""

import grain
from absl import flags

if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()

__all__ = ["grain"]
