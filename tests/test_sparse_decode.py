"""Sparse decode (decode-time KV page selection): Quest's bound, the selection, and the engine's decode with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvboost_rag import EngineConfig, KVBoostRAG, SparseDecodeConfig
from kvboost_rag.ops.attention import single_query_attention
from kvboost_rag.ops.page_selection import Selection, attend_selected, page_bounds, page_summaries, select_pages
from kvboost_rag.ops.sparse_decode import SparseDecode

SMALL = dict(enabled=True, page_size=8, budget_tokens=160, sink_tokens=16, recent_tokens=32, min_prompt_tokens=1)


def test_the_bound_is_never_below_a_tokens_score() -> None:
    torch.manual_seed(0)
    keys = torch.randn(2, 64, 16)
    query = torch.randn(6, 16)  # 3 query heads per KV head
    mins, maxs = page_summaries(keys, 8)
    bounds = page_bounds(query, mins, maxs)
    scores = torch.einsum("kgd,knd->kgn", query.view(2, 3, 16), keys)  # [kv, group, n]
    best_per_page = scores.view(2, 3, 8, 8).amax(dim=-1).sum(dim=1)  # each head's best token, pooled
    assert bounds.shape == (2, 8) and bool((bounds >= best_per_page - 1e-5).all())


def test_the_page_of_the_highest_scoring_token_is_kept() -> None:
    """A constructed case: one key aligned with the query in a page of small keys elsewhere."""
    torch.manual_seed(1)
    keys = torch.randn(1, 256, 16) * 0.05
    query = torch.randn(1, 16)
    keys[0, 131] = 4 * query[0] / query[0].norm()  # page 16 (tokens 128-135)
    bounds = page_bounds(query, *page_summaries(keys, 8))
    tokens = select_pages(bounds, 256, 8, budget=8 + 8 + 8, sink=8, recent=8).tokens()
    assert 131 in tokens[0].tolist()
    assert tokens[0].tolist() == sorted(set(tokens[0].tolist())), "ascending, no repeats"
    assert tokens[0, :8].tolist() == list(range(8)) and tokens[0, -8:].tolist() == list(range(248, 256))


def test_attending_to_every_token_is_dense_attention() -> None:
    torch.manual_seed(2)
    keys, values, query = torch.randn(2, 40, 8), torch.randn(2, 40, 8), torch.randn(6, 8)
    every = Selection(8, torch.arange(1, 3).expand(2, -1), 24, 40, 8)  # sink, both middle pages, recent
    assert every.tokens()[0].tolist() == list(range(40))
    selected = attend_selected(query, keys, values, every, 8**-0.5)
    dense = torch.nn.functional.scaled_dot_product_attention(
        query.view(1, 6, 1, 8), keys.repeat_interleave(3, 0).unsqueeze(0), values.repeat_interleave(3, 0).unsqueeze(0)
    )
    assert torch.allclose(selected, dense.view(6, 8), atol=1e-6)


def test_attending_to_every_token_in_bfloat16_is_the_dense_decode_step() -> None:
    """In bf16 on a CPU the selection is attended as a dense decode step is, so a budget that
    selects everything reads the same attention as no retrieval, to the bit."""
    torch.manual_seed(3)
    keys, values, query = (torch.randn(*shape).bfloat16() for shape in ((2, 40, 8), (2, 40, 8), (6, 8)))
    every = Selection(8, torch.arange(1, 3).expand(2, -1), 24, 40, 8)
    selected = attend_selected(query, keys, values, every, 8**-0.5)
    dense = single_query_attention(query.view(1, 6, 1, 8), keys.unsqueeze(0), values.unsqueeze(0), 8**-0.5)
    assert torch.equal(selected, dense.reshape(6, 8))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="fit budget_tokens"):
        SparseDecodeConfig(budget_tokens=100, sink_tokens=64, recent_tokens=64)
    with pytest.raises(ValueError, match="page_size"):
        SparseDecodeConfig(page_size=0)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")


def engine_with(tiny: KVBoostRAG, **options: object) -> KVBoostRAG:
    config = EngineConfig(store="memory", sparse_decode=SparseDecodeConfig(**options))  # type: ignore[arg-type]
    return KVBoostRAG(tiny.model, tiny.tokenizer, config, name=tiny.name)


def answer(engine: KVBoostRAG, prompt: str):  # type: ignore[no-untyped-def]
    return engine.generate(prompt, mode="full", max_new_tokens=12, ignore_eos=True, store_prompt=False)


def test_a_budget_covering_the_prompt_decodes_as_dense_to_the_bit(tiny: KVBoostRAG, passages: list[str]) -> None:
    prompt = "\n\n".join(passages[:4])
    dense = answer(engine_with(tiny), prompt)
    covered = answer(engine_with(tiny, **{**SMALL, "budget_tokens": 4096}), prompt)
    assert covered.sparse_decode is not None and covered.sparse_decode.steps == 0
    assert covered.token_ids == dense.token_ids and dense.sparse_decode is None


def test_a_small_budget_attends_to_selected_pages(tiny: KVBoostRAG, passages: list[str]) -> None:
    prompt = "\n\n".join(passages[:4])
    result = answer(engine_with(tiny, **SMALL), prompt)
    assert result.prompt_tokens > 400 and result.new_tokens == 12
    assert result.sparse_decode is not None and result.sparse_decode.steps == 11 * 2, "every decode step, both layers"


def test_speculative_selection_corrected_at_threshold_one_is_exact_selection(
    tiny: KVBoostRAG, passages: list[str]
) -> None:
    prompt = "\n\n".join(passages[:4])
    exact = answer(engine_with(tiny, **SMALL, speculative=False), prompt)
    corrected = answer(engine_with(tiny, **SMALL, correction_threshold=1.0), prompt)
    assert corrected.token_ids == exact.token_ids
    assert corrected.sparse_decode is not None and corrected.sparse_decode.corrected_share == 1.0
    loose = answer(engine_with(tiny, **SMALL, correction_threshold=-1.0), prompt)
    assert loose.sparse_decode is not None and loose.sparse_decode.corrected_share == 0.0, "never re-selects"


def test_the_layers_selections_made_together_are_each_layers_own() -> None:
    """The speculative selections of every layer, made in one batch at the next step's first
    layer, choose the pages each layer's previous query chooses on its own."""
    torch.manual_seed(4)
    config = SparseDecodeConfig(**{**SMALL, "correction_threshold": -1.0})  # never re-select: the batch is used
    sparse = SparseDecode(config)
    keys = [torch.randn(1, 2, 300, 16) for _ in range(3)]
    values = [torch.randn(1, 2, 300, 16) for _ in range(3)]
    first = [torch.randn(1, 6, 1, 16) for _ in range(3)]
    for layer in range(3):  # step 1: each layer selects with its own query
        sparse.attend(layer, first[layer], keys[layer][:, :, :299], values[layer][:, :, :299], 0.25)
    second = [torch.randn(1, 6, 1, 16) for _ in range(3)]
    for layer in range(3):  # step 2: the batch runs at layer 0, then every layer attends to its part
        assert (sparse._layers[layer].selection is not None) == (layer > 0), "made by the batch at layer 0"
        out = sparse.attend(layer, second[layer], keys[layer], values[layer], 0.25)
        state = sparse._layers[layer]
        own = select_pages(page_bounds(first[layer][0, :, 0], state.mins, state.maxs), 300, 8, 160, 16, 32)
        expected = attend_selected(second[layer][0, :, 0], keys[layer][0], values[layer][0], own, 0.25)
        assert out is not None and torch.equal(out.view(6, 16), expected)
    assert sparse.stats.corrected_share == 0.0 and sparse.stats.steps == 6
