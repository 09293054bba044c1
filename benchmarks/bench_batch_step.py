"""A decode step of many requests at once against one step each, by rows (continuous batching).

Each row's cache is a full prefill of its own NQ text of --length tokens; then, per row count,
the median over --steps of one step each in turn (each row alone in a buffer of its own, as a
lone request steps) against one step of all rows (`step_logits` over one `BatchKV` the rows
joined), and the largest logit difference between a row's batched and lone logits at the first
step (0: the step's numerics do not depend on the rows beside it, `hf.step`). Then the same step
with every row verifying a draft of --draft-tokens (a row of 1 + d tokens): a draft pays only where
a row takes more tokens a pass, on average, than that pass costs in one-token steps (its ratio).

JSON: benchmarks/results/bench_batch_step.json (or --out).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from kvboost_lab import harness
from kvboost_rag.eval.data import load_qa
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.fingerprint import weight_format
from kvboost_rag.hf.step import step_for, step_logits


def row_prompts(tokenizer, rows: int, length: int) -> list[list[int]]:
    """`rows` different texts of exactly `length` tokens: NQ passages joined, one start each."""
    passages = [e.passages[0].as_document() for e in load_qa(limit=60 * rows)]
    prompts = []
    for row in range(rows):
        text = "\n\n".join(passages[row * 60 : (row + 1) * 60])
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids[:length])
    return prompts


@torch.inference_mode()
def main() -> None:
    p = harness.parser(__doc__, questions=0, k=0, seed=0, out="bench_batch_step.json")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--length", type=int, default=512, help="prompt tokens of every row")
    p.add_argument("--steps", type=int, default=30, help="steps timed per row count (after two untimed)")
    p.add_argument("--draft-tokens", type=int, nargs="+", default=[1, 3], help="draft lengths verified a row")
    args = harness.parse(p)
    engine = harness.load_engine(args)
    model, tokenizer = engine.model, engine.tokenizer
    step = step_for(model)
    if step is None:
        raise SystemExit("this model does not take the decode step, so it does not batch")
    prompts = row_prompts(tokenizer, max(args.rows), args.length)
    prefilled = []
    for ids in prompts:
        cache = make_cache()
        tokens = torch.tensor([ids])
        logits = forward_last_logits(model, tokens, torch.arange(len(ids)).view(1, -1), cache)
        prefilled.append((cache, int(logits.argmax())))
    dtype = prefilled[0][0].layers[0].keys.dtype  # the cache's (the model's first parameter may be packed)
    results = []
    for rows in args.rows:
        caches = [copy.deepcopy(cache) for cache, _ in prefilled[:rows]]
        tokens = [token for _, token in prefilled[:rows]]
        sequential, first_sequential = [], []
        lone = []
        for cache in caches:
            kv = step.new_kv(dtype)
            kv.join(cache)
            lone.append(kv)
        for index in range(args.steps + 2):
            started = time.perf_counter()
            outs = [
                step_logits(step, torch.tensor([[t]]), torch.tensor([[args.length + index]]), kv)[0, 0]
                for t, kv in zip(tokens, lone)
            ]
            sequential.append(time.perf_counter() - started)
            if index == 0:
                first_sequential = outs
        kv = step.new_kv(dtype)
        for cache, _ in prefilled[:rows]:
            kv.join(copy.deepcopy(cache))
        batched, first_batched = [], None
        for index in range(args.steps + 2):
            started = time.perf_counter()
            position = torch.full((rows, 1), args.length + index)
            out = step_logits(step, torch.tensor(tokens).view(rows, 1), position, kv)[:, 0]
            batched.append(time.perf_counter() - started)
            if index == 0:
                first_batched = out
        assert first_batched is not None
        drafted = {}
        for draft in args.draft_tokens:  # rows of 1 + draft tokens, dropped again: the same length each pass
            times = []
            for index in range(args.steps + 2):
                started = time.perf_counter()
                position = torch.arange(draft + 1).view(1, -1) + args.length + args.steps + 2
                step_logits(step, torch.tensor(tokens).view(rows, 1).repeat(1, draft + 1), position.repeat(rows, 1), kv)
                times.append(time.perf_counter() - started)
                for row in range(rows):
                    kv.drop_last(row, draft + 1)
            drafted[str(draft)] = statistics.median(times[2:]) * 1000
        difference = max(float((first_batched[r] - first_sequential[r]).abs().max()) for r in range(rows))
        one_each, together = statistics.median(sequential[2:]), statistics.median(batched[2:])
        results.append(
            {
                "rows": rows,
                "one_step_each_ms": one_each * 1000,
                "batched_step_ms": together * 1000,
                "speedup": one_each / together,
                "max_logit_difference": difference,
                "draft_step_ms": drafted,  # by draft length
                # tokens a row must take a pass for that draft to pay: the pass in one-token steps
                "draft_break_even": {d: ms / (together * 1000) for d, ms in drafted.items()},
            }
        )
        print(
            f"{rows} rows: one each {one_each * 1000:.1f} ms, batched {together * 1000:.1f} ms "
            f"({one_each / together:.2f}x), max logit difference {difference:.3g}; with drafts "
            + ", ".join(f"{d}: {ms:.1f} ms" for d, ms in drafted.items())
        )
    report = {
        "prompt_tokens": args.length,
        "weights": weight_format(model),
        "dtype": str(dtype),
        "threads": torch.get_num_threads(),
        "rows": results,
    }
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
