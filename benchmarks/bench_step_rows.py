"""What a forward pass over a RAG prompt's cache costs per query row: the price of repair work
carried by decode steps (issue 15's progressive repair) against the same work in the prefill.

Per NQ question (top-k passages, the eval's prompt): a full prefill, then passes of M query rows
(M = 1 is a decode step) over that cache at the answer's next positions, each cropped off again,
and the medians over the questions. A decode step reads every weight for one row; if extra rows
rode on it for little, repair spread over the first decode steps would cost less than the same
tokens in CacheBlend's prefill pass. The table says what each extra row costs, beside a full
prefill's cost per prompt token.

JSON: benchmarks/results/bench_step_rows.json (or --out).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from kvboost_lab import harness
from kvboost_rag.hf.cache import forward_last_logits, make_cache

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def timed_pass(model: Any, cache: Any, start: int, rows: int) -> float:
    """Seconds for `rows` tokens at positions start.. over `cache` (causal among themselves);
    the cache is cropped back after."""
    ids, positions = torch.full((rows,), 13), torch.arange(start, start + rows)
    began = time.perf_counter()
    forward_last_logits(model, ids, positions, cache)
    spent = time.perf_counter() - began
    for layer in cache.layers:
        layer.crop(-rows)
    return spent


def main() -> None:
    p = harness.parser(__doc__, questions=6, k=5, seed=0, out="bench_step_rows.json")
    p.add_argument("--repeats", type=int, default=5, help="passes per row count and question; the median is kept")
    args = harness.parse(p)
    engine = harness.load_engine(args)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    per_rows: dict[int, list[float]] = {rows: [] for rows in ROWS}
    prefill_per_token, lengths = [], []
    for i in range(len(nq)):
        tokens = engine.tokenize_prompt(nq.prompt(i, args.seed))
        cache = make_cache()
        began = time.perf_counter()
        forward_last_logits(engine.model, torch.from_numpy(tokens), torch.arange(len(tokens)), cache)
        prefill_per_token.append((time.perf_counter() - began) / len(tokens))
        lengths.append(len(tokens))
        timed_pass(engine.model, cache, len(tokens), 1)  # warm-up
        for rows in ROWS:
            spent = [timed_pass(engine.model, cache, len(tokens), rows) for _ in range(args.repeats)]
            per_rows[rows].append(statistics.median(spent))
    step = statistics.median(per_rows[1])
    table = []
    for rows in ROWS:
        seconds = statistics.median(per_rows[rows])
        extra = (seconds - step) / (rows - 1) if rows > 1 else None
        table.append({"rows": rows, "pass_ms": seconds * 1000, "extra_row_ms": extra * 1000 if extra else None})
        extra_text = f"{extra * 1000:.2f} ms" if extra else "-"
        print(f"{rows:>4} rows: {seconds * 1000:7.1f} ms a pass, each row past the first {extra_text}")
    per_token = statistics.median(prefill_per_token)
    print(f"full prefill: {per_token * 1000:.2f} ms a prompt token (median prompt {statistics.median(lengths):.0f})")
    report = {
        "questions": len(nq),
        "k": args.k,
        "prompt_tokens_median": statistics.median(lengths),
        "prefill_ms_per_token": per_token * 1000,
        "rows": table,
    }
    harness.write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
