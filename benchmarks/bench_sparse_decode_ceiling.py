"""What any decode-time selection could give here: a step with attention to a free window.

At each prompt length, over one prefilled cache, decode steps (greedy, one process, the modes
alternating round by round) with: dense attention; no attention at all (the rest of the step);
attention to the last `budget` tokens as a view (a selection that costs nothing and copies
nothing: the ceiling of any selection within that budget); and SparseDecodeConfig's retrieval at
each correction threshold asked for (default: its own, and -1, speculation never corrected).
Median step per mode, and retrieval's selection and attention time per step and share of KV
heads corrected.

JSON: benchmarks/results/bench_sparse_decode_ceiling.json (or --out).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_decode import prompt_of_length

from kvboost_lab import harness
from kvboost_rag import SparseDecodeConfig
from kvboost_rag.eval.data import load_qa
from kvboost_rag.hf.cache import decode_kv_of, forward_last_logits, make_cache
from kvboost_rag.ops.attention import single_query_attention
from kvboost_rag.ops.sparse_decode import SparseDecode, SparseDecodeStats


class Window:
    """Attention to the last `tokens` keys only (0: none at all), as views of the cache."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.cache: Any = None  # the pass's cache, for the float copies a dense step reads

    def attend(self, layer: int, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float):
        if not self.tokens:
            return query.new_zeros(1, 1, query.shape[1], query.shape[3])
        window = slice(keys.shape[2] - self.tokens, keys.shape[2])
        decode_kv = decode_kv_of(self.cache, layer, keys)  # the values a dense step reads: the window rounds alike
        float_window = None if decode_kv is None else (decode_kv[0][:, :, window], decode_kv[1][:, :, window])
        return single_query_attention(query, keys[:, :, window], values[:, :, window], scale, float_window)

    def forget(self) -> None:
        pass


def main() -> None:
    p = harness.parser(__doc__, questions=0, k=0, seed=0, out="bench_sparse_decode_ceiling.json")
    p.add_argument("--lengths", type=int, nargs="+", default=[4000, 8000])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=12, help="decode steps a round; the first two are not timed")
    p.add_argument("--thresholds", type=float, nargs="+", default=[SparseDecodeConfig().correction_threshold, -1.0])
    args = harness.parse(p)
    engine = harness.load_engine(args)
    budget = SparseDecodeConfig().budget_tokens
    passages = [e.passages[0].as_document() for e in load_qa(limit=400)]
    modes: dict[str, Callable[[], object]] = {
        "dense": lambda: None,
        "no_attention": lambda: Window(0),
        "free_window": lambda: Window(budget),
    }
    for threshold in args.thresholds:
        config = SparseDecodeConfig(enabled=True, min_prompt_tokens=1, correction_threshold=threshold)
        modes[f"retrieval {threshold:g}"] = lambda config=config: SparseDecode(config)
    rows = []
    for length in args.lengths:
        tokens = engine.tokenize_prompt(prompt_of_length(engine.tokenizer, passages, length))
        logits, keys, values = harness.full_prefill_kv(engine, tokens)
        steps: dict[str, list[float]] = {mode: [] for mode in modes}
        stats: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode, make in modes.items():
                attention, cache, token = make(), make_cache(keys, values), int(logits.argmax())
                if isinstance(attention, Window):
                    attention.cache = cache
                for i in range(args.steps):
                    started = time.perf_counter()
                    step_logits = forward_last_logits(
                        engine.model, torch.tensor([token]), torch.tensor([len(tokens) + i]), cache, sparse=attention
                    )
                    if i >= 2:
                        steps[mode].append(time.perf_counter() - started)
                    elif i == 1 and isinstance(attention, SparseDecode):
                        # the timed steps only (the first computes every page summary)
                        attention.stats = SparseDecodeStats()
                    token = int(step_logits.argmax())
                if isinstance(attention, SparseDecode):
                    s, timed = attention.stats, args.steps - 2
                    stats[mode].append((s.select_s / timed, s.attend_s / timed, s.corrected_share))
        dense = statistics.median(steps["dense"])
        row: dict[str, object] = {"prompt_tokens": len(tokens), "budget_tokens": budget, "modes": []}
        for mode in modes:
            step = statistics.median(steps[mode])
            measured = {"mode": mode, "step_ms": step * 1000, "speedup": dense / step}
            if stats[mode]:
                measured["select_ms"] = statistics.median(s[0] for s in stats[mode]) * 1000
                measured["attend_ms"] = statistics.median(s[1] for s in stats[mode]) * 1000
                measured["corrected_share"] = statistics.median(s[2] for s in stats[mode])
            row["modes"].append(measured)  # type: ignore[union-attr]
        rows.append(row)
        print(row, flush=True)
    harness.write_json(args.out, {"rounds": args.rounds, "steps": args.steps, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
