"""KIVI-style KV quantization: keys per channel, values per token, int8 or packed int4.

Keys carry outlier channels, so each channel gets its own scale over a chunk's tokens; values
are mixed per token by attention, so each token gets its own scale over its channels (KIVI,
ICML'24). Asymmetric: codes = round((x - zero) / scale), zero = the group minimum. Scale and
zero are kept in float16 and the codes are computed against those stored values, so the error
of every element is at most half its group's scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import Quantization

BITS: dict[str, int] = {"int8": 8, "int4": 4}


@dataclass(slots=True, frozen=True)
class QuantizedTensor:
    codes: torch.Tensor  # uint8; int4 packs two codes per byte along the last axis
    scale: torch.Tensor  # float16, 1 along the reduced axis
    zero: torch.Tensor  # float16, the group minimum
    bits: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + self.zero.nbytes

    def dequantize(self) -> torch.Tensor:
        codes = self.codes
        if self.bits == 4:
            codes = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)[..., : self.shape[-1]]
        return (codes.float() * self.scale.float() + self.zero.float()).to(self.dtype)


def quantize(x: torch.Tensor, bits: int, reduce_dim: int) -> QuantizedTensor:
    """Asymmetric quantization with one scale per group: the elements along `reduce_dim`."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    levels = 2**bits - 1
    values = x.float()
    zero = values.amin(dim=reduce_dim, keepdim=True).half()
    top = values.amax(dim=reduce_dim, keepdim=True)
    scale = ((top - zero.float()) / levels).clamp_min(1e-8).half()
    # NOTE: float16 rounding may leave top just out of reach; one ulp up keeps every code in range.
    short = scale.float() * levels + zero.float() < top
    scale = torch.where(short, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    codes = torch.round((values - zero.float()) / scale.float()).clamp_(0, levels).to(torch.uint8)
    if bits == 4:
        if codes.shape[-1] % 2:
            codes = torch.nn.functional.pad(codes, (0, 1))
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return QuantizedTensor(codes.contiguous(), scale, zero, bits, tuple(x.shape), x.dtype)


def quantize_keys(keys: torch.Tensor, kind: Quantization) -> QuantizedTensor:
    """Keys [..., tokens, channels]: one scale per channel, over the tokens."""
    return quantize(keys, BITS[kind], reduce_dim=-2)


def quantize_values(values: torch.Tensor, kind: Quantization) -> QuantizedTensor:
    """Values [..., tokens, channels]: one scale per token, over the channels."""
    return quantize(values, BITS[kind], reduce_dim=-1)
