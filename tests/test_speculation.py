"""Prompt lookup: drafts found by index, verified in one pass whose rows are the steps' own
logits, so an answer is the same with drafts as without, greedy or sampled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.config import MAX_DRAFT_TOKENS
from kvboost_rag.engine.speculation import Drafted, PromptLookup
from kvboost_rag.engine.stream import finish_all
from kvboost_rag.hf.attention import use_reuse_attention
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.cpu import ONEDNN_BF16_MISSING, onednn_bf16
from kvboost_rag.hf.int4_linear import Int4Product, quantize_linear_layers
from kvboost_rag.hf.step import InParts, step_for, step_tokens
from kvboost_rag.server.metrics import ServingMetrics

needs_onednn_bf16 = pytest.mark.skipif(not onednn_bf16(), reason=ONEDNN_BF16_MISSING)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def test_a_draft_follows_the_longest_run_that_appeared_last() -> None:
    lookup = PromptLookup([5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 4])
    lookup.extend([0, 6, 7])  # ends with 6 7, which appeared twice: the later one is followed by 2 3 4
    assert lookup.draft(3) == [2, 3]  # no more tokens than the matched run (6 7) ...
    lookup.extend([2])  # ... 6 7 2 matches three tokens now
    assert lookup.draft(3) == [3, 4, 0]
    assert lookup.draft(1) == [3]


def test_a_draft_needs_an_earlier_occurrence_and_never_finds_itself() -> None:
    assert PromptLookup([1, 2, 3]).draft(3) == [], "2 3 appears once: nothing followed it before"
    assert PromptLookup([4]).draft(2) == []
    assert PromptLookup([]).draft(2) == []
    assert PromptLookup([5, 9, 7, 9]).draft(2) == [], "one matching token drafts nothing (LOOKUP_MIN)"
    lookup = PromptLookup([9, 9, 9])
    assert lookup.draft(2) == [9], "the run 9 9 ended at position 2, followed by 9"


def test_the_index_grows_with_the_answer() -> None:
    prompt = list(range(1000, 1200)) * 2  # 200 distinct tokens, twice
    lookup = PromptLookup(list(prompt))
    assert lookup.draft(3) == [1000, 1001, 1002]
    lookup.extend([1000, 1001, 1002])
    assert lookup.draft(3) == [1003, 1004, 1005], "the later occurrence, in the prompt's second half"
    lookup.extend([1003, 1004, 7, 1003, 1004])
    assert lookup.draft(3) == [7, 1003], "the answer's own run of two, the latest: two tokens"


def test_drafted_logits_are_taken_in_order_and_only_for_their_token() -> None:
    rows = [torch.full((4,), 1.0), torch.full((4,), 2.0)]
    drafted = Drafted([7, 8], list(rows))
    assert drafted.take(8) is None and drafted.tokens == [7, 8], "not the next drafted token: nothing used"
    assert drafted.take(7) is rows[0]
    assert drafted.take(8) is rows[1] and drafted.tokens == []


def _rows_and_steps(model: torch.nn.Module, count: int) -> tuple[torch.Tensor, torch.Tensor, list, list]:
    """Logits of `count` tokens after a prefill: one pass of rows, then one step each; both caches."""
    step = step_for(model)
    assert step is not None
    tokens = torch.randint(10, 1000, (41 + count,), generator=torch.Generator().manual_seed(1))
    prompt, new = tokens[:41], tokens[41:]
    caches, results = [], []
    for one_at_a_time in (False, True):
        cache = make_cache()
        forward_last_logits(model, prompt, torch.arange(41), cache)
        results.append(step_tokens(step, new, 41, cache, one_at_a_time=one_at_a_time))
        caches.append(cache)
    return results[0], results[1], caches[0].layers, caches[1].layers


def _tiny(tmp_path: Path, config: object, dtype: torch.dtype) -> torch.nn.Module:
    config.vocab_size = 1024  # type: ignore[attr-defined]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    return AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()


@pytest.mark.parametrize("count", range(2, MAX_DRAFT_TOKENS + 2))
@pytest.mark.parametrize("adapted", [False, True], ids=["sdpa", "engine attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "config", [Qwen2Config(**SMALL), MistralConfig(**SMALL, sliding_window=None)], ids=["qwen2", "mistral"]
)
def test_the_probe_tells_where_a_pass_of_rows_gives_each_steps_logits(
    tmp_path: Path, config: object, dtype: torch.dtype, adapted: bool, count: int
) -> None:
    """Whether a pass's rows are its steps depends on the linear layers' kernels (fp32 `nn.Linear`
    may sum in another order for more rows); the probe, on its own short sequence, says which."""
    model = _tiny(tmp_path, config, dtype)
    if adapted:
        use_reuse_attention(model)
    rows, steps, row_cache, step_cache = _rows_and_steps(model, count)
    step = step_for(model)
    assert step is not None
    assert torch.equal(rows, steps) == step.rows_match_steps(count)
    torch.testing.assert_close(rows, steps, atol=1e-2, rtol=0)  # a summation order apart at most
    if step.rows_match_steps(count):
        for a, b in zip(row_cache, step_cache):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("count", range(2, MAX_DRAFT_TOKENS + 2))
def test_int4_products_give_each_rows_numbers(tiny_model_dir: Path, count: int) -> None:
    """The linear layers a draft's pass runs on the default weights: each row's product is its own."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    quantize_linear_layers(model)
    step = step_for(model)
    assert step is not None
    for layer in step.layers:
        parts = (
            layer.q_proj,
            layer.k_proj,
            layer.v_proj,
            layer.o_proj,
            layer.gate_proj,
            layer.up_proj,
            layer.down_proj,
        )
        for product in (*parts, layer.qkv_proj, layer.gate_up_proj):
            if product is None:  # not fused: the tiny model's 32-row parts fill no block of the kernel's
                continue
            assert isinstance(product, InParts) and isinstance(product.linear, Int4Product)
            rows = torch.randn(1, count, product.linear.in_features, generator=torch.Generator().manual_seed(count))
            assert torch.equal(product(rows), torch.cat([product(rows[:, i : i + 1]) for i in range(count)], dim=1))


@needs_onednn_bf16
def test_the_default_models_rows_are_its_steps(default_engine: KVBoostRAG) -> None:
    """The default here (bf16, the GGUF's int4 weights, oneDNN's bf16 head): exact for every draft length."""
    step = step_for(default_engine.model)
    assert step is not None
    for count in range(2, MAX_DRAFT_TOKENS + 2):
        rows, steps, _, _ = _rows_and_steps(default_engine.model, count)
        assert torch.equal(rows, steps) and step.rows_match_steps(count)


@pytest.fixture(scope="module")
def default_engine() -> KVBoostRAG:
    """The default engine of a host with native bf16 (bf16, int4 weights): where drafts run."""
    if not onednn_bf16():
        pytest.skip(ONEDNN_BF16_MISSING)
    return KVBoostRAG.from_pretrained(store="memory")


@pytest.fixture()
def engines(default_engine: KVBoostRAG) -> tuple[KVBoostRAG, KVBoostRAG]:
    """The default model without drafts and with the default's."""
    model, tokenizer, name = default_engine.model, default_engine.tokenizer, default_engine.name
    without = KVBoostRAG(model, tokenizer, EngineConfig(store="memory", draft_tokens=0), name=name, adapt_model=False)
    drafting = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"), name=name, adapt_model=False)
    assert drafting.config.draft_tokens == MAX_DRAFT_TOKENS  # the default drafts
    return without, drafting


SETTINGS = [
    dict(max_new_tokens=40),
    dict(max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3),
    dict(max_new_tokens=40, repetition_penalty=1.3),
    dict(max_new_tokens=40, stop=["."]),
    dict(max_new_tokens=5),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "sampled", "repetition penalty", "stop", "short"])
def test_answers_with_drafts_are_the_answers_without(
    engines: tuple[KVBoostRAG, KVBoostRAG], passages: list[str], settings: dict
) -> None:
    without, drafting = engines
    # a prompt whose answer copies it: the title and the passage, asked to be repeated
    prompt = f"{passages[3]}\n\nRepeat the passage above word for word.\n\n{passages[3][:60]}"
    expected = without.generate(prompt, store_prompt=False, **settings)
    got = drafting.generate(prompt, store_prompt=False, **settings)
    assert got.token_ids == expected.token_ids and got.text == expected.text
    assert got.finish_reason == expected.finish_reason
    assert expected.drafted_tokens == 0
    # (a repetition penalty steers the answer off the prompt's tokens, where drafts come from)
    if settings["max_new_tokens"] > 5 and not {"temperature", "repetition_penalty"} & set(settings):
        assert got.accepted_tokens > 0 and got.drafted_tokens >= got.accepted_tokens


def test_reused_documents_answer_the_same_with_drafts(
    engines: tuple[KVBoostRAG, KVBoostRAG], passages: list[str]
) -> None:
    without, drafting = engines
    for e in engines:
        e.warm(passages[5:8])
    prompt = "\n\n".join(passages[7:4:-1]) + "\n\nQuestion: what are these passages about? Answer:"
    expected = without.generate(prompt, max_new_tokens=32, store_prompt=False)
    got = drafting.generate(prompt, max_new_tokens=32, store_prompt=False)
    assert got.reused_approximate_tokens > 0 and got.token_ids == expected.token_ids


def test_a_kept_turn_holds_no_draft(engines: tuple[KVBoostRAG, KVBoostRAG], passages: list[str]) -> None:
    """The next turn reads the kept answer's KV: a drafted token the answer did not take must not be in it."""
    without, drafting = engines
    chat = [{"role": "user", "content": f"{passages[9]}\n\nRepeat the first sentence."}]
    answers = [e.generate(chat, max_new_tokens=24).text for e in engines]
    assert answers[0] == answers[1]
    follow = [*chat, {"role": "assistant", "content": answers[0]}, {"role": "user", "content": "And the second?"}]
    (expected, _), (got, plan) = (e.next_token_logits(follow) for e in engines)
    assert plan.tokens("exact") > 0, "the kept turn is found"
    assert torch.equal(got, expected)


def test_requests_decoding_together_answer_as_without_drafts(
    engines: tuple[KVBoostRAG, KVBoostRAG], passages: list[str]
) -> None:
    """A batched step shares its cost already: requests draft only while one decodes alone (the
    last of a batch), so a batch answers as it does without drafts."""
    without, drafting = engines
    prompts = [f"{passages[i]}\n\nRepeat the passage.\n\n{passages[i][:40]}" for i in range(3)]
    lengths = [dict(max_new_tokens=n, store_prompt=False) for n in (8, 16, 40)]
    expected_results = finish_all([without.stream(p, **o) for p, o in zip(prompts, lengths)])
    results = finish_all([drafting.stream(p, **o) for p, o in zip(prompts, lengths)])
    assert [r.token_ids for r in results] == [r.token_ids for r in expected_results]
    assert results[0].drafted_tokens == 0, "the shortest answer never decoded alone"
    assert results[2].accepted_tokens > 0, "the longest one, alone at the end, took drafts"


def test_where_rows_are_not_steps_nothing_is_drafted(
    engine: KVBoostRAG, passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose kernels sum a pass's rows in another order (fp32 `nn.Linear`, the AVX2 host's
    head) decodes one token a pass, as it did."""
    drafting = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store="memory"), name=engine.name)
    step = step_for(engine.model)
    assert step is not None
    monkeypatch.setattr(step, "rows_match_steps", lambda count: False)
    prompt = f"{passages[3]}\n\nRepeat the passage above word for word.\n\n{passages[3][:60]}"
    result = drafting.generate(prompt, max_new_tokens=24, store_prompt=False)
    assert result.drafted_tokens == 0 and result.new_tokens == 24


def test_draft_tokens_is_checked() -> None:
    for bad in (-1, MAX_DRAFT_TOKENS + 1, 1.5, "2"):
        with pytest.raises(ValueError, match="draft_tokens"):
            EngineConfig(draft_tokens=bad)  # type: ignore[arg-type]


def test_the_server_counts_drafted_tokens_taken_and_not(fresh_engine: KVBoostRAG) -> None:
    metrics = ServingMetrics(fresh_engine)
    result = fresh_engine.generate("Hello", max_new_tokens=2, store_prompt=False)
    result.drafted_tokens, result.accepted_tokens = 5, 3
    metrics.finished(result)
    page = metrics.scrape().decode()
    assert 'kvboost:draft_tokens_total{taken="yes"} 3.0' in page
    assert 'kvboost:draft_tokens_total{taken="no"} 2.0' in page


def test_a_long_cache_drafts_nothing(
    engines: tuple[KVBoostRAG, KVBoostRAG], passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row of a pass attends over the whole cache: past DRAFT_BELOW_TOKENS a row costs more
    than a draft saves."""
    without, drafting = engines
    prompt = f"{passages[3]}\n\nRepeat the passage above word for word.\n\n{passages[3][:60]}"
    short = drafting.generate(prompt, max_new_tokens=24, store_prompt=False)
    assert short.accepted_tokens > 0
    monkeypatch.setattr("kvboost_rag.engine.decode.DRAFT_BELOW_TOKENS", short.prompt_tokens)
    long = drafting.generate(prompt, max_new_tokens=24, store_prompt=False)
    assert long.drafted_tokens == 0 and long.token_ids == short.token_ids
