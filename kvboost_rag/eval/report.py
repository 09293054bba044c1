"""Writing an eval's results: terminal table, JSON, Markdown and a TTFT-vs-EM plot."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .runner import CLEAR_MARGIN, EvalReport

COLUMNS = [
    ("questions", "n", "{:.0f}"),
    ("em", "EM", "{:.1%}"),
    ("em_diff_vs_full", "EM diff", "{:+.1%}"),
    ("f1", "F1", "{:.1%}"),
    ("first_token_agreement", "1st tok agree", "{:.1%}"),
    ("answer_agreement", "answer agree", "{:.1%}"),
    ("first_token_agreement_clear", "1st tok agree, clear", "{:.1%}"),
    ("first_token_kl_mean", "1st tok KL", "{:.3f}"),
    ("ttft_median_s", "TTFT med", "{:.3f}s"),
    ("ttft_mean_s", "TTFT mean", "{:.3f}s"),
    ("ttft_ratio_vs_full", "x full", "{:.2f}"),
    ("total_ratio_vs_full", "answer time x full", "{:.2f}"),
    ("verified_first_token_share", "1st tok verified", "{:.0%}"),
    ("recomputed_answer_share", "answer recomputed", "{:.0%}"),
    ("reuse_share", "reused", "{:.0%}"),
    ("repair_share", "repaired", "{:.0%}"),
]


def rows(report: EvalReport) -> list[list[str]]:
    summary = report.summary()
    table = []
    for name, stats in summary.items():
        row = [name] + [fmt.format(stats[key]) for key, _, fmt in COLUMNS]
        if name != "full":
            row[3] += f" [{stats['em_diff_ci95_low']:+.1%}, {stats['em_diff_ci95_high']:+.1%}]"
        table.append(row)
    return table


def format_table(report: EvalReport) -> str:
    header = ["variant"] + [title for _, title, _ in COLUMNS]
    body = rows(report)
    widths = [max(len(r[c]) for r in [header, *body]) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in [header, *body]]
    return "\n".join(lines)


def markdown(report: EvalReport) -> str:
    header = ["variant"] + [title for _, title, _ in COLUMNS]
    lines = [
        "# kvboost-rag eval",
        "",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in report.settings.items()),
        "",
        "EM diff is paired against full prefill on the same questions, with its 95% interval.",
        f"'clear': questions whose full-prefill first token leads the runner-up by >= {CLEAR_MARGIN:g} in"
        " probability; the others are near-ties that any small change can flip.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    return "\n".join(lines) + "\n"


def plot(report: EvalReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report.summary()
    figure, axis = plt.subplots(figsize=(7, 4.5))
    sweep = sorted(
        (float(name.split("@")[1]), stats) for name, stats in summary.items() if name.startswith("cacheblend@")
    )
    if sweep:
        axis.plot([s["ttft_median_s"] for _, s in sweep], [s["em"] for _, s in sweep], "--", color="grey", zorder=1)
        for rho, stats in sweep:
            axis.annotate(f"rho={rho:g}", (stats["ttft_median_s"], stats["em"]), fontsize=7, color="grey")
    for name, stats in summary.items():
        if not name.startswith("cacheblend@"):
            axis.scatter(stats["ttft_median_s"], stats["em"], s=40, zorder=2)
            axis.annotate(name, (stats["ttft_median_s"], stats["em"]), xytext=(4, 4), textcoords="offset points")
    axis.set_xlabel("median TTFT (s)")
    axis.set_ylabel("EM (best subspan)")
    title = f"TTFT vs EM, {report.settings.get('data', '')} k={report.settings.get('k', '')}"
    if sweep:
        title += f"\n(dashed: CacheBlend rho sweep on the first {int(sweep[0][1]['questions'])} questions)"
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write(report: EvalReport, out_dir: Path, stem: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "markdown": out_dir / f"{stem}.md", "plot": out_dir / f"{stem}.png"}
    data = {
        "settings": report.settings,
        "summary": report.summary(),
        "records": {name: [asdict(r) for r in records] for name, records in report.records.items()},
    }
    paths["json"].write_text(json.dumps(data, indent=1, ensure_ascii=False))
    paths["markdown"].write_text(markdown(report))
    plot(report, paths["plot"])
    return paths
