"""What this CPU can run, asked the way torch's own kernels ask it: one answer for every caller.

bf16 on a CPU goes through oneDNN, which refuses its bf16 paths (weight packing among them)
unless the CPU has AVX-512 BW/VL/DQ or AVX-NE-CONVERT. The engine's default dtype and its
packed linear layers both ask `onednn_bf16()`, and so do the tests that need those paths.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def onednn_bf16() -> bool:
    """Whether oneDNN runs bf16 on this CPU (its own device check; False without oneDNN)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:  # a build without oneDNN
        return False


ONEDNN_BF16_MISSING = "oneDNN's bf16 kernels need AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, which this CPU lacks"
