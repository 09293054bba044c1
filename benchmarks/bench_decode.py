"""Decode speed against prompt length: our decode loop, transformers' `generate`, decode-time KV
retrieval (SparseDecodeConfig), and the memory bandwidth floor.

Per prompt length (NQ passages joined up to it): decode tokens/s of `KVBoostRAG.generate` (full
prefill, greedy, `ignore_eos`), of `model.generate` (greedy, the same new tokens, timed between
its next-token choices; the same model, so on a bf16 CPU its linear layers are packed too),
and of the engine with retrieval on (its default budget, every length); whether their tokens
equal the dense loop's; retrieval's selection and attention time per step; and the floor: the
bytes a step must read (weights + the KV so far) over this machine's read bandwidth, measured
here (numpy sum over a 512 MB array).

JSON: benchmarks/results/bench_decode.json (or --out).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from kvboost_lab import harness
from kvboost_rag import KVBoostRAG, SparseDecodeConfig
from kvboost_rag.eval.data import load_qa
from kvboost_rag.hf.packed_linear import PackedLinear


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second one pass of numpy.sum reads here (the best of a few)."""
    data = np.ones(megabytes * 2**20 // 8, dtype=np.float64)
    best = min(_timed(lambda: data.sum()) for _ in range(repeats))
    return data.nbytes / best


def step_weight_bytes(model) -> int:
    """Bytes of weights a decode step reads: every linear layer's (packed or not) and the norms;
    of the input embedding only a row, unless it is also the output head."""
    embedding = model.get_input_embeddings().weight
    read = {id(p): p for p in model.parameters() if p is not embedding}
    for module in model.modules():
        if isinstance(module, PackedLinear):
            read[id(module.packed_weight)] = module.packed_weight
        elif isinstance(module, torch.nn.Linear):
            read[id(module.weight)] = module.weight
    return sum(t.numel() * t.element_size() for t in read.values())


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


class StepClock(LogitsProcessor):
    """The time of each of `generate`'s next-token choices: the first follows its prefill, each
    later one a decode step."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return scores

    def step_s(self) -> float:
        return (self.stamps[-1] - self.stamps[0]) / (len(self.stamps) - 1)


def step_s(result) -> float:
    """Seconds a decode step took: the answer after its first token, per token."""
    return (result.total_s - result.ttft_s) / (result.new_tokens - 1)


def prompt_of_length(tokenizer, passages: list[str], length: int) -> str:
    text, ids = "", []
    for passage in passages:
        text += passage + "\n\n"
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) >= length:
            break
    return tokenizer.decode(ids[:length])


def main() -> None:
    p = harness.parser(__doc__, questions=0, k=0, seed=0, out="bench_decode.json", max_new_tokens=32)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1000, 2000, 4000, 8000])
    p.add_argument("--repeats", type=int, default=1, help="runs per length; the median is kept")
    p.add_argument("--no-transformers", action="store_true", help="skip model.generate (one more prefill a length)")
    args = harness.parse(p)
    engine = harness.load_engine(args)
    model, tokenizer = engine.model, engine.tokenizer
    weights = step_weight_bytes(model)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_per_token = (
        2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * next(model.parameters()).element_size()
    )
    bandwidth = read_bandwidth()
    passages = [e.passages[0].as_document() for e in load_qa(limit=400)]
    retrieving = KVBoostRAG(
        model,
        tokenizer,
        replace(engine.config, sparse_decode=SparseDecodeConfig(enabled=True, min_prompt_tokens=1)),
        name=engine.name,
    )
    rows = []
    for length in args.lengths:
        prompt = prompt_of_length(tokenizer, passages, length)
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
        ours, theirs, selective, same, same_selective, stats = [], [], [], True, True, None
        for _ in range(args.repeats):
            options = dict(mode="full", max_new_tokens=args.max_new_tokens, ignore_eos=True, store_prompt=False)
            dense = engine.generate(prompt, **options)
            ours.append(step_s(dense))
            sparse = retrieving.generate(prompt, **options)
            selective.append(step_s(sparse))
            same_selective = same_selective and sparse.token_ids == dense.token_ids
            stats = sparse.sparse_decode
            if not args.no_transformers:
                stamps = StepClock()
                with torch.inference_mode():
                    out = model.generate(
                        ids,
                        max_new_tokens=args.max_new_tokens,
                        min_new_tokens=args.max_new_tokens,
                        do_sample=False,
                        logits_processor=LogitsProcessorList([stamps]),
                    )
                theirs.append(stamps.step_s())
                same = same and out[0, ids.shape[1] :].tolist() == dense.token_ids
        floor = (weights + kv_per_token * (length + args.max_new_tokens / 2)) / bandwidth
        step, sparse_step = statistics.median(ours), statistics.median(selective)
        layer_steps = max(1, stats.steps) if stats else 1
        stats = stats if stats and stats.steps else None  # below the budget: dense, nothing to report
        rows.append(
            {
                "prompt_tokens": int(ids.shape[1]),
                "ours_step_ms": step * 1000,
                "ours_tokens_per_s": 1 / step,
                "transformers_step_ms": statistics.median(theirs) * 1000 if theirs else None,
                "transformers_tokens_per_s": 1 / statistics.median(theirs) if theirs else None,
                "transformers_same_tokens": same if theirs else None,
                "floor_step_ms": floor * 1000,
                "ours_x_floor": step / floor,
                "retrieval_step_ms": sparse_step * 1000,
                "retrieval_speedup": step / sparse_step,
                "retrieval_same_tokens": same_selective,
                "retrieval_select_ms_per_step": stats.select_s / layer_steps * model.config.num_hidden_layers * 1000
                if stats
                else None,
                "retrieval_attend_ms_per_step": stats.attend_s / layer_steps * model.config.num_hidden_layers * 1000
                if stats
                else None,
                "retrieval_corrected_share": stats.corrected_share if stats else None,
                "retrieval_active": bool(stats and stats.steps),
            }
        )
        print(rows[-1], flush=True)
    report = {
        "weights_bytes": weights,
        "kv_bytes_per_token": kv_per_token,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "max_new_tokens": args.max_new_tokens,
        "rows": rows,
    }
    harness.write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
