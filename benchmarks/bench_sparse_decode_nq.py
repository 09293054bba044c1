"""Decode-time KV retrieval on long NQ prompts: the same answers as dense attention?

NQ-Open questions with their top-k FAISS passages (k = 40 by default: ~5k tokens; 60 fill ~7.3k
of the default model's 8k window), shuffled as the eval does. Per prompt, full prefill then
greedy decoding of 32 tokens with dense attention, and with each other decode attention: dense
attention through sdpa's kernel instead of the engine's (exact attention summed in another
order: the noise floor of "equal to dense" at this dtype, where a near-tie of two logits flips
either way), and retrieval at each correction threshold asked for (SparseDecodeConfig's other
defaults, on from the first token). Per attention: whether the 32 tokens and the answer line
equal dense attention's, EM of the answer line (best subspan) paired with dense's, and decode
tokens/s against dense's.

JSON: benchmarks/results/bench_sparse_decode_nq.json (or --out).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from kvboost_lab import harness
from kvboost_rag import KVBoostRAG, SparseDecodeConfig
from kvboost_rag.eval.metrics import best_subspan_em
from kvboost_rag.hf.attention import REUSE_ATTENTION


def first_line(text: str) -> str:
    """The answer as the eval scores it: up to its first newline."""
    return text.strip().split("\n")[0]


def main() -> None:
    p = harness.parser(__doc__, questions=10, k=40, seed=0, out="bench_sparse_decode_nq.json", max_new_tokens=32)
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=[SparseDecodeConfig().correction_threshold],
        help="retrieval's correction thresholds to run (-1: speculative selection never corrected)",
    )
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    dense = harness.load_engine(args)
    engines = {
        f"retrieval {threshold:g}": KVBoostRAG(
            dense.model,
            dense.tokenizer,
            replace(
                dense.config,
                sparse_decode=SparseDecodeConfig(enabled=True, min_prompt_tokens=1, correction_threshold=threshold),
            ),
            name=dense.name,
        )
        for threshold in args.thresholds
    }
    options = dict(mode="full", max_new_tokens=args.max_new_tokens, ignore_eos=True, store_prompt=False)
    rows: list[dict[str, Any]] = []
    for i in range(len(nq)):
        prompt, answers = nq.prompt(i, args.seed), nq.examples[i].answers
        reference = dense.generate(prompt, **options)
        results = {name: engine.generate(prompt, **options) for name, engine in engines.items()}
        dense.model.set_attn_implementation("sdpa")
        try:
            results["sdpa dense"] = dense.generate(prompt, **options)
        finally:
            dense.model.set_attn_implementation(REUSE_ATTENTION)
        row: dict[str, Any] = {
            "prompt_tokens": reference.prompt_tokens,
            "em_dense": best_subspan_em(first_line(reference.text), answers),
        }
        for name, result in results.items():
            row[name] = {
                "same_tokens": result.token_ids == reference.token_ids,
                "same_first_line": first_line(result.text) == first_line(reference.text),
                "em": best_subspan_em(first_line(result.text), answers),
                "speedup": result.tokens_per_s / reference.tokens_per_s,
                "corrected_share": result.sparse_decode.corrected_share if result.sparse_decode else None,
            }
        rows.append(row)
        print(i, row, flush=True)
    n = len(rows)

    def summary(name: str) -> dict[str, Any]:
        runs = [(row["em_dense"], row[name]) for row in rows]
        corrected = [r["corrected_share"] for _, r in runs if r["corrected_share"] is not None]
        return {
            "attention": name,
            "same_tokens_share": sum(r["same_tokens"] for _, r in runs) / n,
            "same_first_line_share": sum(r["same_first_line"] for _, r in runs) / n,
            "em": sum(r["em"] for _, r in runs) / n,
            "em_only_dense": sum(em > r["em"] for em, r in runs),
            "em_only_this": sum(r["em"] > em for em, r in runs),
            "decode_speedup_median": statistics.median(r["speedup"] for _, r in runs),
            "corrected_share_median": statistics.median(corrected) if corrected else None,
        }

    report = {
        "questions": n,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in rows),
        "em_dense": sum(r["em_dense"] for r in rows) / n,
        "attentions": [summary(name) for name in ["sdpa dense", *engines]],
        "rows": rows,
    }
    print({k: v for k, v in report.items() if k != "rows"})
    harness.write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
