"""Linear layers on 4-bit weights in groups, through PyTorch's own CPU kernel.

A decode step reads every weight once; on a CPU that read is most of the step. PyTorch ships a
group-wise int4 weight-only product for CPUs (`_weight_int4pack_mm_for_cpu`, the kernel under
torchao's int4 CPU layout): w = (q - 8) * scale + zero per group of input columns, q in 0..15.
Over the default model's linear layers it reads ~3x less than packed bf16 and took 6.8-8.4
against 18.8-29 ms a step on one AVX-512 core (docs/research-log.md, "Issue 33").

The kernel takes bf16 activations (fp32 ones run ~20x slower), so on a CPU without native bf16
the layer rounds its input to bf16 and returns fp32: still 2.6x faster than an fp32 `nn.Linear`
there. A GGUF Q4_1 block (w = d * q + m, 32 weights) is this layout with scale d and zero
m + 8d, so the default model's weights load as the file holds them (`hf.gguf_int4`).

On CUDA (compute capability 8.0 and up) the same layout runs through PyTorch's tinygemm kernel
(`_weight_int4pack_mm`, what torchao's int4 CUDA layout calls), packed by its own converter: the
codes, scales and zeros are the CPU path's, so a layer quantizes once and runs on either device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .fingerprint import WEIGHT_FORMAT, remember_weight_digest, weight_format

INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_MAX_ROWS = 4  # more rows go to the dense weight where one is kept (see `Int4Linear`)
# Looked up once, as its one overload (the packet's Python dispatch is ~1 us a call): a decode step
# calls it 120-210 times. None in a torch without it (`int4_supported`).
_INT4_MM: Any = getattr(getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None), "default", None)
_INT4_MM_CUDA: Any = getattr(getattr(torch.ops.aten, "_weight_int4pack_mm", None), "default", None)
CUDA_INT4_CAPABILITY = (8, 0)  # tinygemm's kernel is built for Ampere and later


def int4_kernel(device: torch.device) -> Any:
    """The int4 product for tensors on `device`, or None where PyTorch has none."""
    return _INT4_MM_CUDA if device.type == "cuda" else _INT4_MM if device.type == "cpu" else None


def nibble_pairs(codes: torch.Tensor) -> torch.Tensor:
    """Codes [out, in] (0..15) as bytes [out, in / 2], two codes a byte, the even column high:
    the input of the CUDA converter (`_convert_weight_to_int4pack`)."""
    wide = codes.to(torch.uint8)
    return (wide[:, 0::2] << 4) | wide[:, 1::2]


def inner_k_tiles(in_features: int) -> int:
    """tinygemm's tiles of 16 inputs per packed block: the largest of 8, 4, 2 dividing the inputs."""
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"{in_features} inputs do not fill tinygemm's blocks (a multiple of 32)")


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Codes [out, in] (0..15, on the layer's device) in the layout of that device's int4 kernel."""
    if codes.device.type == "cuda":
        return torch.ops.aten._convert_weight_to_int4pack(nibble_pairs(codes), inner_k_tiles(codes.shape[1]))
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 2)


@dataclass(frozen=True, slots=True)
class Int4Weight:
    """A weight [out, in] as codes 0..15 and, per group of `group_size` inputs, its scale and zero."""

    codes: torch.Tensor  # [out, in] uint8
    scales: torch.Tensor  # [out, in // group_size] float32
    zeros: torch.Tensor  # [out, in // group_size] float32: the weight where the code is 8
    group_size: int

    def dequantized(self) -> torch.Tensor:
        """The weight in float32, as the kernel reads it."""
        codes = self.codes.float().view(self.codes.shape[0], -1, self.group_size)
        weight = (codes - 8) * self.scales.unsqueeze(-1) + self.zeros.unsqueeze(-1)
        return weight.reshape(self.codes.shape)


def quantize_int4(weight: torch.Tensor, group_size: int = 32) -> Int4Weight:
    """Round-to-nearest, asymmetric per group (each group's minimum and maximum are kept)."""
    out_features, in_features = weight.shape
    if group_size not in INT4_GROUP_SIZES or in_features % group_size:
        raise ValueError(f"int4 groups of {group_size} do not divide {in_features} inputs (sizes {INT4_GROUP_SIZES})")
    groups = weight.detach().float().view(out_features, -1, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = ((groups - low.unsqueeze(-1)) / scales.unsqueeze(-1)).round().clamp(0, 15).to(torch.uint8)
    return Int4Weight(codes.view(out_features, in_features), scales, low + 8 * scales, group_size)


class Int4Linear(nn.Module):
    """`nn.Linear`'s forward on an `Int4Weight` (CPU) for a few rows (decode steps), and on the
    layer's dense weight, where it is kept, for more (prefill). Returns the input's dtype.

    The int4 kernel is a matrix-vector product: over the default model's layers it led packed
    bf16 at 1 row (7.1 against 19.0 ms) and 4 (11.7 against 15.1), and lost from 8 (21.6
    against 18.8) to 64 rows (163 against 74), so a prompt's prefill would take twice as long.
    """

    def __init__(
        self,
        weight: Int4Weight,
        bias: torch.Tensor | None,
        dense: nn.Linear | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        packed = pack_int4(weight.codes.to(device))
        scales_and_zeros = torch.stack([weight.scales.t(), weight.zeros.t()], dim=-1).to(device, torch.bfloat16)
        self._hold(packed, scales_and_zeros.contiguous(), weight.group_size, bias, dense)

    @classmethod
    def from_packed(
        cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, bias: torch.Tensor | None
    ) -> Int4Linear:
        """A layer over weights already in the kernel's layout (`fused_int4`), without a dense copy."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._hold(packed, scales_and_zeros, group_size, bias, None)
        return layer

    def _hold(
        self,
        packed: torch.Tensor,
        scales_and_zeros: torch.Tensor,
        group_size: int,
        bias: torch.Tensor | None,
        dense: nn.Linear | None,
    ) -> None:
        groups, self.out_features, _ = scales_and_zeros.shape  # [in / group_size, out, 2]
        self.in_features, self.group_size = groups * group_size, group_size
        self.dense = dense  # packed with the model's other linear layers (`hf.packed_linear`)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("scales_and_zeros", scales_and_zeros, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.numel() > INT4_MAX_ROWS * self.in_features:
            return self.dense(x)
        return self.decode_product()(x)

    def decode_product(self) -> Int4Product:
        """This layer's int4 product with its tensors bound, for a decode step's few rows."""
        packed, scales = self.packed_weight, self.scales_and_zeros
        assert isinstance(packed, torch.Tensor) and isinstance(scales, torch.Tensor)  # buffers, set in `_hold`
        kernel = int4_kernel(packed.device)
        return Int4Product(packed, scales, self.group_size, self.in_features, self.out_features, self.bias, kernel)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


@dataclass(frozen=True, slots=True)
class Int4Product:
    """An int4 layer's product of any rows, its tensors held as plain fields: what a decode step
    calls (`hf.step`), without a module's attribute lookups and dense branch on each of its
    120 calls (15.1 against 14.3 ms a step at 512 tokens; docs/research-log.md, "Issue 33, third
    pass"). It reads the tensors the layer held when it was made."""

    packed_weight: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: int
    in_features: int
    out_features: int
    bias: torch.Tensor | None
    kernel: Any = _INT4_MM  # the device's int4 product (`int4_kernel`)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.bfloat16:
            rows = rows.to(torch.bfloat16)
        out = self.kernel(rows, self.packed_weight, self.group_size, self.scales_and_zeros)
        if out.dtype != x.dtype:
            out = out.to(x.dtype)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def fused_int4(layers: list[Any]) -> Int4Linear | None:
    """One int4 layer computing `layers` side by side (q, k and v; gate and up), for a decode step
    that makes one call where it made three; None unless all are int4 layers on the same inputs.

    The kernel packs rows in blocks, so the fused weight is the parts' rows one after the other
    where each part fills whole blocks (checked on a probe: else None); each part then reads a
    view of it, so the weights are held once.
    """
    if not all(isinstance(layer, Int4Linear) for layer in layers):
        return None
    first = layers[0]
    if any(layer.in_features != first.in_features or layer.group_size != first.group_size for layer in layers):
        return None
    biases = [layer.bias for layer in layers]
    given = next((b for b in biases if b is not None), None)
    bias = None
    if given is not None:
        bias = torch.cat([b if b is not None else given.new_zeros(n.out_features) for b, n in zip(biases, layers)])
    fused = Int4Linear.from_packed(
        torch.cat([layer.packed_weight for layer in layers]),
        torch.cat([layer.scales_and_zeros for layer in layers], dim=1),
        first.group_size,
        bias,
    )
    probe = torch.randn(1, first.in_features, generator=torch.Generator().manual_seed(0))
    probe = probe.to(first.packed_weight.device, torch.bfloat16)
    if not torch.equal(fused(probe), torch.cat([layer(probe) for layer in layers], dim=-1)):
        return None  # the kernel packs in blocks of rows these parts do not fill (seen with 32-row parts)
    start, weight = 0, fused.packed_weight
    assert isinstance(weight, torch.Tensor)  # a buffer, registered above
    for layer in layers:  # the parts read their rows of the fused weight: held once
        layer.packed_weight = weight[start : start + layer.out_features]
        start += layer.out_features
    return fused


def int4_supported(model: Any) -> str | None:
    """Why `model` cannot take int4 linear layers here, or None."""
    weight = next(model.parameters())
    device = weight.device
    if device.type not in ("cpu", "cuda"):
        return f"int4 weights run on a CPU or a CUDA GPU (the model is on {device.type})"
    if int4_kernel(device) is None:
        return f"this torch ({torch.__version__}) has no {device.type.upper()} int4 kernel"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < CUDA_INT4_CAPABILITY:
        return f"the CUDA int4 kernel needs compute capability {CUDA_INT4_CAPABILITY}, this GPU has less"
    if weight_format(model) != "float":
        return f"the model is quantized already ({weight_format(model)})"
    return None


def quantize_linear_layers(
    model: Any, group_size: int = 32, weights: dict[str, Int4Weight] | None = None, keep_dense: bool = True
) -> int:
    """Swap the decoder layers' `nn.Linear`s for `Int4Linear`s; returns how many.

    `weights`: ready codes by module name (a GGUF file's blocks); other layers are quantized from
    their own weights. The output head stays as it is (its rounding moves every logit, and it is
    tied to the embedding in small models). `keep_dense` keeps each layer's dense weight for
    passes of many rows (prefill, repair), at the cost of holding both. The model is changed in
    place, and its fingerprint names the format: KV written under one weight format is never
    read under another.
    """
    reason = int4_supported(model)
    if reason is not None:
        raise ValueError(reason)
    weights = weights or {}
    remember_weight_digest(model)  # as loaded, before the plain weights go
    swapped = 0
    for name, module in list(model.base_model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear:
                continue
            full = f"{name}.{child_name}" if name else child_name
            int4 = weights.get(full) or quantize_int4(child.weight, group_size)
            dense = child if keep_dense else None
            setattr(module, child_name, Int4Linear(int4, child.bias, dense, child.weight.device))
            swapped += 1
    setattr(model, WEIGHT_FORMAT, f"int4-g{group_size}")
    return swapped
