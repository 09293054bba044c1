"""fp32 against bf16 for the default model on this machine: prefill speed and greedy agreement.

The engine's default dtype is chosen from these numbers (README, "Choosing the dtype").
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from kvboost_rag import KVBoostRAG
from kvboost_rag.kv_cache import forward_last_logits, make_cache
from kvboost_rag.metrics import best_subspan_em
from kvboost_rag.prompting import rag_messages
from kvboost_rag.qa_dataset import load_qa


def prefill_seconds(engine: KVBoostRAG, n: int, repeats: int = 3) -> float:
    ids = torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        forward_last_logits(engine.model, ids, torch.arange(n), make_cache())
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--docs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_dtype.json")
    args = parser.parse_args()

    examples = load_qa(limit=400)
    rng = random.Random(0)
    chosen = rng.sample(examples, args.questions)
    prompts = []
    for example in chosen:
        others = [e.passages[0].as_document() for e in rng.sample(examples, args.docs - 1) if e is not example]
        docs = others + [example.passages[0].as_document()]
        rng.shuffle(docs)
        prompts.append(rag_messages(example.question, docs))

    fp32 = KVBoostRAG.from_pretrained(dtype="float32")
    bf16_model = type(fp32.model).from_pretrained(fp32.model.config._name_or_path, dtype=torch.bfloat16).eval()
    engines = {"float32": fp32, "bfloat16": KVBoostRAG(bf16_model, fp32.tokenizer)}
    report: dict = {"questions": args.questions, "docs_per_prompt": args.docs, "dtypes": {}}
    outputs: dict[str, list] = {}
    for name, engine in engines.items():
        results = [engine.generate(p, mode="full", max_new_tokens=32, stop=["\n"]) for p in prompts]
        outputs[name] = results
        report["dtypes"][name] = {
            "prefill_2048_s": prefill_seconds(engine, 2048),
            "prefill_512_s": prefill_seconds(engine, 512),
            "median_ttft_s": statistics.median(r.ttft_s for r in results),
            "decode_tokens_per_s": statistics.median(r.tokens_per_s for r in results if r.new_tokens > 1),
            "em": statistics.fmean(best_subspan_em(r.text, e.answers) for r, e in zip(results, chosen)),
        }
    pairs = list(zip(outputs["float32"], outputs["bfloat16"]))
    report["agreement"] = {
        "first_token": statistics.fmean(a.token_ids[:1] == b.token_ids[:1] for a, b in pairs),
        "whole_answer": statistics.fmean(a.text.strip() == b.text.strip() for a, b in pairs),
    }
    print(json.dumps(report, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
