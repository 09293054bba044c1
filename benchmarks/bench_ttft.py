"""TTFT of full prefill, prefix caching and position-independent reuse on NQ-Open RAG prompts.

Indexes the 2,655 gold passages in FAISS, retrieves the top k per question, warms every
retrieved passage first, then answers with the passages in shuffled order. Every TTFT is wall
clock from the call to the first sampled token (tokenizing, lookup, assembly, re-rotation and
the suffix prefill included). The floor is the forward pass over the uncached tokens alone,
given the assembled cache.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
from dataclasses import asdict
from pathlib import Path

import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.prompting import rag_messages
from kvboost_rag.qa_dataset import corpus, load_qa
from kvboost_rag.retrieval import PassageIndex

MODES = ("full", "prefix", "reuse")


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "mean": statistics.fmean(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 5, 10])
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_ttft.json")
    args = parser.parse_args()

    examples = load_qa()
    index = PassageIndex.build(corpus(examples))
    chosen = random.Random(args.seed).sample(examples, args.questions)
    retrieved = index.search([e.question for e in chosen], max(args.k))

    config = EngineConfig(memory_budget_bytes=12 * 1024**3)
    engine = KVBoostRAG.from_pretrained(dtype=args.dtype, config=config)
    # Prefix caching gets a store of its own that only ever holds earlier prompts, as in vLLM.
    prefix_engine = KVBoostRAG(
        engine.model, engine.tokenizer, EngineConfig(memory_budget_bytes=4 * 1024**3, mode="prefix")
    )
    engines = {"full": engine, "prefix": prefix_engine, "reuse": engine}

    documents = list(dict.fromkeys(p.as_document() for row in retrieved for p in row))
    warm = engine.warm(documents)
    print(f"warmed {warm.documents} passages, {warm.tokens_encoded} tokens, in {warm.seconds:.1f} s")
    for mode in MODES:  # warm-up, not timed
        engines[mode].generate(rag_messages("warm-up?", documents[:2]), mode=mode, max_new_tokens=1, store_prompt=False)

    report: dict = {
        "model": engine.name,
        "dtype": str(engine.dtype),
        "device": str(engine.device),
        "questions": args.questions,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "k": {},
    }
    rng = random.Random(args.seed)
    for k in args.k:
        rows: dict[str, list] = {m: [] for m in MODES}
        for q, (example, passages) in enumerate(zip(chosen, retrieved)):
            docs = [p.as_document() for p in passages[:k]]
            rng.shuffle(docs)
            messages = rag_messages(example.question, docs)
            for mode in MODES[q % 3 :] + MODES[: q % 3]:  # rotate the order: no mode always runs first
                rows[mode].append(engines[mode].generate(messages, mode=mode, max_new_tokens=1))
        full, prefix, reuse = (rows[m] for m in MODES)
        entry = {
            mode: {
                "ttft_s": summarize([r.ttft_s for r in rows[mode]]),
                "reuse_share": summarize([r.reuse_share for r in rows[mode]]),
            }
            for mode in MODES
        }
        entry["prompt_tokens"] = summarize([r.prompt_tokens for r in full])
        entry["reuse_floor_s"] = summarize([r.timings.prefill_s for r in reuse])
        entry["reuse_stages_s"] = {
            stage: statistics.median(getattr(r.timings, stage) for r in reuse)
            for stage in ("tokenize_s", "lookup_s", "assemble_s", "prefill_s", "sample_s")
        }
        entry["speedup_median"] = {
            m: entry["full"]["ttft_s"]["median"] / entry[m]["ttft_s"]["median"] for m in ("prefix", "reuse")
        }
        entry["first_token_agreement_reuse_vs_full"] = statistics.fmean(
            r.token_ids[:1] == f.token_ids[:1] for r, f in zip(reuse, full)
        )
        report["k"][str(k)] = entry
        print_row(k, entry)
    report["store"] = asdict(engine.store.stats())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


def print_row(k: int, entry: dict) -> None:
    ms = lambda s: f"{s * 1000:7.0f}"  # noqa: E731
    print(
        f"\nk={k:<3} prompt {entry['prompt_tokens']['median']:.0f} tokens (median)\n"
        f"  {'mode':7} {'median ms':>9} {'mean ms':>9} {'speedup':>8} {'reused':>7}"
    )
    for mode in MODES:
        t = entry[mode]["ttft_s"]
        speed = entry["speedup_median"].get(mode, 1.0)
        print(
            f"  {mode:7} {ms(t['median']):>9} {ms(t['mean']):>9} {speed:7.2f}x {entry[mode]['reuse_share']['mean']:7.0%}"
        )
    print(
        f"  floor   {ms(entry['reuse_floor_s']['median']):>9} {ms(entry['reuse_floor_s']['mean']):>9}"
        f"   (uncached tokens only, given a ready cache)"
    )
    print(f"  reuse stages (median s): {json.dumps({k: round(v, 4) for k, v in entry['reuse_stages_s'].items()})}")
    print(f"  first-token agreement, reuse vs full: {entry['first_token_agreement_reuse_vs_full']:.0%}")


if __name__ == "__main__":
    main()
