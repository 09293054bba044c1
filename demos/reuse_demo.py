"""Warm a few NQ passages, then answer questions whose prompts hold them in another order.

Prints, per question, TTFT and whole-answer time of a full prefill and with reuse, and the share
of the prompt reused.
Runs offline on the embedded default model (SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import random

from demo_table import HEADER, Row, format_row, format_summary

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.data import load_qa
from kvboost_rag.eval.prompt import rag_messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--docs-per-prompt", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bf16 where native)")
    args = parser.parse_args()

    examples = load_qa(limit=args.questions)
    passages = [e.passages[0].as_document() for e in examples]
    print("Loading the embedded default model ...")
    engine = KVBoostRAG.from_pretrained(dtype=args.dtype, store="memory")  # the demo leaves no files
    report = engine.warm(passages)
    print(f"Warmed {report.documents} passages ({report.tokens_encoded} tokens) in {report.seconds:.2f} s\n")

    rng = random.Random(args.seed)
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    rows = []
    print(HEADER)
    for i, example in enumerate(examples):
        others = rng.sample([p for j, p in enumerate(passages) if j != i], args.docs_per_prompt - 1)
        documents = others + [passages[i]]
        rng.shuffle(documents)
        messages = rag_messages(example.question, documents)
        full = engine.generate(messages, mode="full", max_new_tokens=24, stop=["\n"])
        reuse = engine.generate(messages, mode="reuse", max_new_tokens=24, stop=["\n"], store_prompt=False)
        rows.append(
            Row(example.question, full.ttft_s, reuse.ttft_s, reuse.reuse_share, reuse.text, full.total_s, reuse.total_s)
        )
        print(format_row(rows[-1]))
    repair, exactness = engine.config.repair, engine.config.exactness
    verified = (
        f", first-token near-ties below {exactness.verify_margin:g} verified on exact KV" if exactness.checks(0) else ""
    )
    refreshed = ", the answer after its first token on exact KV" if exactness.refresh else ""
    print(format_summary(rows, f"{repair.strategy} repair of the moved chunks{verified}{refreshed}"))


if __name__ == "__main__":
    main()
