"""The attention implementation the engine runs under: sdpa, except for few queries on a CPU.

Every reuse pass is a few queries over a long cache with an explicit mask: a prompt's uncached
tokens, boundary runs, CacheBlend's selected tokens. There the CPU flash kernel with a mask,
after copying K/V for every query head, took ~3x the time of `ops.attention.grouped_attention`
(benchmarks/bench_attention.py). In bf16 that is ~2x sdpa's error against fp32 attention and
no measurable change in first-token KL. A decode step in bf16 on a CPU (one query, no mask) is
the same shape, and sdpa's kernel took 3-6x as long there too (`ops.attention.single_query_attention`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..ops.attention import (
    blockwise_grouped_attention,
    grouped_attention,
    single_query_attention,
    single_query_on_matmuls,
)
from .blend import SelectiveCache
from .cache import decode_kv_of
from .pass_hooks import HOOKS_KEYWORD, NO_HOOKS, PassHooks

REUSE_ATTENTION = "kvboost_sdpa"


def few_queries_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: grouped attention where it pays, sdpa elsewhere, steered
    by the pass's hooks (`pass_hooks`); the attention a scored pass's last queries pay each key is
    recorded on the way."""
    hooks: PassHooks = kwargs.pop(HOOKS_KEYWORD, None) or NO_HOOKS
    if hooks.scores is not None:
        scaled = scaling if scaling is not None else query.shape[-1] ** -0.5
        hooks.scores.observe(getattr(module, "layer_idx", None), query, key, attention_mask, scaled)
    blend = hooks.blend
    if blend is not None and blend.narrows(module, query):
        return _attend_selected(blend, module, query, key, value, dropout, scaling, **kwargs)
    heads, queries, head_dim = query.shape[1], query.shape[2], query.shape[3]
    scale = scaling if scaling is not None else head_dim**-0.5
    if (
        blend is not None
        and blend.selected_mask is not None
        and attention_mask is blend.selected_mask
        and query.device.type == "cpu"
        and not dropout
        and kwargs.get("softcap") is None
        and not heads % key.shape[1]
    ):  # CacheBlend's selected queries, by position, over K/V in position order
        assert blend.selected is not None  # set with selected_mask
        return blockwise_grouped_attention(query, key, value, attention_mask, scale, blend.selected), None
    sparse = hooks.sparse
    if sparse is not None and not dropout and kwargs.get("softcap") is None and kwargs.get("sliding_window") is None:
        selected = sparse.attend(module.layer_idx, query, key, value, scale)
        if selected is not None:
            return selected, None
    kv_heads, length = key.shape[1], key.shape[2]
    if (
        attention_mask is None
        and queries == 1
        and single_query_on_matmuls(query)
        and not dropout
        and not heads % kv_heads
        and all(kwargs.get(name) is None for name in ("softcap", "sliding_window", "position_bias"))
    ):  # a decode step over the whole cache
        decode_kv = decode_kv_of(hooks.cache, getattr(module, "layer_idx", None), key)
        return single_query_attention(query, key, value, scale, decode_kv), None
    if (
        attention_mask is None
        or query.device.type != "cpu"
        or 4 * queries > length
        or dropout
        or heads % kv_heads
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return grouped_attention(query, key, value, attention_mask, scale), None


def _attend_selected(
    blend: SelectiveCache,
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The check layer's attention for the selected queries only; other rows are zeros, as the
    next layer drops those tokens."""
    assert blend.selected is not None and blend.selected_mask is not None
    selected, _ = few_queries_attention(  # no longer every token: it does not narrow again
        module,
        query.index_select(2, blend.selected),
        key,
        value,
        blend.selected_mask,
        *args,
        **kwargs | PassHooks(blend=blend).keywords(),  # the blockwise path below reads the blend
    )
    out = selected.new_zeros(query.shape[0], query.shape[2], *selected.shape[2:])
    return out.index_copy_(1, blend.selected, selected), None


def use_reuse_attention(model: Any) -> None:
    """Switch a model on sdpa to `few_queries_attention`; other implementations are kept."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(REUSE_ATTENTION, few_queries_attention)
    # NOTE: without sdpa's mask function the model would build no mask for an unknown name, and
    # sdpa would then crop a longer cache to the query length.
    AttentionMaskInterface.register(REUSE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(REUSE_ATTENTION)
