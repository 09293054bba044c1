"""What the demos share: the framework demos' options and the table every demo prints (per
question, TTFT of a full prefill and with reuse)."""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from kvboost_rag.qa_dataset import QAExample, load_qa


def framework_demo_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--corpus", type=int, default=100, help="NQ passages in the index")
    parser.add_argument("--k", type=int, default=5, help="passages retrieved per question")
    parser.add_argument("--warm-at", choices=["ingestion", "retrieval"], default="ingestion")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def corpus_and_questions(args: argparse.Namespace) -> tuple[list[QAExample], list[str]]:
    """The first `--corpus` NQ examples (their gold passages are indexed) and questions drawn from them."""
    examples = load_qa(limit=args.corpus)
    return examples, [e.question for e in random.Random(args.seed).sample(examples, args.questions)]


@dataclass(slots=True)
class Row:
    question: str
    full_ttft_s: float
    reuse_ttft_s: float
    reuse_share: float
    answer: str


HEADER = f"{'question':44} {'full TTFT':>9} {'reuse TTFT':>10} {'speedup':>7} {'reused':>6}  answer (reuse)"


def format_row(row: Row) -> str:
    return (
        f"{row.question[:44]:44} {row.full_ttft_s * 1000:7.0f}ms {row.reuse_ttft_s * 1000:8.0f}ms "
        f"{row.full_ttft_s / row.reuse_ttft_s:6.1f}x {row.reuse_share:6.0%}  {row.answer.strip()[:40]}"
    )


def format_summary(rows: list[Row], what: str) -> str:
    full = statistics.median(r.full_ttft_s for r in rows)
    reuse = statistics.median(r.reuse_ttft_s for r in rows)
    share = statistics.median(r.reuse_share for r in rows)
    return (
        f"\nmedian TTFT: full {full * 1000:.0f} ms, reuse {reuse * 1000:.0f} ms ({full / reuse:.1f}x sooner), "
        f"median reuse share {share:.0%}; {what}."
    )
