"""The query-guided repair: the question's attention ranks the moved tokens, the top ones are
recomputed with the question; at rho 1 it is full prefill, at rho 0 the question's pass alone."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from kvboost_rag import DecodeObserver, KVBoostRAG
from kvboost_rag.config import ExactnessConfig, RepairConfig
from kvboost_rag.engine import Request
from kvboost_rag.engine import prefill as prefill_module
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.ops.attention_received import AttentionReceived

FLAT = dict(rho_after_neighbours=None, rho_among_strangers=None, max_tokens_per_run=None)


def brute_force(query: torch.Tensor, key: torch.Tensor, allowed: torch.Tensor, rows: int) -> torch.Tensor:
    """Every query head's softmax attention over its own copy of its key head, summed over the
    last `rows` queries and the heads."""
    group = query.shape[1] // key.shape[1]
    keys = key.repeat_interleave(group, dim=1)  # head h reads key head h // group
    logits = (query @ keys.transpose(-1, -2)) * query.shape[-1] ** -0.5
    logits = logits.masked_fill(~allowed, float("-inf"))
    return logits.softmax(-1)[0, :, -rows:].sum(dim=(0, 1))


@pytest.mark.parametrize("mask_kind", ["causal", "additive", "boolean"])
def test_attention_received_is_what_the_last_queries_pay_each_key(mask_kind: str) -> None:
    generator = torch.Generator().manual_seed(0)
    queries, length, rows = 5, 12, 3
    query = torch.randn(1, 4, queries, 8, generator=generator)
    key = torch.randn(1, 2, length, 8, generator=generator)
    if mask_kind == "causal":  # the queries are the last keys
        allowed = torch.arange(length).view(1, -1) <= torch.arange(length - queries, length).view(-1, 1)
    else:  # any pattern: keys in no order
        allowed = torch.rand(queries, length, generator=generator) < 0.7
        allowed[:, 0] = True
    mask = {
        "causal": None,
        "additive": torch.zeros(queries, length).masked_fill(~allowed, torch.finfo(torch.float32).min),
        "boolean": allowed,
    }[mask_kind]
    scores = AttentionReceived({3}, rows=rows, slots=length - 2)
    for layer in (2, 3):  # only layer 3 is scored
        scores.observe(layer, query, key, None if mask is None else mask.view(1, 1, queries, length), 8**-0.5)
    expected = brute_force(query, key, allowed, rows)[: length - 2]
    assert scores.seen == {3} and scores.scores is not None
    assert torch.allclose(scores.scores, expected, atol=1e-5)
    assert abs(brute_force(query, key, allowed, rows).sum().item() - rows * 4) < 1e-4, "each row's attention sums to 1"


def test_a_recorder_needs_a_query() -> None:
    with pytest.raises(ValueError, match="at least one query"):
        AttentionReceived({0}, rows=0, slots=3)


@pytest.fixture()
def shuffled_prompt(fresh_engine: KVBoostRAG, passages: list[str]) -> list[dict[str, str]]:
    documents = passages[30:34]
    fresh_engine.warm(documents)
    return rag_messages("Which of these happened first?", documents[::-1])


def test_query_repair_at_rho_one_is_full_prefill_and_at_rho_zero_the_questions_pass(
    fresh_engine: KVBoostRAG, shuffled_prompt: list
) -> None:
    full, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="full")
    everything, plan = fresh_engine.next_token_logits(shuffled_prompt, repair=RepairConfig(strategy="query", rho=1.0))
    assert plan.tokens("approximate") > 300
    assert (everything - full).abs().max().item() <= 1e-3
    nothing, _ = fresh_engine.next_token_logits(shuffled_prompt, repair=RepairConfig(strategy="query", rho=0.0, **FLAT))
    stale, _ = fresh_engine.next_token_logits(shuffled_prompt, repair=RepairConfig(strategy="none"))
    assert (nothing - stale).abs().max().item() <= 1e-4, "nothing chosen: the question's pass is the prefill"
    assert (nothing - full).abs().max().item() > 1e-2, "and it is not full prefill's"


def test_query_repair_recomputes_what_the_question_reads_most(
    fresh_engine: KVBoostRAG, shuffled_prompt: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    original = prefill_module.top_share

    def recording(scores: torch.Tensor, candidates: torch.Tensor, *args: object) -> torch.Tensor:
        picks.append((scores, candidates, original(scores, candidates, *args)))  # type: ignore[arg-type]
        return picks[-1][2]

    monkeypatch.setattr(prefill_module, "top_share", recording)
    seen: list[set[int]] = []
    observe = AttentionReceived.observe

    def watching(self: AttentionReceived, layer: int | None, *args: object) -> None:
        observe(self, layer, *args)  # type: ignore[arg-type]
        seen.append(set(self.seen))

    monkeypatch.setattr(AttentionReceived, "observe", watching)
    repair = RepairConfig(strategy="query", rho=0.2, query_layers=2, **FLAT)
    result = fresh_engine.generate(shuffled_prompt, max_new_tokens=1, repair=repair)
    layers = fresh_engine.model.config.num_hidden_layers
    assert seen[-1] == {layers - 2, layers - 1}, "the last query_layers layers are scored"
    ((scores, candidates, selected),) = picks
    moved = int(candidates.sum())
    assert result.repair_strategy == "query" and result.repair_tokens == selected.numel() == math.ceil(0.2 * moved)
    assert bool(candidates[selected].all()), "only moved tokens are chosen; the uncached are computed anyway"
    chosen = scores[selected].min()
    others = scores[candidates].sort(descending=True).values
    assert (
        chosen >= others[selected.numel() - 1]
        and scores[candidates & ~torch.isin(torch.arange(len(scores)), selected)].max() <= chosen
    ), "the chosen ones are read most"
    assert scores[candidates].sum() > 0


def test_query_repair_moves_logits_toward_full_prefill(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    full, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="full")
    log_full = torch.log_softmax(full, -1)

    def kl(repair: RepairConfig) -> float:
        logits, _ = fresh_engine.next_token_logits(shuffled_prompt, repair=repair)
        return torch.sum(log_full.exp() * (log_full - torch.log_softmax(logits, -1))).item()

    assert kl(RepairConfig(strategy="query", rho=0.3, **FLAT)) < kl(RepairConfig(strategy="none"))


def test_a_model_whose_attention_records_nothing_is_repaired_by_cacheblend(
    fresh_engine: KVBoostRAG, shuffled_prompt: list, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(AttentionReceived, "observe", lambda self, *args: None)
    with caplog.at_level(logging.WARNING):
        logits, _ = fresh_engine.next_token_logits(shuffled_prompt, repair=RepairConfig(strategy="query", rho=0.3))
    blended, _ = fresh_engine.next_token_logits(shuffled_prompt, repair=RepairConfig(strategy="cacheblend", rho=0.3))
    assert "records no attention scores" in caplog.text
    assert (logits - blended).abs().max().item() <= 1e-5


class ScriptedLeads(DecodeObserver):
    """The leads the exactness policy reads, given, to place a near-tie where a test wants it."""

    def __init__(self, leads: list[float]) -> None:
        self.leads = leads

    def lead(self, request: Request) -> float:
        return self.leads.pop(0)


def test_a_near_tie_is_settled_by_a_larger_share_before_the_whole_prompt(
    fresh_engine: KVBoostRAG, shuffled_prompt: list
) -> None:
    repair = RepairConfig(strategy="query", rho=0.1, **FLAT)
    policy = ExactnessConfig(verify_margin=0.05, settle_share=0.5)
    options = dict(repair=repair, max_new_tokens=2, store_prompt=False, return_first_logits=True)
    settled = fresh_engine.generate(shuffled_prompt, exactness=policy, observer=ScriptedLeads([0.0, 0.9]), **options)
    moved = settled.reused_approximate_tokens
    first_pass = math.ceil(0.1 * moved)
    assert settled.exact_from is None and settled.timings.verify_s == 0.0, "settled: no whole-prompt recompute"
    assert settled.timings.settle_s > 0 and settled.repair_tokens == math.ceil(0.5 * moved)
    assert settled.recomputed_tokens == first_pass + settled.repair_tokens
    wider, _ = fresh_engine.next_token_logits(shuffled_prompt, repair=RepairConfig(strategy="query", rho=0.5, **FLAT))
    assert settled.first_logits is not None and torch.equal(settled.first_logits, wider), "the wider prefill's"
    still_tied = fresh_engine.generate(shuffled_prompt, exactness=policy, observer=ScriptedLeads([0.0, 0.0]), **options)
    full = fresh_engine.generate(shuffled_prompt, mode="full", max_new_tokens=2, store_prompt=False)
    assert still_tied.exact_from == 0 and still_tied.token_ids == full.token_ids, "then the whole prompt"
    assert still_tied.recomputed_tokens == first_pass + math.ceil(0.5 * moved) + still_tied.prompt_tokens
    clear = fresh_engine.generate(shuffled_prompt, exactness=policy, observer=ScriptedLeads([0.9, 0.9]), **options)
    assert clear.timings.settle_s == 0.0 and clear.recomputed_tokens == first_pass, "a clear token settles nothing"
    with pytest.raises(ValueError, match="settle_share"):
        ExactnessConfig(settle_share=1.0)
