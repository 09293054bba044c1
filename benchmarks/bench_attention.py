"""sdpa against the engine's few-queries attention path, on reuse passes: speed and accuracy.

Both run the same prompts (NQ-Open, FAISS top-k, warmed passages); the time is wall clock of
the prefill alone (tokenize to first-token logits, repair included); first-token agreement and
KL are against full prefill (which runs sdpa either way). The engine's choice of attention for
reuse passes rests on these numbers (README, "How it works", step 4).

JSON: benchmarks/results/bench_attention.json (or --out).
"""

from __future__ import annotations

import statistics
import time

from kvboost_lab import harness
from kvboost_rag.hf.attention import REUSE_ATTENTION
from kvboost_rag.ops.logits import kl_divergence


def main() -> None:
    args = harness.parse(harness.parser(__doc__, questions=100, k=10, seed=7, out="bench_attention.json"))
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    engine = harness.load_engine(args)
    harness.warm(engine, nq)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
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
                kl.append(kl_divergence(reference, logits))
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
    harness.write_json(args.out, {"settings": settings, "rows": rows})


if __name__ == "__main__":
    main()
