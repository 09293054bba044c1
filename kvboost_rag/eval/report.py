"""Writing an eval's results: terminal table, JSON, Markdown and a plot of the frontier
(EM and agreement against whole-answer time)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

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
    ("recomputed_share", "recomputed", "{:.0%}"),
    ("verified_first_token_share", "1st tok verified", "{:.0%}"),
    ("recomputed_answer_share", "answer recomputed", "{:.0%}"),
    ("reuse_share", "reused", "{:.0%}"),
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
    """The frontier: EM, and agreement with full prefill, against whole-answer time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = report.summary()
    figure, (em_axis, agree_axis) = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (
        (em_axis, "em", "EM (best subspan)"),
        (agree_axis, "first_token_agreement", "agreement with full prefill"),
    )
    sweep = sorted(
        (float(name.split("@")[1]), stats) for name, stats in summary.items() if name.startswith("cacheblend@")
    )
    for axis, key, label in panels:
        if sweep:
            xs, ys = [s["total_ratio_vs_full"] for _, s in sweep], [s[key] for _, s in sweep]
            axis.plot(xs, ys, "--", color="grey", zorder=1)
            for (rho, stats), x, y in zip(sweep, xs, ys):
                axis.annotate(f"rho={rho:g}", (x, y), fontsize=7, color="grey")
        for name, stats in summary.items():
            if name.startswith("cacheblend@"):
                continue
            x = stats["total_ratio_vs_full"]
            axis.scatter(x, stats[key], s=40, zorder=2)
            axis.annotate(name, (x, stats[key]), xytext=(4, 4), textcoords="offset points", fontsize=8)
            if key == "first_token_agreement" and name != "full":
                axis.scatter(x, stats["answer_agreement"], s=25, marker="x", color="black", zorder=2)
        axis.axvline(1.0, color="grey", linewidth=0.5)
        axis.set_xlabel("median whole-answer time / full prefill's")
        axis.set_ylabel(label + (" (dot: first token, x: whole answer)" if key != "em" else ""))
        axis.grid(alpha=0.3)
    n = int(summary.get("full", {}).get("questions", 0))
    title = f"{report.settings.get('data', '')} k={report.settings.get('k', '')}, {n} questions"
    if sweep:
        title += f" (dashed: CacheBlend rho sweep on the first {int(sweep[0][1]['questions'])})"
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


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
