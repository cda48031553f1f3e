"""Computations written for memory or speed rather than brevity, each against a plain
reference it must equal (podkit.kernels.cross_entropy: the loss over a vocabulary, a chunk at
a time)."""
