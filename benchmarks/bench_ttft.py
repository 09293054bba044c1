"""TTFT and whole-answer time of full prefill, prefix caching and position-independent reuse on
NQ-Open RAG prompts.

Indexes the 2,655 gold passages in FAISS, retrieves the top k per question, warms every
retrieved passage first, then answers with the passages in the eval's shuffled order. Every
time is wall clock from the call: TTFT to the first sampled token (tokenizing, lookup,
assembly, re-rotation, repair and the suffix prefill included), the second token after it
(for the default, its refresh), and the whole answer (greedy, up to --max-new-tokens, ending
at a newline). The floor is the time to prefill only the uncached tokens given a ready cache:
the forward pass over them alone. `--max-new-tokens 1` times the first token only.

JSON: benchmarks/results/bench_ttft.json (or --out).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, replace

from kvboost_lab import harness
from kvboost_lab.variants import RESEARCH_VARIANTS
from kvboost_rag import DecodeObserver, GenerationResult, KVBoostRAG
from kvboost_rag.engine import Request
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.eval.variants import Baseline, Variant

# JSON name -> eval variant: every reuse one is that technique alone (nothing recomputed after
# the prefill) but "default", the engine as it ships (near-tie first token verified, the rest
# of the answer refreshed).
NAMES = {
    "full": "full",
    "prefix": "prefix",
    "reuse": "none",
    "reuse+boundary": "boundary",
    "reuse+cacheblend": "cacheblend",
    "default": "default",
}
STAGES = ("tokenize_s", "lookup_s", "assemble_s", "repair_s", "prefill_s", "verify_s", "sample_s")


class TokenClock(DecodeObserver):
    """Wall clock from the call to each sampled token."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_token(self, request: Request, token: int) -> None:
        self.seconds.append(time.perf_counter() - request.asked.started)


def main() -> None:
    p = harness.parser(__doc__, questions=100, k=[2, 5, 10], seed=0, out="bench_ttft.json", max_new_tokens=16)
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, max(args.k), args.seed)
    engine = harness.load_engine(args)
    # Prefix caching gets a store of its own that only ever holds earlier prompts, as in vLLM.
    prefix_engine = KVBoostRAG(
        engine.model, engine.tokenizer, replace(engine.config, memory_budget_bytes=4 * 1024**3), name=engine.name
    )
    baseline = Baseline(engine.config.repair, engine.config.exactness)
    variants = {name: replace(RESEARCH_VARIANTS[eval_name](baseline), name=name) for name, eval_name in NAMES.items()}
    warm = harness.warm(engine, nq)

    def answer(variant: Variant, messages: list) -> tuple[GenerationResult, float | None]:
        """The answer, and the time to its second token (None when it has one token only)."""
        clock, prefix = TokenClock(), variant.mode == "prefix"  # only prefix caching keeps its prompts
        result = harness.answer(
            prefix_engine if prefix else engine,
            messages,
            variant,
            args.max_new_tokens,
            store_prompt=prefix,
            observer=clock,
        )
        return result, clock.seconds[1] if len(clock.seconds) > 1 else None

    for variant in variants.values():  # first calls of each path, not timed
        answer(variant, rag_messages("warm-up?", nq.all_documents(2)[:2]))

    report: dict = {
        "model": engine.name,
        "dtype": str(engine.dtype),
        "device": str(engine.device),
        "questions": args.questions,
        "max_new_tokens": args.max_new_tokens,
        "warm": asdict(warm),
        "k": {},
    }
    names = list(variants)
    for k in args.k:
        rows: dict[str, list[tuple[GenerationResult, float | None]]] = {name: [] for name in names}
        for q in range(len(nq)):
            messages = nq.prompt(q, args.seed, k)
            for name in names[q % len(names) :] + names[: q % len(names)]:  # no variant always runs first
                rows[name].append(answer(variants[name], messages))
        report["k"][str(k)] = entry = summarize_k(rows)
        print_table(k, entry, names)
    report["store"] = asdict(engine.store.stats())
    harness.write_json(args.out, report, indent=2)


def summarize_k(rows: dict[str, list[tuple[GenerationResult, float | None]]]) -> dict:
    full = [r for r, _ in rows["full"]]
    full_ttft = statistics.median(r.ttft_s for r in full)
    full_total = statistics.median(r.total_s for r in full)
    entry: dict = {"prompt_tokens": harness.summarize([r.prompt_tokens for r in full])}
    for name, pairs in rows.items():
        results = [r for r, _ in pairs]
        second = [s for _, s in pairs if s is not None]
        ttft, total = harness.summarize([r.ttft_s for r in results]), harness.summarize([r.total_s for r in results])
        entry[name] = {
            "ttft_s": ttft,
            "speedup_median": full_ttft / ttft["median"],
            "second_token_s": harness.summarize(second) if second else None,
            "total_s": total,
            "total_ratio_vs_full": total["median"] / full_total,
            "new_tokens": harness.summarize([r.new_tokens for r in results]),
            "reuse_share": harness.summarize([r.reuse_share for r in results]),
            "repair_share": harness.summarize([r.repair_share for r in results]),
            "floor_s": harness.summarize([r.timings.prefill_s + r.timings.repair_s for r in results]),
            "stages_median_s": {s: statistics.median(getattr(r.timings, s) for r in results) for s in STAGES},
            "verified_first_token_share": statistics.fmean(r.exact_from == 0 for r in results),
            "first_token_agreement_vs_full": statistics.fmean(
                r.token_ids[:1] == f.token_ids[:1] for r, f in zip(results, full)
            ),
            "answer_agreement_vs_full": statistics.fmean(r.token_ids == f.token_ids for r, f in zip(results, full)),
        }
    return entry


def print_table(k: int, entry: dict, names: list[str]) -> None:
    print(f"\nk={k}  prompt {entry['prompt_tokens']['median']:.0f} tokens (median); times in ms, median (mean)")
    print(
        f"  {'variant':18} {'TTFT':>11} {'speedup':>8} {'2nd token':>11} {'answer':>11} {'x full':>7}"
        f" {'reused':>7} {'floor':>6} {'1st tok':>8} {'answer':>7}"
    )
    for name in names:
        e = entry[name]
        second = e["second_token_s"]["median"] * 1000 if e["second_token_s"] else float("nan")
        print(
            f"  {name:18} {ms(e['ttft_s'])} {e['speedup_median']:7.2f}x {second:11.0f} {ms(e['total_s'])}"
            f" {e['total_ratio_vs_full']:6.2f}x {e['reuse_share']['mean']:7.0%} {e['floor_s']['median'] * 1000:6.0f}"
            f" {e['first_token_agreement_vs_full']:8.0%} {e['answer_agreement_vs_full']:7.0%}"
        )


def ms(summary: dict[str, float]) -> str:
    return f"{summary['median'] * 1000:5.0f} ({summary['mean'] * 1000:4.0f})"


if __name__ == "__main__":
    main()
