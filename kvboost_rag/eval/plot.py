"""The eval's frontier plot, read at a glance: what each variant keeps of full prefill's answers
against how soon its first token comes. Three panels against median TTFT over full prefill's:
EM (with the 95% interval of its paired difference from full prefill, which at a few questions
spans tens of points), whole answers equal to full prefill's, and retention (full prefill's right
answers kept). One point a named variant (named in the legend, names never overlap there); each
swept choice (`<choice>@<rho>`: CacheBlend's deviation, the question's attention) a line in rho
order, its rho 1 point (every moved token recomputed: full prefill's KV up to rounding) ringed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .runner import EvalReport

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MARKERS = "osD^vP*Xph<>8H"
PANELS = (
    ("em", "EM (bars: 95% interval of the difference from full)", "EM (best subspan)"),
    ("answer_agreement", "whole answer the same as full prefill's", "whole-answer agreement"),
    ("retention", "full prefill's right answers kept", "retention"),
)
Stats = dict[str, float]


def sweep_lines(summary: dict[str, Stats]) -> dict[str, list[tuple[float, Stats]]]:
    """Each swept choice's variants by rho, ascending (their names sort as text, not as numbers)."""
    lines: dict[str, list[tuple[float, Stats]]] = {}
    for name, stats in summary.items():
        choice, at, rho = name.partition("@")
        if at:
            lines.setdefault(choice, []).append((float(rho), stats))
    return {choice: sorted(points, key=lambda point: point[0]) for choice, points in lines.items()}


def _em_error(name: str, stats: Stats) -> list[list[float]] | None:
    """EM's error bar: the paired difference's 95% interval placed around the variant's EM, so a
    bar that crosses full prefill's line is no measured difference; none for full (the reference)
    or where the interval is undefined (fewer than two questions)."""
    low, high, diff = stats["em_diff_ci95_low"], stats["em_diff_ci95_high"], stats["em_diff_vs_full"]
    if name == "full" or any(math.isnan(v) for v in (low, high, diff)):
        return None
    return [[diff - low], [high - diff]]


def _axes(axis: Axes, title: str, label: str, full_s: float) -> None:
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    axis.set_title(title, fontsize=10)
    axis.set_ylabel(label)
    axis.axvline(1.0, color="grey", linewidth=0.5)
    axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}x"))
    axis.set_xlabel(f"median first-token time, x full prefill's ({full_s:.2f} s)")
    axis.grid(alpha=0.3)


def _sweep(axis: Axes, choice: str, points: list[tuple[float, Stats]], key: str, color: str) -> Artist:
    """One choice's sweep as a dashed line through its points in rho order, each point's rho beside
    it; rho 1 ringed."""
    xs, ys = [s["ttft_ratio_vs_full"] for _, s in points], [s[key] for _, s in points]
    questions = int(points[0][1]["questions"])
    (line,) = axis.plot(xs, ys, "--", color=color, marker=".", zorder=1, label=f"{choice} sweep ({questions} q)")
    for (rho, _), x, y in zip(points, xs, ys):
        axis.annotate(f"rho={rho:g}", (x, y), xytext=(5, -10), textcoords="offset points", fontsize=7, color=color)
        if rho >= 1.0:
            axis.plot([x], [y], "o", markersize=11, markerfacecolor="none", markeredgecolor=color, zorder=1)
    return line


def _limits(axis: Axes) -> None:
    """Every panel on one 0-100% axis, what a share can be (EM's intervals may reach past it: clipped)."""
    axis.set_ylim(-0.02, 1.02)


def frontier_figure(report: EvalReport) -> Figure:
    """The figure, not saved: a test reads its points, error bars and legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    summary = report.summary()
    figure = Figure(figsize=(16, 5.5))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(PANELS))
    full = summary.get("full", {})
    full_s = full.get("ttft_median_s", math.nan)
    for axis, (key, title, label) in zip(axes, PANELS):
        _axes(axis, title, label, full_s)
    if "em" in full:
        axes[0].axhline(full["em"], color="C0", linestyle=":", linewidth=1)
    handles: list[Artist] = []
    named = [(name, stats) for name, stats in summary.items() if "@" not in name]
    for i, (name, stats) in enumerate(named):
        style = dict(color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)], linestyle="none", markersize=7)
        x = stats["ttft_ratio_vs_full"]
        handles.append(axes[0].errorbar(x, stats["em"], yerr=_em_error(name, stats), capsize=3, label=name, **style))
        for axis, (key, _, _) in zip(axes[1:], PANELS[1:]):
            axis.plot(x, stats[key], zorder=2, **style)
    for j, (choice, points) in enumerate(sweep_lines(summary).items()):
        color = ("dimgrey", "darkred", "darkgreen", "navy")[j % 4]
        for axis, (key, _, _) in zip(axes, PANELS):
            line = _sweep(axis, choice, points, key, color)
        handles.append(line)
    for axis in axes:
        _limits(axis)
    columns = min(len(handles), 6)
    figure.legend(handles=handles, loc="lower center", ncol=columns, frameon=False, fontsize=9)
    settings = report.settings
    figure.suptitle(f"{settings.get('data', '')} k={settings.get('k', '')}, {int(full.get('questions', 0))} questions")
    figure.tight_layout(rect=(0, 0.02 + 0.05 * math.ceil(len(handles) / columns), 1, 1))
    return figure


def plot(report: EvalReport, path: Path) -> None:
    """The frontier as a PNG at `path`."""
    frontier_figure(report).savefig(path, dpi=120)
