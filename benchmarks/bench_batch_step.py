"""A decode step of many requests at once against one step each, by rows (continuous batching).

Each row's cache is a full prefill of its own NQ text of --length tokens (equal lengths, so a
batched row attends over exactly its own slots); then, per row count, the median over --steps
of one step each in turn (`decode_step_logits`, the lean step a lone request takes) against one
batched step (`batched_step_logits` over a `BatchKV` the rows joined), and the largest logit
difference between a row's batched and sequential logits at the first step.

JSON: benchmarks/results/bench_batch_step.json (or --out).
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from kvboost_lab import harness
from kvboost_rag.eval.data import load_qa
from kvboost_rag.hf.batch_kv import BatchKV
from kvboost_rag.hf.batch_step import batched_step_logits
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.fingerprint import weight_format
from kvboost_rag.hf.lean_step import decode_step_logits, lean_step_for


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
    args = harness.parse(p)
    engine = harness.load_engine(args)
    model, tokenizer = engine.model, engine.tokenizer
    step = lean_step_for(model)
    if step is None:
        raise SystemExit("this model does not take the lean step, so it does not batch")
    prompts = row_prompts(tokenizer, max(args.rows), args.length)
    prefilled = []
    for ids in prompts:
        cache = make_cache()
        tokens = torch.tensor([ids])
        logits = forward_last_logits(model, tokens, torch.arange(len(ids)).view(1, -1), cache)
        prefilled.append((cache, int(logits.argmax())))
    config = model.config.get_text_config(decoder=True)
    dtype = prefilled[0][0].layers[0].keys.dtype  # the cache's (the model's first parameter may be packed)
    results = []
    for rows in args.rows:
        caches = [copy.deepcopy(cache) for cache, _ in prefilled[:rows]]
        tokens = [token for _, token in prefilled[:rows]]
        sequential, first_sequential = [], []
        for index in range(args.steps + 2):
            started = time.perf_counter()
            outs = [
                decode_step_logits(model, torch.tensor([t]), torch.tensor([args.length + index]), c)
                for t, c in zip(tokens, caches)
            ]
            sequential.append(time.perf_counter() - started)
            if index == 0:
                first_sequential = outs
        kv = BatchKV(config.num_hidden_layers, step.kv_heads, step.head_dim, dtype, torch.device("cpu"))
        for cache, _ in prefilled[:rows]:
            kv.join(copy.deepcopy(cache))
        batched, first_batched = [], None
        for index in range(args.steps + 2):
            started = time.perf_counter()
            out = batched_step_logits(step, torch.tensor(tokens), torch.full((rows,), args.length + index), kv)
            batched.append(time.perf_counter() - started)
            if index == 0:
                first_batched = out
        assert first_batched is not None
        difference = max(float((first_batched[r] - first_sequential[r]).abs().max()) for r in range(rows))
        one_each, together = statistics.median(sequential[2:]), statistics.median(batched[2:])
        results.append(
            {
                "rows": rows,
                "one_step_each_ms": one_each * 1000,
                "batched_step_ms": together * 1000,
                "speedup": one_each / together,
                "max_logit_difference": difference,
            }
        )
        print(
            f"{rows} rows: one each {one_each * 1000:.1f} ms, batched {together * 1000:.1f} ms "
            f"({one_each / together:.2f}x), max logit difference {difference:.3g}"
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
