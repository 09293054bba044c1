"""sdpa against the engine's few-queries attention path, on reuse passes: speed and accuracy.

Both run the same prompts (NQ-Open, FAISS top-k, warmed passages); first-token agreement and KL
are against full prefill (which runs sdpa either way). The engine's choice of attention for
reuse passes rests on these numbers (README, "How it works", step 4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from kvboost_rag import KVBoostRAG
from kvboost_rag.evaluation import first_token_kl
from kvboost_rag.kv_cache import REUSE_ATTENTION
from kvboost_rag.prompting import rag_messages
from kvboost_rag.retrieval import sample_nq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_attention.json")
    args = parser.parse_args()

    chosen, retrieved = sample_nq(args.questions, args.k, seed=args.seed)
    engine = KVBoostRAG.from_pretrained()
    for documents in retrieved:
        engine.warm(documents)
    prompts = [rag_messages(q.question, list(docs)) for q, docs in zip(chosen, retrieved)]
    full = [engine.next_token_logits(p, mode="full")[0] for p in prompts]

    rows = []
    print(f"{'attention':14} {'repair':10} {'median':>8} {'1st tok = full':>14} {'KL':>7}")
    for attention in ("sdpa", REUSE_ATTENTION):
        engine.model.set_attn_implementation(attention)
        for repair in ("none", "boundary", "cacheblend"):
            seconds, agree, kl = [], 0, []
            for prompt, reference in zip(prompts, full):
                started = time.perf_counter()
                logits, _ = engine.next_token_logits(prompt, mode="reuse", repair=repair)
                seconds.append(time.perf_counter() - started)
                agree += int(logits.argmax() == reference.argmax())
                kl.append(first_token_kl(reference, logits))
            row = {
                "attention": attention,
                "repair": repair,
                "median_s": statistics.median(seconds),
                "first_token_agreement": agree / len(prompts),
                "first_token_kl_mean": statistics.mean(kl),
            }
            rows.append(row)
            print(
                f"{attention:14} {repair:10} {row['median_s'] * 1000:6.0f}ms "
                f"{row['first_token_agreement']:14.1%} {row['first_token_kl_mean']:7.4f}"
            )
    settings = {"questions": args.questions, "k": args.k, "seed": args.seed, "dtype": str(engine.dtype)}
    args.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
