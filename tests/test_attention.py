"""The few-queries attention path gives sdpa's attention, for float and boolean masks and GQA."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvboost_rag.hf.attention import few_queries_attention
from kvboost_rag.hf.cache import decode_kv_of, make_cache
from kvboost_rag.hf.pass_hooks import PassHooks
from kvboost_rag.ops.attention import (
    blockwise_grouped_attention,
    causal_blocks,
    grouped_attention,
    position_mask,
    single_query_attention,
)


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
    mask = position_mask(query_positions, torch.arange(length), torch.float32)
    if boolean_mask:
        mask = mask == 0
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    ours, _ = few_queries_attention(module, query, key, value, mask, scaling=0.25)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == reference.shape == (1, queries, heads, head_dim)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_bfloat16_is_as_close_to_fp32_attention_as_sdpa_in_bfloat16() -> None:
    """Scores stay in bf16 (sdpa keeps them in fp32): the error may grow, within a small factor."""
    torch.manual_seed(0)
    heads, kv_heads, length, queries, head_dim = 9, 3, 400, 60, 64
    query = torch.randn(1, heads, queries, head_dim) * 2
    key = torch.randn(1, kv_heads, length, head_dim) * 2
    value = torch.randn(1, kv_heads, length, head_dim)
    positions = torch.sort(torch.randperm(length)[:queries]).values
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)

    def attend(function, dtype: torch.dtype) -> torch.Tensor:
        mask = position_mask(positions, torch.arange(length), dtype)
        tensors = (t.to(dtype) for t in (query, key, value))
        return function(module, *tensors, mask)[0].float()

    exact = attend(sdpa_attention_forward, torch.float32)
    ours = (attend(few_queries_attention, torch.bfloat16) - exact).abs()
    sdpa = (attend(sdpa_attention_forward, torch.bfloat16) - exact).abs()
    assert ours.mean() <= 2.5 * sdpa.mean()
    assert ours.max() <= 2.5 * sdpa.max()


def test_many_queries_or_no_mask_go_to_sdpa() -> None:
    query = torch.randn(1, 2, 32, 8)
    key = value = torch.randn(1, 2, 32, 8)
    module = types.SimpleNamespace(num_key_value_groups=1, is_causal=True)
    ours, _ = few_queries_attention(module, query, key, value, None)
    reference, _ = sdpa_attention_forward(module, query, key, value, None)
    assert torch.equal(ours, reference)


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4)])
def test_a_decode_step_matches_sdpa(heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    query = torch.randn(1, heads, 1, 64) * 2
    key, value = torch.randn(1, kv_heads, 300, 64) * 2, torch.randn(1, kv_heads, 300, 64)
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    reference, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.125)
    ours = single_query_attention(query, key, value, 0.125)
    assert ours.shape == reference.shape == (1, 1, heads, 64)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_a_bfloat16_decode_step_takes_the_fast_path_at_sdpa_precision() -> None:
    """One bf16 query with no mask on a CPU: fp32 scores, so no further from fp32 attention than
    sdpa's own bf16 kernel; fp32 decode steps stay on sdpa."""
    torch.manual_seed(0)
    query = torch.randn(1, 9, 1, 64) * 3
    key, value = torch.randn(1, 3, 900, 64) * 2, torch.randn(1, 3, 900, 64)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    exact, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.125)
    low = [t.bfloat16() for t in (query, key, value)]
    ours, _ = few_queries_attention(module, *low, None, scaling=0.125)
    assert torch.equal(ours, single_query_attention(*low, 0.125))
    sdpa, _ = sdpa_attention_forward(module, *low, None, scaling=0.125)
    ours_error, sdpa_error = (ours.float() - exact).abs(), (sdpa.float() - exact).abs()
    assert ours_error.max() <= 1.5 * sdpa_error.max()
    assert ours_error.mean() <= 1.5 * sdpa_error.mean()
    in_fp32, _ = few_queries_attention(module, query, key, value, None, scaling=0.125)
    assert torch.equal(in_fp32, exact)


def test_a_bfloat16_decode_step_reads_the_caches_float_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a forward pass over a cache of ours, a decode step reads the layer's float32 copies of
    its keys and values, kept up to date token by token, and attends exactly as over converted ones."""
    read: list[bool] = []

    def recording(of: object, layer_idx: int | None, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        found = decode_kv_of(of, layer_idx, key)  # type: ignore[arg-type]
        values = cache.layers[1].values
        read.append(
            found is not None
            and values is not None
            and torch.equal(found[0], key.float())
            and torch.equal(found[1], values.float())
        )
        return found

    monkeypatch.setattr("kvboost_rag.hf.attention.decode_kv_of", recording)
    torch.manual_seed(2)
    keys, values = torch.randn(2, 3, 40, 64).bfloat16(), torch.randn(2, 3, 40, 64).bfloat16()
    cache = make_cache(keys, values)
    layer = cache.layers[1]
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, layer_idx=1)
    query = torch.randn(1, 9, 1, 64).bfloat16()
    for step in range(300):  # past the buffer's headroom: it grows, and the copies are made again
        new_key, new_value = torch.randn(1, 3, 1, 64).bfloat16(), torch.randn(1, 3, 1, 64).bfloat16()
        key, value = cache.update(new_key, new_value, 1)
        hooks = PassHooks(cache=cache).keywords()  # a pass over this cache hands it to the attention
        ours, _ = few_queries_attention(module, query, key, value, None, scaling=0.125, **hooks)
        assert decode_kv_of(cache, 0, key) is None, "another layer's keys are not this tensor"
        if step % 50 == 0 or step == 299:
            float_keys, float_values = layer.decode_kv()
            assert torch.equal(float_keys, key.float()) and torch.equal(float_values, value.float())
            reference = single_query_attention(query.float(), key.float(), value.float(), 0.125).bfloat16()
            assert torch.equal(ours, reference), "the same numbers as attention over converted K/V"
    assert read == [True] * 300, "every step read the layer's copies, equal to its keys and values"
    assert decode_kv_of(None, 1, key) is None, "a pass that names no cache reads no copies"
    assert few_queries_attention(module, query, key, value, None, scaling=0.125)[0] is not None
    layer.crop(-10)
    float_keys, float_values = layer.decode_kv()
    assert torch.equal(float_keys, layer.keys.float()) and float_keys.shape[2] == 330
    assert torch.equal(float_values, layer.values.float()) and float_values.shape[2] == 330


def test_a_long_bfloat16_cache_is_attended_over_its_whole_value_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """From FLOAT_VALUES_BELOW_TOKENS on, the values stay bf16 and a decode step reads their whole
    buffer (oneDNN's fast path) with zero weight past the cache: the attention of the view, up to
    the rounding of a bf16 product."""
    monkeypatch.setattr("kvboost_rag.hf.cache.FLOAT_VALUES_BELOW_TOKENS", 64)
    torch.manual_seed(3)
    cache = make_cache(torch.randn(1, 3, 100, 64).bfloat16(), torch.randn(1, 3, 100, 64).bfloat16())
    cache.layers[0].crop(-20)  # stale values past the cache: weighted by zero all the same
    layer = cache.layers[0]
    float_keys, values = layer.decode_kv()
    assert float_keys.shape[2] == 80 and torch.equal(float_keys, layer.keys.float())
    assert values.dtype == torch.bfloat16 and values.shape[2] > 80 and values.is_contiguous()
    query = torch.randn(1, 9, 1, 64).bfloat16()
    ours = single_query_attention(query, layer.keys, layer.values, 0.125, (float_keys, values))
    over_view = single_query_attention(query, layer.keys, layer.values, 0.125)
    assert ours.dtype == torch.bfloat16 and ours.shape == (1, 1, 9, 64)
    torch.testing.assert_close(ours.float(), over_view.float(), atol=1e-2, rtol=1e-2)


def test_a_single_query_with_a_mask_keeps_its_mask() -> None:
    """One bf16 query over interleaved slots (a one-token reuse prefill) carries a mask that drops
    keys: it must not take the decode step's path, which reads every key."""
    torch.manual_seed(1)
    query = torch.randn(1, 9, 1, 64).bfloat16()
    key, value = torch.randn(1, 3, 200, 64).bfloat16(), torch.randn(1, 3, 200, 64).bfloat16()
    mask = position_mask(torch.tensor([100]), torch.arange(200), torch.bfloat16)  # keys past 100 dropped
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    ours, _ = few_queries_attention(module, query, key, value, mask, scaling=0.125)
    masked, _ = sdpa_attention_forward(module, query, key[:, :, :101], value[:, :, :101], None, scaling=0.125)
    torch.testing.assert_close(ours.float(), masked.float(), atol=2e-2, rtol=0)
    assert not torch.allclose(ours.float(), single_query_attention(query, key, value, 0.125).float(), atol=2e-2)


def test_the_engine_uses_it(engine) -> None:
    assert engine.model.config._attn_implementation == "kvboost_sdpa"


def test_blockwise_attention_skips_only_the_keys_the_mask_drops() -> None:
    """CacheBlend's selected queries by position: each run of them reads the keys up to its
    last position only, and gets what attention over every key gives."""
    torch.manual_seed(0)
    heads, kv_heads, length, head_dim = 9, 3, 300, 16
    query_positions = torch.sort(torch.randperm(length)[:70]).values
    query = torch.randn(1, heads, 70, head_dim)
    key, value = torch.randn(1, kv_heads, length, head_dim), torch.randn(1, kv_heads, length, head_dim)
    mask = position_mask(query_positions, torch.arange(length), torch.float32)
    blocks = causal_blocks(query_positions, 4)
    assert [(a, b) for a, b, _ in blocks] == [(0, 17), (17, 35), (35, 52), (52, 70)]
    assert [end for _, _, end in blocks] == [int(query_positions[b - 1]) + 1 for _, b, _ in blocks]
    ours = blockwise_grouped_attention(query, key, value, mask, 0.25, query_positions, rows_per_block=16)
    torch.testing.assert_close(ours, grouped_attention(query, key, value, mask, 0.25), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_pass_hands_its_hooks_to_the_attention_through_the_models_forward(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread or context state: a decode step names its cache and a CacheBlend pass its blend,
    and every layer's attention call of a real forward receives them (`hf.pass_hooks`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import kvboost_rag.hf.attention as attention
    from kvboost_rag.hf.attention import use_reuse_attention
    from kvboost_rag.hf.blend import SelectiveCache, selective_forward
    from kvboost_rag.hf.cache import forward_last_logits

    config = AutoConfig.for_model(
        family,
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(torch.bfloat16).eval()
    use_reuse_attention(model)
    seen: list[PassHooks] = []
    attend = attention.few_queries_attention

    def recording(*args: object, **kwargs: object) -> object:
        hooks = kwargs.get(attention.HOOKS_KEYWORD)
        if isinstance(hooks, PassHooks):
            seen.append(hooks)
        return attend(*args, **kwargs)

    monkeypatch.setattr(attention, "few_queries_attention", recording)
    from transformers import AttentionInterface

    AttentionInterface.register(attention.REUSE_ATTENTION, recording)
    try:
        cache = make_cache()
        forward_last_logits(model, torch.arange(10), torch.arange(10), cache)
        forward_last_logits(model, torch.tensor([3]), torch.tensor([10]), cache)  # a decode step
        assert len(seen) == 6 and all(hooks.cache is cache for hooks in seen), "every layer, both passes"
        seen.clear()
        keys, values = torch.zeros(3, 2, 12, 16, dtype=torch.bfloat16), torch.zeros(3, 2, 12, 16, dtype=torch.bfloat16)
        blend = SelectiveCache(keys, values, 1, lambda layer, k, v: torch.tensor([4, 11]))
        selective_forward(model, torch.arange(12), blend)
        assert [hooks.blend is blend for hooks in seen].count(True) >= 3, "each layer of the blend pass"
    finally:
        AttentionInterface.register(attention.REUSE_ATTENTION, attend)
