"""transformers' cache and forward API, behind four functions.

KV travels through kvboost-rag as stacked tensors [layers, kv_heads, tokens, head_dim]; this
module turns them into a `DynamicCache`, runs the model, and reads the cache back. It changed
under its users twice in 2025 (legacy tuples are gone in v5), so it is touched here only.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def make_cache(keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> DynamicCache:
    """A cache over stacked K/V [L, H, n, D] (or empty), without copying them.

    NOTE: the layers take views of the given tensors; the model's appends allocate new ones, so
    the tensors passed in are never written.
    """
    if keys is None or values is None or keys.shape[2] == 0:
        return DynamicCache()
    cache = DynamicCache()
    for i in range(keys.shape[0]):
        layer = DynamicLayer()
        layer.lazy_initialization(keys[i : i + 1], values[i : i + 1])
        layer.keys, layer.values = keys[i : i + 1], values[i : i + 1]
        cache.layers.append(layer)
    return cache


def stacked_kv(cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's K/V as fresh stacked tensors [L, H, n, D]."""
    keys = torch.stack([layer.keys[0] for layer in cache.layers])
    values = torch.stack([layer.values[0] for layer in cache.layers])
    return keys, values


def gather_slots(cache: DynamicCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The given slots of every layer as fresh stacked tensors [L, H, len(slots), D]."""
    keys = torch.stack([layer.keys[0].index_select(1, slots) for layer in cache.layers])
    values = torch.stack([layer.values[0].index_select(1, slots) for layer in cache.layers])
    return keys, values


@torch.inference_mode()
def forward_last_logits(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cache: DynamicCache,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run tokens [q] at `position_ids` [q] over `cache` (which grows); logits of the last, fp32."""
    out = model(
        input_ids=input_ids.view(1, -1),
        position_ids=position_ids.view(1, -1),
        cache=cache,
        attention_mask=attention_mask,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[0, -1].float()
