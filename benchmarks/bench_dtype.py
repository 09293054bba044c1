"""fp32 against bf16 for the default model on this machine: prefill speed and greedy agreement.

Prefill time is the forward pass over random tokens alone (median of 3 after one untimed);
TTFT is wall clock from the call to the first token of full prefill on NQ-Open top-k prompts;
agreement compares the second dtype's greedy answers with the first's. The engine's default
dtype is chosen from these numbers (README, "Choosing the dtype"): native bf16 (AVX512-BF16,
AMX, CUDA) wins, emulated bf16 (AVX2) loses.

JSON: benchmarks/results/bench_dtype.json (or --out).
"""

from __future__ import annotations

import statistics
import time

import torch

from kvboost_lab import harness
from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.metrics import best_subspan_em
from kvboost_rag.hf.cache import forward_last_logits, make_cache


def prefill_seconds(engine: KVBoostRAG, n: int, repeats: int = 3) -> float:
    ids = torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(0)).to(engine.device)
    positions = torch.arange(n, device=engine.device)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        forward_last_logits(engine.model, ids, positions, make_cache())
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> None:
    p = harness.parser(__doc__, questions=40, k=5, seed=0, out="bench_dtype.json", max_new_tokens=32, dtype=False)
    p.add_argument("--dtypes", nargs=2, default=["float32", "bfloat16"], help="reference, then the one compared")
    p.add_argument("--prefill-tokens", type=int, nargs="+", default=[2048, 512])
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]

    report: dict = {"questions": args.questions, "docs_per_prompt": args.k, "dtypes": {}}
    outputs: dict[str, list] = {}
    for dtype in args.dtypes:
        engine = harness.load_engine(args, dtype=dtype)
        engine.generate("Warm-up.", max_new_tokens=1, mode="full")
        results = [engine.generate(p, mode="full", max_new_tokens=args.max_new_tokens, stop=["\n"]) for p in prompts]
        outputs[dtype] = results
        decoding = [r.tokens_per_s for r in results if r.new_tokens > 1]
        report["dtypes"][dtype] = {
            **{f"prefill_{n}_s": prefill_seconds(engine, n) for n in args.prefill_tokens},
            "median_ttft_s": statistics.median(r.ttft_s for r in results),
            "decode_tokens_per_s": statistics.median(decoding) if decoding else None,
            "em": statistics.fmean(best_subspan_em(r.text, e.answers) for r, e in zip(results, nq.examples)),
        }
        print(dtype, report["dtypes"][dtype])
    pairs = list(zip(*(outputs[d] for d in args.dtypes)))
    report["agreement"] = {
        "first_token": statistics.fmean(a.token_ids[:1] == b.token_ids[:1] for a, b in pairs),
        "whole_answer": statistics.fmean(a.text.strip() == b.text.strip() for a, b in pairs),
    }
    print("agreement", report["agreement"])
    harness.write_json(args.out, report, indent=2)


if __name__ == "__main__":
    main()
