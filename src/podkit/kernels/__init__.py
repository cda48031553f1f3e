"""Device kernels behind podkit's layers and models, each against a plain reference it must
equal (XLA's attention; the loss over the whole vocabulary), with an XLA fallback.

    from podkit.kernels import dot_product_attention
    out = dot_product_attention(q, k, v, causal=True)   # splash on a TPU, XLA elsewhere

`podkit.kernels.cross_entropy`: the loss over a vocabulary, a chunk at a time.

See `podkit.kernels.attention` for what each implementation takes, the block sizes and how a
kernel runs over a mesh.
"""

from __future__ import annotations

from podkit.kernels.attention import (
    IMPLEMENTATIONS,
    KernelFallbackWarning,
    attention_probabilities,
    block_size,
    check_implementation,
    dot_product_attention,
    resolve_implementation,
)

__all__ = ["IMPLEMENTATIONS", "KernelFallbackWarning", "attention_probabilities", "block_size",
           "check_implementation", "dot_product_attention", "resolve_implementation"]
