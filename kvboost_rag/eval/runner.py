"""NaturalQuestions-style accuracy eval: does reuse cost accuracy, and how much time does it save?

Every variant answers the same prompts as full prefill (same passages, same shuffled order,
greedy), so quality is measured against full prefill directly (first-token agreement and KL,
whole-answer agreement) and against the gold answers (EM, F1), with paired EM differences.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import MEMORY_ONLY, Quantization
from ..engine import GenerationResult, KVBoostRAG
from ..ops.logits import kl_divergence, top_margin
from .data import QAExample
from .metrics import best_subspan_em, token_f1
from .prompt import TEMPLATE, rag_prompt
from .variants import Variant, Warming

Store = tuple[Warming, Quantization | None]  # how a store's documents were warmed, how its KV is kept

# Full prefill's first token is "clear" when its probability leads the runner-up's by this much;
# below it, a near-tie flips on any small change (bf16 rounding alone flips ~2.5% of them).
CLEAR_MARGIN = 0.2


@dataclass(slots=True)
class Record:
    """One variant's answer to one question."""

    question: int
    em: float
    f1: float
    prompt_tokens: int
    ttft_s: float
    second_token_s: float | None  # None: a one-token answer
    total_s: float  # the whole answer
    new_tokens: int
    tokens_per_s: float  # decode speed after the first token
    reuse_share: float
    repair_share: float
    recomputed_share: float  # tokens recomputed (repair and any exact recompute) per prompt token
    first_token_agrees: bool
    answer_agrees: bool
    first_token_kl: float
    reference_margin: float  # full prefill's first-token probability lead over its runner-up
    text: str
    exact_from: int | None = None  # the first answer token taken from recomputed exact KV, if any
    accepted_tokens: int = 0  # answer tokens taken from verified drafts (EngineConfig.draft_tokens)


@dataclass(slots=True)
class EvalReport:
    settings: dict[str, Any]
    records: dict[str, list[Record]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        full_by_question = {r.question: r for r in self.records.get("full", [])}
        full_ttft = _median([r.ttft_s for r in full_by_question.values()])
        full_total = _median([r.total_s for r in full_by_question.values()])
        full_second = _median([r.second_token_s for r in full_by_question.values() if r.second_token_s is not None])
        table: dict[str, dict[str, float]] = {}
        for name, records in self.records.items():
            ttft, total = [r.ttft_s for r in records], [r.total_s for r in records]
            second = [r.second_token_s for r in records if r.second_token_s is not None]
            paired = [(r, full_by_question[r.question]) for r in records if r.question in full_by_question]
            em_diffs = [r.em - full.em for r, full in paired]
            f1_diffs = [r.f1 - full.f1 for r, full in paired]
            low, high = paired_ci(em_diffs)
            table[name] = {
                "questions": len(records),
                "prompt_tokens_median": statistics.median(r.prompt_tokens for r in records),
                "em": statistics.fmean(r.em for r in records),
                "f1": statistics.fmean(r.f1 for r in records),
                "em_diff_vs_full": _mean_or_nan(em_diffs),
                "em_diff_ci95_low": low,
                "em_diff_ci95_high": high,
                "f1_diff_vs_full": _mean_or_nan(f1_diffs),
                "retention": _mean_or_nan([r.em for r, full in paired if full.em]),
                "first_token_agreement": statistics.fmean(r.first_token_agrees for r in records),
                "answer_agreement": statistics.fmean(r.answer_agrees for r in records),
                "first_token_kl_mean": statistics.fmean(r.first_token_kl for r in records),
                "clear_share": statistics.fmean(r.reference_margin >= CLEAR_MARGIN for r in records),
                "first_token_agreement_clear": _mean_or_nan(
                    [r.first_token_agrees for r in records if r.reference_margin >= CLEAR_MARGIN]
                ),
                "ttft_median_s": statistics.median(ttft),
                "ttft_mean_s": statistics.fmean(ttft),
                "ttft_ratio_vs_full": statistics.median(ttft) / full_ttft,
                "second_token_median_s": _median(second),
                "second_token_ratio_vs_full": _median(second) / full_second,
                "total_median_s": statistics.median(total),
                "total_mean_s": statistics.fmean(total),
                "total_ratio_vs_full": statistics.median(total) / full_total,
                "decode_tokens_per_s": _median([r.tokens_per_s for r in records if r.new_tokens > 1]),
                "new_tokens_mean": statistics.fmean(r.new_tokens for r in records),
                # decode passes saved: answer tokens after the first that a verified draft gave
                "drafted_share": sum(r.accepted_tokens for r in records)
                / max(1, sum(r.new_tokens - 1 for r in records if r.new_tokens > 1)),
                "recomputed_share": statistics.fmean(r.recomputed_share for r in records),
                "verified_first_token_share": statistics.fmean(r.exact_from == 0 for r in records),
                "recomputed_answer_share": statistics.fmean(r.exact_from is not None for r in records),
                "reuse_share": statistics.fmean(r.reuse_share for r in records),
                "repair_share": statistics.fmean(r.repair_share for r in records),
            }
        return table


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _mean_or_nan(values: list[bool] | list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def paired_ci(diffs: list[float]) -> tuple[float, float]:
    """95% normal-approximation interval of the mean of paired differences."""
    if len(diffs) < 2:
        return math.nan, math.nan
    mean = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean - half, mean + half


def run_eval(
    engine: KVBoostRAG,
    examples: list[QAExample],
    passages_for: Callable[[int], list[str]],
    variants: list[Variant],
    *,
    sweep: list[Variant] | None = None,
    sweep_questions: int = 0,
    seed: int = 0,
    template: str = TEMPLATE,
    chat: bool = True,
    max_new_tokens: int = 32,
    progress: Callable[[Iterable[int]], Iterable[int]] = lambda it: it,
    stage: Callable[[str], None] = lambda what: None,
    settings: dict[str, Any] | None = None,
    neighbours_for: Callable[[str], list[str]] | None = None,
    group_of: Callable[[str], list[str]] | None = None,
) -> EvalReport:
    """Answer every example with every variant; `passages_for(i)` gives example i's documents,
    warmed as `kvboost-rag warm` warms them: each with its group of mutual neighbours
    `group_of(document)` (`warm_together`) when a question first needs it, so the store never holds
    more groups than its budget; each after `neighbours_for(document)` where no groups are given;
    else alone. Variants that read documents warmed otherwise (each alone, or each after its own
    nearest), or kept in another format (`Variant.kept_as`), read a store of their own. `stage`
    hears what runs now ("warming", "answering: <variant>"), for a progress bar to show."""
    if not variants or variants[0].mode != "full":
        raise ValueError("the first variant must be full prefill: every other is measured against it")
    report = EvalReport(settings=dict(settings or {}))
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    every = [*variants, *(sweep or [])]
    own: Store = ("corpus", engine.config.kept_as)

    def store_of(variant: Variant) -> Store:
        """The store a variant reads: how its documents were warmed and how their KV is kept."""
        warming = variant.warming
        if neighbours_for is None or (group_of is None and warming == "nearest"):
            warming = "corpus"  # the corpus is warmed that way already (alone, or each after its nearest)
        kept = variant.kept_as
        return warming, engine.config.kept_as if kept == "engine" else None if kept == "dense" else kept

    readers = {own: engine}
    for warming, kept in sorted({store_of(v) for v in every} - {own}, key=str):
        config = replace(engine.config, store=MEMORY_ONLY, kv_quantization=kept)
        readers[warming, kept] = KVBoostRAG(engine.model, engine.tokenizer, config, name=engine.name)

    def warm(store: Store, documents: list[str]) -> None:
        reader, warming = readers[store], store[0]
        after = [neighbours_for(d) for d in documents] if neighbours_for else None
        if warming == "corpus" and group_of is not None:  # each group once, members already warm are skipped
            reader.warm_together([list(g) for g in dict.fromkeys(tuple(group_of(d)) for d in documents)])
        elif warming in ("corpus", "nearest"):
            reader.warm(documents, neighbours=after)
        else:
            reader.warm(documents)

    reusing = any(v.mode != "full" for v in every)  # else nothing reads warm KV
    if examples and reusing:
        stage("warming the template")
        for store, reader in readers.items():
            warm(store, passages_for(0)[:1])
            warm_template_head(reader, passages_for(0)[0], template, chat)
    for i in progress(range(len(examples))):
        example = examples[i]
        documents = passages_for(i)
        if reusing:
            stage("warming")
            for store in readers:
                warm(store, documents)
        documents = fitting_documents(engine, example.question, documents, template, chat, max_new_tokens)
        random.Random(f"{seed}:{i}").shuffle(documents)
        prompt = rag_prompt(example.question, documents, template, chat)
        todo = variants[1:] + (sweep or [] if i < sweep_questions else [])
        stage(f"answering: {variants[0].name}")
        reference = _answer(engine, prompt, variants[0], max_new_tokens)
        results = {variants[0].name: reference}
        shift = i % max(len(todo), 1)
        for variant in todo[shift:] + todo[:shift]:  # rotate the order: none always runs first
            stage(f"answering: {variant.name}")
            results[variant.name] = _answer(readers[store_of(variant)], prompt, variant, max_new_tokens)
        for name, result in results.items():
            report.records.setdefault(name, []).append(_record(i, example, result, reference))
    return report


def warm_template_head(engine: KVBoostRAG, document: str, template: str = TEMPLATE, chat: bool = True) -> None:
    """One request on the template, so its head (system prompt and opening, before the first
    document) is cached as a user's first request leaves it; every prompt of the run opens with
    it. Its question is a placeholder, too short a tail to be kept for later prompts; `document`
    is warmed first, the way the run warms it (else it is warmed alone here)."""
    if not engine.reuse_supported:
        return
    engine.warm([document])
    engine.generate(rag_prompt("?", [document], template, chat), max_new_tokens=1, mode="reuse", store_prompt=True)


def fitting_documents(
    engine: KVBoostRAG, question: str, documents: list[str], template: str, chat: bool, max_new_tokens: int
) -> list[str]:
    """The best-ranked documents whose prompt and answer fit in the model's context window
    (the lowest-ranked left out first); a ValueError when not even one fits."""
    kept = list(documents)
    while kept:
        if (
            len(engine.tokenize_prompt(rag_prompt(question, kept, template, chat))) + max_new_tokens
            <= engine.max_context
        ):
            return kept
        kept.pop()
    raise ValueError(f"no document fits the context window of {engine.name} ({engine.max_context} tokens)")


def _answer(engine: KVBoostRAG, prompt: Any, variant: Variant, max_new_tokens: int) -> GenerationResult:
    return engine.generate(
        prompt,
        mode=variant.mode,
        repair=variant.repair,
        exactness=variant.exactness,
        max_new_tokens=max_new_tokens,
        stop=["\n"],
        store_prompt=False,  # each variant sees only the warmed documents, never another's prompt
        return_first_logits=True,
    )


def _record(i: int, example: QAExample, result: GenerationResult, reference: GenerationResult) -> Record:
    return Record(
        question=i,
        em=best_subspan_em(result.text, example.answers),
        f1=token_f1(result.text, example.answers),
        prompt_tokens=result.prompt_tokens,
        ttft_s=result.ttft_s,
        second_token_s=result.second_token_s,
        total_s=result.total_s,
        new_tokens=result.new_tokens,
        tokens_per_s=result.tokens_per_s,
        reuse_share=result.reuse_share,
        repair_share=result.repair_share,
        recomputed_share=result.recomputed_share,
        first_token_agrees=result.token_ids[:1] == reference.token_ids[:1],
        answer_agrees=result.text.strip() == reference.text.strip(),
        first_token_kl=kl_divergence(reference.first_logits, result.first_logits),
        reference_margin=top_margin(reference.first_logits),
        text=result.text,
        exact_from=result.exact_from,
        accepted_tokens=result.accepted_tokens,
    )
