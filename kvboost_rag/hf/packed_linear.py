"""bf16 linear layers on a CPU with their weights laid out once for oneDNN, not at every call.

A decode step is a matrix-vector product per linear layer. `F.linear` in bf16 on a CPU read
the default model's weights at ~10 GB/s (28 of a 52 ms step at 512 tokens, on 2 AVX-512 cores
where a sum reads 31 GB/s); the same products on weights reordered once for oneDNN's kernels
take 18 ms, with the same outputs to the bit (tests/test_packed_linear.py). This is the weight
prepacking PyTorch's own compiler does for CPU inference (inductor's mkldnn fusion), done here
without compiling. fp32 keeps `nn.Linear`: MKL's matrix-vector product is already near the
bandwidth there.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from .cpu import onednn_bf16
from .fingerprint import remember_weight_digest

log = logging.getLogger(__name__)

PACKED_DTYPES = (torch.bfloat16,)


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward on a oneDNN-packed copy of its weight (the plain weight is dropped)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # NOTE: packed for one row of input, the decode step's shape; any number of rows runs on it.
        self.register_buffer("packed_weight", _pack(linear.weight.detach()), persistent=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)


def packing_pays(model: Any) -> bool:
    """Whether `pack_linear_layers` would change `model`: bf16 weights on a CPU whose oneDNN runs
    bf16 (on an AVX2-only CPU it refuses to pack them)."""
    weight = next(model.parameters())
    return (
        weight.device.type == "cpu"
        and weight.dtype in PACKED_DTYPES
        and torch.backends.mkldnn.is_available()
        and onednn_bf16()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pack_linear_layers(model: Any) -> int:
    """Swap every plain bf16 CPU `nn.Linear` of `model` for a `PackedLinear`; returns how many.

    The first is checked against `F.linear` on one and on three rows; a build whose kernels
    disagree (or fail) keeps `nn.Linear`, with a warning. Layers on another device or dtype,
    with a weight of a tensor subclass (quantized) or an accelerate hook, are left as they are.
    NOTE: this changes the model in place, as switching its attention does, and for good: its
    linear weights are then oneDNN tensors, which `state_dict`, `.to()` and `deepcopy` do not
    take. The weights' hash is taken first and kept on the model (`hf.fingerprint`). A tied
    output head gets a packed copy of the embedding (+57 MB on the default model, for ~2.4 ms
    of a ~44 ms decode step).
    """
    if not packing_pays(model):
        return 0
    swaps = [
        (parent, name) for parent in model.modules() for name, child in parent.named_children() if _packable(child)
    ]
    first = _checked_pack(getattr(*swaps[0])) if swaps else None
    if first is None:
        return 0
    remember_weight_digest(model)  # as loaded: packing must not change which stores this model reads
    setattr(*swaps[0], first)
    for parent, name in swaps[1:]:  # one at a time, so each plain weight is freed as its copy is made
        setattr(parent, name, PackedLinear(getattr(parent, name)))
    return len(swaps)


def _packable(module: nn.Module) -> bool:
    if type(module) is not nn.Linear or hasattr(module, "_hf_hook"):
        return False
    weight = module.weight
    plain = type(weight) is nn.Parameter and type(weight.data) is torch.Tensor  # not a quantized subclass
    return plain and weight.device.type == "cpu" and weight.dtype in PACKED_DTYPES


def _checked_pack(linear: nn.Linear) -> PackedLinear | None:
    """`linear` packed, if its outputs agree with `F.linear`'s on one and on three rows."""
    try:
        packed = PackedLinear(linear)
        generator = torch.Generator().manual_seed(0)
        with torch.inference_mode():
            for rows in (1, 3):
                x = torch.randn(1, rows, linear.in_features, generator=generator).to(linear.weight.dtype)
                expected = nn.functional.linear(x, linear.weight, linear.bias).float()
                if not torch.allclose(packed(x).float(), expected, rtol=1e-2, atol=1e-2):
                    raise RuntimeError("packed and plain outputs differ")
    except (RuntimeError, NotImplementedError) as exc:
        log.warning("oneDNN packed linear layers are off (%s): decode steps stay on nn.Linear", exc)
        return None
    return packed
