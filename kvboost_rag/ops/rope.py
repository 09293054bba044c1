"""Move cached keys to new positions by rotating them further (RoPE delta rotation).

Cached keys are post-RoPE: k_a = R(a) k. Rotations compose, so R(b - a) k_a = R(b) k; the delta
rotation uses the model's own rotary module for its frequencies, in fp32, with yarn's magnitude
factor divided out. Partial rotary (the first `rotary_dim` channels) is handled.
"""

from __future__ import annotations

from typing import Any

import torch


def delta_cos_sin(rotary_emb: Any, deltas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the rotation by each delta, shape [n, rotary_dim], fp32."""
    probe = torch.empty(0, dtype=torch.float32, device=deltas.device)
    cos, sin = rotary_emb(probe, deltas.reshape(1, -1).to(torch.long))
    scale = float(getattr(rotary_emb, "attention_scaling", 1.0) or 1.0)
    return cos[0].float() / scale, sin[0].float() / scale


def rerotate_keys(keys: torch.Tensor, deltas: torch.Tensor, rotary_emb: Any, *, in_place: bool = False) -> torch.Tensor:
    """Keys [outer, ..., n, head_dim] rotated by deltas [n]; returned in the keys' dtype.

    `in_place` writes them back into `keys`, which saves a copy of a whole prompt's keys.
    """
    if keys.shape[-2] != deltas.numel():
        raise ValueError(f"{deltas.numel()} deltas for {keys.shape[-2]} key positions")
    if not torch.any(deltas):
        return keys
    cos, sin = delta_cos_sin(rotary_emb, deltas.to(keys.device))
    half = cos.shape[-1] // 2  # rotary halves repeat the same frequencies: cos = cat(c, c)
    cos, sin = cos[:, :half], sin[:, :half]
    rotated = keys if in_place else torch.empty_like(keys)
    if not in_place:
        rotated[..., 2 * half :] = keys[..., 2 * half :]  # partial rotary: the rest stays as it is
    # NOTE: one outer slice (a layer) at a time keeps the fp32 temporaries in cache: ~9x faster
    # than converting the whole stack at once on a CPU.
    for outer in range(keys.shape[0]):
        k = keys[outer, ..., : 2 * half].to(torch.float32, copy=True)  # a copy: `rotated` may be `keys`
        first, second = k[..., :half], k[..., half : 2 * half]
        rotated[outer, ..., :half] = first * cos - second * sin
        rotated[outer, ..., half : 2 * half] = second * cos + first * sin
    return rotated
