"""Reuse under a memory budget: does the memory tier keep serving a prompt's chunks when it holds
only a few prompts' worth, with the store on disk?

Warms the top-k documents of `--questions` NQ questions into a disk store, then, for memory
budgets of 1x, 2x, 4x and 16x one prompt's chunks (and the default budget), answers the same
prompts twice with a fresh memory tier over that store and records the share of each prompt
served from reused KV (the plan: lookups, loads from disk, eviction; no generation needed).
Before requests were protected (issue 14), a 50 MB budget (~3 prompts) gave 0.04-0.41.

JSON: benchmarks/results/bench_budget.json (or --out).
"""

from __future__ import annotations

import statistics
import tempfile
import warnings
from pathlib import Path

from kvboost_lab import harness
from kvboost_rag import ChunkStore, EngineConfig, KVBoostRAG
from kvboost_rag.store.disk import DiskStore

MULTIPLES = (1, 2, 4, 16)


def prompt_bytes(engine: KVBoostRAG, prompt: list[dict[str, str]]) -> int:
    """Bytes of the distinct chunks one prompt reuses."""
    plan = engine.plan(prompt)
    entries = {id(s.entry): s.entry for s in plan.segments if s.entry is not None}
    return sum(e.nbytes for e in entries.values())


def shares(engine: KVBoostRAG, prompts: list[list[dict[str, str]]]) -> list[float]:
    result = []
    for prompt in prompts:
        plan = engine.plan(prompt)
        result.append(1 - plan.tokens("computed") / plan.segments[-1].end)
    return result


def main() -> None:
    p = harness.parser(__doc__, questions=50, k=6, seed=0, out="bench_budget.json")
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
    root = Path(tempfile.mkdtemp(prefix="kvboost-budget-"))
    writer = KVBoostRAG.from_pretrained(args.model, dtype=args.dtype, store=str(root), memory_budget_bytes=2**34)
    report = writer.warm(nq.all_documents())
    print(f"warmed {report.documents} passages into {root} in {report.seconds:.0f} s")
    one_prompt = statistics.median(prompt_bytes(writer, prompt) for prompt in prompts)
    rows = []
    budgets = [(f"{m}x", int(m * one_prompt)) for m in MULTIPLES] + [("default", EngineConfig().memory_budget_bytes)]
    for name, budget in budgets:
        store = ChunkStore(budget, writer.config.match_window, tiers=[DiskStore(root)])
        engine = KVBoostRAG(writer.model, writer.tokenizer, EngineConfig(memory_budget_bytes=budget), store=store)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first, second = shares(engine, prompts), shares(engine, prompts)
        row = {
            "budget": name,
            "budget_bytes": budget,
            "first_pass_share_mean": statistics.fmean(first),
            "second_pass_share_mean": statistics.fmean(second),
            "second_pass_share_min": min(second),
            "evictions": store.stats().evictions,
            "budget_warnings": sum("smaller than the chunks one request uses" in str(w.message) for w in caught),
        }
        rows.append(row)
        print(
            f"{name:>8} ({budget / 2**20:8.1f} MiB): reuse share {row['first_pass_share_mean']:.2f} then "
            f"{row['second_pass_share_mean']:.2f} (min {row['second_pass_share_min']:.2f}), "
            f"{row['evictions']} evictions"
        )
    harness.write_json(
        args.out,
        {"questions": len(nq), "k": args.k, "one_prompt_bytes": one_prompt, "dtype": str(writer.dtype), "rows": rows},
    )


if __name__ == "__main__":
    main()
