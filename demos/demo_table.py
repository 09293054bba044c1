"""The table every demo prints: per question, TTFT of a full prefill and with reuse."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


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
