"""Repair: exact masks, rho = 1 equivalence, deviation-guided selection, boundary plans."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from kvboost_rag import DecodeObserver, KVBoostRAG
from kvboost_rag.config import ExactnessConfig, RepairConfig
from kvboost_rag.engine import Request
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.hf.blend import SelectiveCache
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.ops.attention import position_mask
from kvboost_rag.ops.selection import select_for_recompute
from kvboost_rag.plan.matching import ReusePlan
from kvboost_rag.plan.repair import boundary_positions, reused_runs, with_recomputed
from kvboost_rag.plan.segments import Segment

STALE = RepairConfig(strategy="none")  # moved KV as it is
OFF = ExactnessConfig.off()  # nothing recomputed after the prefill


def test_mask_never_lets_a_token_see_a_later_position() -> None:
    generator = torch.Generator().manual_seed(0)
    slots = torch.randperm(200, generator=generator)  # slots in any order
    queries = torch.sort(slots[torch.randperm(200, generator=generator)[:37]]).values
    mask = position_mask(queries, slots, torch.float32)[0, 0]
    visible = mask == 0
    for i, q in enumerate(queries.tolist()):
        assert set(slots[visible[i]].tolist()) == set(range(q + 1))
    assert torch.all(mask[~visible] == torch.finfo(torch.float32).min)


def test_selection_picks_the_largest_deviations() -> None:
    cached = torch.zeros(2, 10, 4)
    fresh = cached.clone()
    for position, size in [(2, 5.0), (7, 3.0), (4, 1.0), (9, 9.0)]:
        fresh[:, position] = size
    candidates = torch.ones(10, dtype=torch.bool)
    candidates[9] = False  # not reused: only the caller's forced set decides it
    forced = torch.zeros(10, dtype=torch.bool)
    forced[0] = True
    picked = select_for_recompute(fresh, cached, candidates, forced, rho=0.2)  # ceil(0.2 * 9) = 2
    assert picked.tolist() == [0, 2, 7]
    assert select_for_recompute(fresh, cached, candidates, forced, rho=1.0).tolist() == list(range(9))
    assert select_for_recompute(fresh, cached, candidates, forced, rho=1.0, limit=1).tolist() == [0, 2]


@pytest.mark.parametrize("strategy", ["query", "cacheblend"])
def test_a_long_documents_repair_is_capped_per_run(
    fresh_engine: KVBoostRAG, passages: list[str], strategy: str
) -> None:
    """rho of a long document's tokens is more than its seam needs: at most max_tokens_per_run
    of each moved run are recomputed (rho = 1 stays full prefill, cap or not), whichever choice
    ranks them."""
    documents = ["\n".join(passages[0:4]), "\n".join(passages[4:8])]
    fresh_engine.warm(documents)
    prompt = rag_messages("Which came first?", documents[::-1])
    plan = fresh_engine.plan(prompt)
    runs = len(reused_runs(plan))
    assert runs >= 2 and plan.tokens("approximate") > 600
    repair = RepairConfig(strategy, rho=0.3, blend_boundary_tokens=0)  # type: ignore[arg-type]
    options = dict(exactness=OFF, max_new_tokens=1, store_prompt=False)
    capped = fresh_engine.generate(prompt, repair=replace(repair, max_tokens_per_run=8), **options)
    uncapped = fresh_engine.generate(prompt, repair=replace(repair, max_tokens_per_run=None), **options)
    assert capped.repair_tokens == 8 * runs
    assert uncapped.repair_tokens == math.ceil(0.3 * plan.tokens("approximate"))
    sinks = fresh_engine.generate(
        prompt, repair=replace(repair, max_tokens_per_run=8, blend_boundary_tokens=4), **options
    )
    assert 8 * runs < sinks.repair_tokens <= 12 * runs, "each run's first 4 tokens besides the capped choice"
    full, _ = fresh_engine.next_token_logits(prompt, mode="full")
    everything, _ = fresh_engine.next_token_logits(prompt, repair=replace(repair, rho=1.0, max_tokens_per_run=8))
    assert (everything - full).abs().max().item() <= 1e-3
    with pytest.raises(ValueError, match="max_tokens_per_run"):
        RepairConfig(max_tokens_per_run=-1)


def _plan() -> ReusePlan:
    entry = type("E", (), {"next_chunk": None, "content_hash": b"x", "__len__": lambda self: 100})()
    segments = [
        Segment(0, 10, "computed"),
        Segment(10, 60, "approximate", entry, 0),
        Segment(60, 62, "computed"),
        Segment(62, 100, "approximate", entry, 5),
        Segment(100, 110, "computed"),
    ]
    return ReusePlan(segments, prompt_chunks=1, exact_chunks=0, approximate_chunks=1)


def test_boundary_recompute_takes_the_head_and_tail_of_each_run() -> None:
    plan = _plan()
    assert reused_runs(plan) == [(10, 60), (62, 100)]
    positions = boundary_positions(plan, head=4, tail=2)
    assert positions == {10, 11, 12, 13, 58, 59, 62, 63, 64, 65, 98, 99}
    repaired = with_recomputed(plan, positions)
    assert repaired.tokens("approximate") == plan.tokens("approximate") - len(positions)
    assert sum(len(s) for s in repaired.segments) == 110
    middle = next(s for s in repaired.segments if s.kind == "approximate" and s.start == 66)
    assert middle.offset == 5 + 4, "the entry offset follows the cut"


@pytest.fixture()
def shuffled_prompt(fresh_engine: KVBoostRAG, passages: list[str]) -> list[dict[str, str]]:
    documents = passages[30:34]
    fresh_engine.warm(documents)
    return rag_messages("Which of these happened first?", documents[::-1])


def test_cacheblend_rho_one_equals_full_prefill(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    full, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="full")
    for deviation in ("value", "key"):
        repaired, plan = fresh_engine.next_token_logits(
            shuffled_prompt, mode="reuse", repair=RepairConfig(strategy="cacheblend", rho=1.0, deviation=deviation)
        )
        assert plan.tokens("approximate") > 300
        assert (repaired - full).abs().max().item() <= 1e-3


def test_check_layer_attends_for_the_selected_tokens_only(
    fresh_engine: KVBoostRAG, shuffled_prompt: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the selected tokens go past the check layer, so computing its attention and its
    feed-forward for them alone changes nothing but the time."""
    narrowed: list[bool] = []
    original = SelectiveCache.narrows

    def recording(self: SelectiveCache, *args: object) -> bool:
        narrowed.append(original(self, *args))
        return narrowed[-1]

    repair = RepairConfig(strategy="cacheblend", rho=0.3, max_tokens_per_run=None)
    check_mlp = fresh_engine.model.model.layers[repair.check_layer].mlp
    rows: list[int] = []
    handle = check_mlp.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
    monkeypatch.setattr(SelectiveCache, "narrows", recording)
    fast, plan = fresh_engine.next_token_logits(shuffled_prompt, mode="reuse", repair=repair)
    selected = plan.tokens("computed") + math.ceil(0.3 * plan.tokens("approximate"))
    assert narrowed.count(True) == 1 and rows == [selected]
    every_token, _ = fresh_engine.next_token_logits(
        shuffled_prompt, mode="reuse", repair=replace(repair, narrow_check_layer=False)
    )
    handle.remove()
    assert rows[1] == sum(len(s) for s in plan.segments), "the reference runs every token"
    assert (fast - every_token).abs().max().item() <= 1e-4


def test_boundary_recomputing_everything_equals_full_prefill(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    full, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="full")
    repaired, _ = fresh_engine.next_token_logits(
        shuffled_prompt, mode="reuse", repair=RepairConfig(strategy="boundary", boundary_tokens=10_000)
    )
    assert (repaired - full).abs().max().item() <= 1e-3


def test_repair_moves_logits_toward_full_prefill(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    full, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="full")
    log_full = torch.log_softmax(full, -1)

    def kl(repair: RepairConfig) -> float:
        logits, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="reuse", repair=repair)
        return torch.sum(log_full.exp() * (log_full - torch.log_softmax(logits, -1))).item()

    none = kl(RepairConfig(strategy="none"))
    assert kl(RepairConfig(strategy="cacheblend", rho=0.5)) < none
    assert kl(RepairConfig(strategy="boundary", boundary_tokens=32)) < none


@pytest.mark.parametrize("strategy", ["query", "cacheblend"])
def test_result_reports_repair(fresh_engine: KVBoostRAG, shuffled_prompt: list, strategy: str) -> None:
    repair = RepairConfig(strategy, rho=0.15, blend_boundary_tokens=0)  # type: ignore[arg-type]
    result = fresh_engine.generate(shuffled_prompt, max_new_tokens=1, repair=repair)
    assert result.repair_strategy == strategy
    expected = np.ceil(0.15 * result.reused_approximate_tokens)
    assert result.repair_tokens == expected
    assert result.timings.repair_s > 0 and result.ttft_s >= result.timings.repair_s + result.timings.prefill_s
    skipped = fresh_engine.generate(shuffled_prompt, max_new_tokens=1, repair=replace(repair, min_reused_share=0.99))
    assert skipped.repair_tokens == 0 and skipped.timings.repair_s == 0
    with pytest.raises(ValueError, match="rho"):
        RepairConfig(rho=1.5)


def _greedy_after(engine: KVBoostRAG, tokens: list[int], answer: list[int], count: int) -> list[int]:
    """Greedy tokens after the `answer` so far, over plain full prefill of `tokens` and one step
    per answer token: the reference for an answer that went on from exact KV."""
    cache = make_cache()
    logits = forward_last_logits(engine.model, torch.tensor(tokens), torch.arange(len(tokens)), cache)
    sequence = list(tokens)
    for i in range(len(answer) + count):
        token = answer[i] if i < len(answer) else int(logits.argmax())
        logits = forward_last_logits(engine.model, torch.tensor([token]), torch.tensor([len(sequence)]), cache)
        sequence.append(token)
    return sequence[len(tokens) + len(answer) :]


def test_refresh_decodes_the_rest_from_full_prefill_kv(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    """After the first token (taken from moved KV, deliberately unrepaired here), a refreshed
    answer continues exactly as full prefill would from that token."""
    refreshed = fresh_engine.generate(
        shuffled_prompt,
        mode="reuse",
        repair=STALE,
        exactness=ExactnessConfig(verify_margin=0.0, refresh=True),
        max_new_tokens=6,
        store_prompt=False,
    )
    assert refreshed.reused_approximate_tokens > 300 and refreshed.new_tokens == 6
    assert refreshed.refresh_s > 0 and refreshed.total_s > refreshed.ttft_s + refreshed.refresh_s
    tokens = fresh_engine.tokenize_prompt(shuffled_prompt).tolist()
    assert refreshed.token_ids[1:] == _greedy_after(fresh_engine, tokens, refreshed.token_ids[:1], 5)
    stale = fresh_engine.generate(
        shuffled_prompt, mode="reuse", repair=STALE, exactness=OFF, max_new_tokens=6, store_prompt=False
    )
    assert stale.token_ids[0] == refreshed.token_ids[0], "the first token does not wait for the refresh"
    assert stale.refresh_s == 0.0


def test_refresh_gives_full_prefills_answer_when_the_first_token_agrees(
    fresh_engine: KVBoostRAG, shuffled_prompt: list
) -> None:
    full = fresh_engine.generate(shuffled_prompt, mode="full", max_new_tokens=8, store_prompt=False)
    refreshed = fresh_engine.generate(
        shuffled_prompt,
        mode="reuse",
        repair=RepairConfig(rho=1.0),  # rho 1: the first token is full prefill's
        exactness=ExactnessConfig(verify_margin=0.0, refresh=True),
        max_new_tokens=8,
        store_prompt=False,
    )
    assert refreshed.refresh_s > 0
    assert refreshed.token_ids == full.token_ids and refreshed.text == full.text


def test_refresh_stores_the_prompt_as_exact_chunks(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    """The refreshed cache is full prefill's, so every whole chunk of the prompt is kept for
    EXACT hits: a repeat of the prompt, the rest recomputed, reproduces full prefill's logits."""
    refresh = ExactnessConfig(verify_margin=0.0, refresh=True)
    fresh_engine.generate(shuffled_prompt, exactness=refresh, max_new_tokens=2, store_prompt=True)
    repeat, plan = fresh_engine.next_token_logits(shuffled_prompt, mode="reuse", repair=RepairConfig(rho=1.0))
    prompt_tokens = len(fresh_engine.tokenize_prompt(shuffled_prompt))
    assert plan.exact_chunks == prompt_tokens // fresh_engine.config.chunk_size
    full, _ = fresh_engine.next_token_logits(shuffled_prompt, mode="full")
    assert (repeat - full).abs().max().item() <= 1e-3


def test_verify_takes_a_near_tie_from_exact_kv(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    """A first token whose lead is below `verify_margin` is recomputed on exact KV before it is
    taken: the answer, its first-token logits and all, is full prefill's to the bit, and the
    TTFT holds the recompute."""
    full = fresh_engine.generate(
        shuffled_prompt, mode="full", max_new_tokens=8, store_prompt=False, return_first_logits=True
    )
    verified = fresh_engine.generate(
        shuffled_prompt,
        mode="reuse",
        repair=STALE,
        exactness=ExactnessConfig(verify_margin=1.0, refresh=False),  # every step of moved KV is in doubt
        max_new_tokens=8,
        store_prompt=False,
        return_first_logits=True,
    )
    assert verified.reused_approximate_tokens > 300 and verified.exact_from == 0
    assert verified.token_ids == full.token_ids and verified.text == full.text
    assert torch.equal(verified.first_logits, full.first_logits)
    assert 0 < verified.timings.verify_s <= verified.refresh_s and verified.ttft_s > verified.timings.verify_s
    unverified = fresh_engine.generate(
        shuffled_prompt, repair=STALE, exactness=OFF, max_new_tokens=1, store_prompt=False
    )
    assert unverified.exact_from is None and unverified.timings.verify_s == 0.0
    with pytest.raises(ValueError, match="verify_margin"):
        ExactnessConfig(verify_margin=1.5)


def test_default_checks_the_first_token_only(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    """The default verifies near-ties of the first token alone: a near-tie later is taken on
    moved KV, so the answer costs no recompute after its first token (work saved, not moved)."""
    policy = ExactnessConfig(verify_margin=0.5)
    assert policy.verify_tokens == 1 and not policy.refresh, "the defaults this test relies on"
    later_tie = ScriptedLeads([0.9, 0.0, 0.0, 0.0])
    answer = fresh_engine.generate(
        shuffled_prompt, repair=STALE, exactness=policy, observer=later_tie, max_new_tokens=4, store_prompt=False
    )
    stale = fresh_engine.generate(shuffled_prompt, repair=STALE, exactness=OFF, max_new_tokens=4, store_prompt=False)
    assert answer.exact_from is None and answer.refresh_s == 0.0 and answer.token_ids == stale.token_ids
    assert answer.recomputed_tokens == answer.repair_tokens == 0
    first_tie = ScriptedLeads([0.0])
    verified = fresh_engine.generate(
        shuffled_prompt, repair=STALE, exactness=policy, observer=first_tie, max_new_tokens=4, store_prompt=False
    )
    assert verified.exact_from == 0 and verified.recomputed_tokens == verified.prompt_tokens
    assert verified.second_token_s is not None and verified.ttft_s < verified.second_token_s <= verified.total_s


def test_recomputed_tokens_count_the_repair_and_the_refresh(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    """CacheBlend's repair tokens, plus the whole prompt and first token again for a refresh."""
    blend = fresh_engine.generate(shuffled_prompt, exactness=OFF, max_new_tokens=3, store_prompt=False)
    assert 0 < blend.recomputed_tokens == blend.repair_tokens < blend.reused_approximate_tokens
    assert blend.recomputed_share == pytest.approx(blend.repair_tokens / blend.prompt_tokens)
    refreshed = fresh_engine.generate(
        shuffled_prompt,
        exactness=ExactnessConfig(verify_margin=0.0, refresh=True),
        max_new_tokens=3,
        store_prompt=False,
    )
    assert refreshed.new_tokens > 1, "the refresh runs before the second token"
    assert refreshed.recomputed_tokens == refreshed.repair_tokens + refreshed.prompt_tokens + 1
    assert refreshed.recomputed_share > 1.0
    full = fresh_engine.generate(shuffled_prompt, mode="full", max_new_tokens=3, store_prompt=False)
    assert full.recomputed_tokens == 0


class ScriptedLeads(DecodeObserver):
    """The leads the exactness policy reads, given, to place a near-tie where a test wants it."""

    def __init__(self, leads: list[float]) -> None:
        self.leads = leads

    def lead(self, request: Request) -> float:
        return self.leads.pop(0)


def test_verify_mid_answer_goes_on_as_full_prefill_would(fresh_engine: KVBoostRAG, shuffled_prompt: list) -> None:
    """A near-tie at the third token: the first two stay moved KV's, the rest is what full
    prefill writes after them."""
    policy = ExactnessConfig(verify_margin=0.5, verify_tokens=None, refresh=False)
    verified = fresh_engine.generate(
        shuffled_prompt,
        repair=STALE,
        exactness=policy,
        observer=ScriptedLeads([0.9, 0.9, 0.0]),
        max_new_tokens=6,
        store_prompt=False,
    )
    assert verified.exact_from == 2 and verified.timings.verify_s == 0.0 and verified.refresh_s > 0
    stale = fresh_engine.generate(shuffled_prompt, repair=STALE, exactness=OFF, max_new_tokens=6, store_prompt=False)
    assert verified.token_ids[:2] == stale.token_ids[:2]
    assert verified.recomputed_tokens == verified.prompt_tokens + 2, "the prompt and two answer tokens"
    tokens = fresh_engine.tokenize_prompt(shuffled_prompt).tolist()
    assert verified.token_ids[2:] == _greedy_after(fresh_engine, tokens, verified.token_ids[:2], 4)
