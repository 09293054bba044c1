"""Decode-time KV retrieval on long NQ prompts: the same answers as dense attention?

NQ-Open questions with their top-k FAISS passages (k = 40 by default: ~5.5k tokens), shuffled
as the eval does. Per prompt, full prefill then greedy decoding, once with dense attention and
once with retrieval (RetrievalConfig's defaults, on from the first token): whether the 32-token
answers are equal token for token, EM (best subspan, the answer cut at its first line) paired,
and each decode's tokens/s.

JSON: benchmarks/results/bench_retrieval_nq.json (or --out).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from kvboost_rag import KVBoostRAG, RetrievalConfig
from kvboost_rag.eval import harness
from kvboost_rag.eval.metrics import best_subspan_em


def main() -> None:
    p = harness.parser(__doc__, questions=10, k=40, seed=0, out="bench_retrieval_nq.json", max_new_tokens=32)
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    dense = harness.load_engine(args)
    sparse = KVBoostRAG(
        dense.model,
        dense.tokenizer,
        replace(dense.config, retrieval=RetrievalConfig(enabled=True, min_prompt_tokens=1)),
        name=dense.name,
    )
    rows = []
    options = dict(mode="full", max_new_tokens=args.max_new_tokens, ignore_eos=True, store_prompt=False)
    for i in range(len(nq)):
        prompt = nq.prompt(i, args.seed)
        answers = nq.examples[i].answers
        a = dense.generate(prompt, **options)
        b = sparse.generate(prompt, **options)
        rows.append(
            {
                "prompt_tokens": a.prompt_tokens,
                "same_tokens": a.token_ids == b.token_ids,
                "same_first_line": a.text.strip().split("\n")[0] == b.text.strip().split("\n")[0],
                "em_dense": best_subspan_em(a.text.strip().split("\n")[0], answers),
                "em_retrieval": best_subspan_em(b.text.strip().split("\n")[0], answers),
                "dense_tokens_per_s": a.tokens_per_s,
                "retrieval_tokens_per_s": b.tokens_per_s,
                "corrected_share": b.retrieval.corrected_share if b.retrieval else None,
            }
        )
        print(i, rows[-1], flush=True)
    n = len(rows)
    report = {
        "questions": n,
        "k": args.k,
        "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in rows),
        "same_tokens_share": sum(r["same_tokens"] for r in rows) / n,
        "same_first_line_share": sum(r["same_first_line"] for r in rows) / n,
        "em_dense": sum(r["em_dense"] for r in rows) / n,
        "em_retrieval": sum(r["em_retrieval"] for r in rows) / n,
        "decode_speedup_median": statistics.median(r["retrieval_tokens_per_s"] / r["dense_tokens_per_s"] for r in rows),
        "rows": rows,
    }
    print({k: v for k, v in report.items() if k != "rows"})
    harness.write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
