"""The one module that touches transformers' cache and forward API.

KV travels through kvboost-rag as stacked tensors [layers, kv_heads, tokens, head_dim]; this
module turns them into a `DynamicCache`, runs the model, and reads the cache back.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def make_cache(keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> DynamicCache:
    """A cache holding stacked K/V [L, H, n, D] (or empty)."""
    if keys is None or values is None or keys.shape[2] == 0:
        return DynamicCache()
    return DynamicCache([(keys[i].unsqueeze(0), values[i].unsqueeze(0)) for i in range(keys.shape[0])])


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


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


def mixed_attention_mask(
    query_positions: torch.Tensor, slot_positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Exact causal mask by position, for slots not in position order: [1, 1, q, kv].

    Additive 0/-inf floats, which both eager (adds the mask) and sdpa read correctly; a boolean
    mask is silently wrong under eager attention.
    """
    allowed = slot_positions.view(1, -1) <= query_positions.view(-1, 1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=query_positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)


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


def model_shape(model: Any) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def rotary_module(model: Any) -> Any:
    return model.base_model.rotary_emb
