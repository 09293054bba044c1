"""The few-queries attention path gives sdpa's attention, for float and boolean masks and GQA."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvboost_rag.kv_cache import few_queries_attention, mixed_attention_mask


@pytest.mark.parametrize("boolean_mask", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4)])
def test_matches_sdpa(boolean_mask: bool, heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    length, queries, head_dim = 64, 12, 16
    query = torch.randn(1, heads, queries, head_dim)
    key = torch.randn(1, kv_heads, length, head_dim)
    value = torch.randn(1, kv_heads, length, head_dim)
    # Selected tokens scattered over the prompt, slots in position order: an exact causal mask.
    query_positions = torch.sort(torch.randperm(length)[:queries]).values
    mask = mixed_attention_mask(query_positions, torch.arange(length), torch.float32)
    if boolean_mask:
        mask = mask == 0
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    ours, _ = few_queries_attention(module, query, key, value, mask, scaling=0.25)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == reference.shape == (1, queries, heads, head_dim)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_many_queries_or_no_mask_go_to_sdpa() -> None:
    query = torch.randn(1, 2, 32, 8)
    key = value = torch.randn(1, 2, 32, 8)
    module = types.SimpleNamespace(num_key_value_groups=1, is_causal=True)
    ours, _ = few_queries_attention(module, query, key, value, None)
    reference, _ = sdpa_attention_forward(module, query, key, value, None)
    assert torch.equal(ours, reference)


def test_the_engine_uses_it(engine) -> None:
    assert engine.model.config._attn_implementation == "kvboost_sdpa"
