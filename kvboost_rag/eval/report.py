"""Writing an eval's results: the terminal table, JSON and Markdown (short table first, every
column below it) and the frontier plot (`eval/plot.py`)."""

from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .plot import plot
from .run import run_info
from .runner import CLEAR_MARGIN, EvalReport

COLUMNS = [
    ("questions", "n", "{:.0f}"),
    ("em", "EM", "{:.1%}"),
    ("em_diff_vs_full", "EM diff", "{:+.1%}"),
    ("f1", "F1", "{:.1%}"),
    ("f1_diff_vs_full", "F1 diff", "{:+.1%}"),
    ("first_token_agreement", "1st tok agree", "{:.1%}"),
    ("answer_agreement", "answer agree", "{:.1%}"),
    ("retention", "retention", "{:.1%}"),
    ("first_token_agreement_clear", "1st tok agree, clear", "{:.1%}"),
    ("first_token_kl_mean", "1st tok KL", "{:.3f}"),
    ("ttft_median_s", "TTFT med", "{:.3f}s"),
    ("ttft_mean_s", "TTFT mean", "{:.3f}s"),
    ("ttft_ratio_vs_full", "TTFT x full", "{:.2f}"),
    ("second_token_ratio_vs_full", "2nd tok x full", "{:.2f}"),
    ("total_median_s", "answer med", "{:.3f}s"),
    ("total_ratio_vs_full", "answer x full", "{:.2f}"),
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
    ("drafted_share", "from drafts", "{:.0%}"),
    ("recomputed_share", "recomputed", "{:.0%}"),
    ("verified_first_token_share", "1st tok verified", "{:.0%}"),
    ("recomputed_answer_share", "answer recomputed", "{:.0%}"),
    ("reuse_share", "reused", "{:.0%}"),
]


# The columns a user decides on (a subset of COLUMNS, in its order): the terminal's table and
# the Markdown's first; every column stays in the Markdown below it and in the JSON.
SHORT = (
    "questions",
    "em",
    "em_diff_vs_full",
    "first_token_agreement",
    "answer_agreement",
    "retention",
    "ttft_ratio_vs_full",
    "total_ratio_vs_full",
    "recomputed_share",
)
SHORT_COLUMNS = [column for column in COLUMNS if column[0] in SHORT]


def rows(report: EvalReport, columns: list[tuple[str, str, str]] = COLUMNS) -> list[list[str]]:
    """One row a variant, the EM diff with its paired 95% interval."""
    summary = report.summary()
    table = []
    for name, stats in summary.items():
        row = [name]
        for key, _, fmt in columns:
            value = stats[key]
            if isinstance(value, float) and math.isnan(value):  # e.g. retention where full got none right
                row.append("n/a")
                continue
            cell = fmt.format(value)
            if key == "em_diff_vs_full" and name != "full":
                cell += f" [{stats['em_diff_ci95_low']:+.1%}, {stats['em_diff_ci95_high']:+.1%}]"
            row.append(cell)
        table.append(row)
    return table


def _header(columns: list[tuple[str, str, str]]) -> list[str]:
    return ["variant"] + [title + (" [95%]" if key == "em_diff_vs_full" else "") for key, title, _ in columns]


# What the short table's columns mean: under the terminal's table and the Markdown's.
LEGEND = (
    "EM diff: paired against full prefill on the same questions, with its 95% interval. 1st tok /"
    " answer agree: the same first token / whole answer as full prefill's. Retention: full prefill's"
    " right answers kept. x full: median time over full prefill's (TTFT: the first token; answer:"
    " the whole answer). Recomputed: tokens computed again though a cache held them, per prompt token."
)
# From this many questions a paired EM interval is a few points wide (one question: 100/n points).
ENOUGH_QUESTIONS = 100


def small_sample_note(report: EvalReport) -> str | None:
    """Where n is too small for the intervals to say anything, say so (None where it is not)."""
    questions = int(report.summary().get("full", {}).get("questions", 0))
    if questions >= ENOUGH_QUESTIONS:
        return None
    return (
        f"n={questions}: one question moves EM by {100 / max(questions, 1):.0f} points, so the intervals"
        f" are too wide to tell variants apart (undefined below 2); a first look only. --limit 500 narrows"
        f" EM's interval to a few points."
    )


def format_table(report: EvalReport, full: bool = False) -> str:
    """The terminal's table (the short columns unless `full`), its legend, and a note where n is
    too small for the intervals."""
    columns = COLUMNS if full else SHORT_COLUMNS
    header, body = _header(columns), rows(report, columns)
    widths = [max(len(r[c]) for r in [header, *body]) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in [header, *body]]
    note = small_sample_note(report)
    wrapped = [textwrap.fill(text, 100) for text in [LEGEND, *([note] if note else [])]]
    return "\n".join([*lines, "", *wrapped])


def readable_settings(settings: dict[str, Any]) -> list[str]:
    """One Markdown bullet a setting; a dataclass's repr (`RepairConfig(strategy='query', ...)`) as
    its fields, a torch dtype by its name."""
    lines = []
    for name, value in settings.items():
        text = str(value)
        fields = re.fullmatch(r"[A-Z]\w*\((.*)\)", text)
        if fields:
            text = fields.group(1).replace("=", " ").replace("'", "")
        lines.append(f"- {name.replace('_', ' ')}: {text.removeprefix('torch.')}")
    return lines


def _markdown_table(report: EvalReport, columns: list[tuple[str, str, str]]) -> list[str]:
    header = _header(columns)
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows(report, columns)
    ]


def markdown(report: EvalReport) -> str:
    """What a user decides on first (the short table), every column under its own heading below."""
    note = small_sample_note(report)
    lines = [
        "# kvboost-rag eval",
        "",
        "## Summary",
        "",
        *_markdown_table(report, SHORT_COLUMNS),
        "",
        LEGEND + " One question moves EM by 100/n points.",
        *(["", note] if note else []),
        "",
        "## Settings",
        "",
        *readable_settings(report.settings),
        "",
        "## All columns",
        "",
        f"'clear': questions whose full-prefill first token leads the runner-up by >= {CLEAR_MARGIN:g} in"
        " probability; the others are near-ties that any small change can flip.",
        "",
        *_markdown_table(report, COLUMNS),
    ]
    return "\n".join(lines) + "\n"


def write(report: EvalReport, out_dir: Path, stem: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md", "plot": out_dir / f"{stem}.png"}
    data = {
        "run": run_info(),
        "settings": report.settings,
        "summary": report.summary(),
        "records": {name: [asdict(r) for r in records] for name, records in report.records.items()},
    }
    paths["json"].write_text(json.dumps(data, indent=1, ensure_ascii=False))
    paths["markdown"].write_text(markdown(report))
    plot(report, paths["plot"])
    return paths
