"""What the demos share: the framework demos' options and the table every demo prints (per
question, TTFT of a full prefill and with reuse)."""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass

from kvboost_rag.eval.data import QAExample, load_qa


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
    full_total_s: float  # the whole answer, as the user waits for it
    reuse_total_s: float


HEADER = (
    f"{'question':40} {'full TTFT':>9} {'reuse TTFT':>10} {'sooner':>6} {'full answer':>11} {'reuse answer':>12} "
    f"{'reused':>6}  answer (reuse)"
)


def format_row(row: Row) -> str:
    return (
        f"{row.question[:40]:40} {row.full_ttft_s * 1000:7.0f}ms {row.reuse_ttft_s * 1000:8.0f}ms "
        f"{row.full_ttft_s / row.reuse_ttft_s:5.1f}x "
        f"{row.full_total_s * 1000:9.0f}ms {row.reuse_total_s * 1000:10.0f}ms "
        f"{row.reuse_share:6.0%}  {row.answer.strip()[:32]}"
    )


def format_summary(rows: list[Row], what: str) -> str:
    def median(field: str) -> float:
        return statistics.median(getattr(r, field) for r in rows)

    full, reuse = median("full_ttft_s"), median("reuse_ttft_s")
    full_total, reuse_total = median("full_total_s"), median("reuse_total_s")
    return (
        f"\nmedian TTFT: full {full * 1000:.0f} ms, reuse {reuse * 1000:.0f} ms ({full / reuse:.1f}x sooner); "
        f"median whole answer: full {full_total * 1000:.0f} ms, reuse {reuse_total * 1000:.0f} ms "
        f"({reuse_total / full_total:.2f}x full's); median reuse share {median('reuse_share'):.0%}; {what}."
    )
