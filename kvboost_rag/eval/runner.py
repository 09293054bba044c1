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
from dataclasses import dataclass, field
from typing import Any

from ..engine import GenerationResult, KVBoostRAG
from ..ops.logits import kl_divergence, top_margin
from .data import QAExample
from .metrics import best_subspan_em, token_f1
from .prompt import TEMPLATE, rag_prompt
from .variants import Variant

# Full prefill's first token is "clear" when its probability leads the runner-up's by this much;
# below it, a near-tie flips on any small change (bf16 rounding alone flips ~2.5% of them).
CLEAR_MARGIN = 0.2


@dataclass(slots=True)
class Record:
    """One variant's answer to one question."""

    question: int
    em: float
    f1: float
    ttft_s: float
    total_s: float  # the whole answer
    reuse_share: float
    repair_share: float
    first_token_agrees: bool
    answer_agrees: bool
    first_token_kl: float
    reference_margin: float  # full prefill's first-token probability lead over its runner-up
    text: str
    exact_from: int | None = None  # the first answer token taken from recomputed exact KV, if any


@dataclass(slots=True)
class EvalReport:
    settings: dict[str, Any]
    records: dict[str, list[Record]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        full_by_question = {r.question: r for r in self.records.get("full", [])}
        full_median = statistics.median(r.ttft_s for r in full_by_question.values()) if full_by_question else math.nan
        full_total = statistics.median(r.total_s for r in full_by_question.values()) if full_by_question else math.nan
        table: dict[str, dict[str, float]] = {}
        for name, records in self.records.items():
            ttft = [r.ttft_s for r in records]
            diffs = [r.em - full_by_question[r.question].em for r in records if r.question in full_by_question]
            low, high = paired_ci(diffs)
            table[name] = {
                "questions": len(records),
                "em": statistics.fmean(r.em for r in records),
                "f1": statistics.fmean(r.f1 for r in records),
                "em_diff_vs_full": statistics.fmean(diffs) if diffs else math.nan,
                "em_diff_ci95_low": low,
                "em_diff_ci95_high": high,
                "first_token_agreement": statistics.fmean(r.first_token_agrees for r in records),
                "answer_agreement": statistics.fmean(r.answer_agrees for r in records),
                "first_token_kl_mean": statistics.fmean(r.first_token_kl for r in records),
                "clear_share": statistics.fmean(r.reference_margin >= CLEAR_MARGIN for r in records),
                "first_token_agreement_clear": _mean_or_nan(
                    [r.first_token_agrees for r in records if r.reference_margin >= CLEAR_MARGIN]
                ),
                "ttft_median_s": statistics.median(ttft),
                "ttft_mean_s": statistics.fmean(ttft),
                "ttft_ratio_vs_full": statistics.median(ttft) / full_median,
                "total_ratio_vs_full": statistics.median(r.total_s for r in records) / full_total,
                "verified_first_token_share": statistics.fmean(r.exact_from == 0 for r in records),
                "recomputed_answer_share": statistics.fmean(r.exact_from is not None for r in records),
                "reuse_share": statistics.fmean(r.reuse_share for r in records),
                "repair_share": statistics.fmean(r.repair_share for r in records),
            }
        return table


def _mean_or_nan(values: list[bool]) -> float:
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
    settings: dict[str, Any] | None = None,
) -> EvalReport:
    """Answer every example with every variant; `passages_for(i)` gives example i's documents."""
    if not variants or variants[0].mode != "full":
        raise ValueError("the first variant must be full prefill: every other is measured against it")
    report = EvalReport(settings=dict(settings or {}))
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    for i in progress(range(len(examples))):
        example = examples[i]
        documents = passages_for(i)
        engine.warm(documents)
        random.Random(f"{seed}:{i}").shuffle(documents)
        prompt = rag_prompt(example.question, documents, template, chat)
        todo = variants[1:] + (sweep or [] if i < sweep_questions else [])
        reference = _answer(engine, prompt, variants[0], max_new_tokens)
        results = {variants[0].name: reference}
        shift = i % max(len(todo), 1)
        for variant in todo[shift:] + todo[:shift]:  # rotate the order: none always runs first
            results[variant.name] = _answer(engine, prompt, variant, max_new_tokens)
        for name, result in results.items():
            report.records.setdefault(name, []).append(_record(i, example, result, reference))
    return report


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
        ttft_s=result.ttft_s,
        total_s=result.total_s,
        reuse_share=result.reuse_share,
        repair_share=result.repair_share,
        first_token_agrees=result.token_ids[:1] == reference.token_ids[:1],
        answer_agrees=result.text.strip() == reference.text.strip(),
        first_token_kl=kl_divergence(reference.first_logits, result.first_logits),
        reference_margin=top_margin(reference.first_logits),
        text=result.text,
        exact_from=result.exact_from,
    )
