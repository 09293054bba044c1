"""The eval's frontier plot, read at a glance: what each variant costs in quality against what it
saves in time. Two panels, EM (with the 95% interval of its paired difference from full prefill,
which at a few questions spans tens of points) and first-token agreement with full prefill, each
against median whole-answer time over full prefill's; one point a variant, named in the legend
(names never overlap there); the CacheBlend rho sweep, if any, a line in rho order."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .runner import EvalReport

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SWEEP = "cacheblend@"  # the rho sweep's variant names: cacheblend@<rho>
MARKERS = "osD^vP*Xph<>8H"
Stats = dict[str, float]


def sweep_points(summary: dict[str, Stats]) -> list[tuple[float, Stats]]:
    """The rho sweep's variants by rho, ascending (their names sort as text, not as numbers)."""
    return sorted((float(name[len(SWEEP) :]), stats) for name, stats in summary.items() if name.startswith(SWEEP))


def _em_error(name: str, stats: Stats) -> list[list[float]] | None:
    """EM's error bar: the paired difference's 95% interval placed around the variant's EM, so a
    bar that crosses full prefill's line is no measured difference; none for full (the reference)
    or where the interval is undefined (fewer than two questions)."""
    low, high, diff = stats["em_diff_ci95_low"], stats["em_diff_ci95_high"], stats["em_diff_vs_full"]
    if name == "full" or any(math.isnan(v) for v in (low, high, diff)):
        return None
    return [[diff - low], [high - diff]]


def _axes(axis: Axes, title: str, full_s: float) -> None:
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    axis.set_title(title, fontsize=10)
    axis.axvline(1.0, color="grey", linewidth=0.5)
    axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}x"))
    axis.set_xlabel(f"median whole-answer time, x full prefill's ({full_s:.2f} s)")
    axis.grid(alpha=0.3)


def _sweep(axis: Axes, points: list[tuple[float, Stats]], key: str) -> Artist:
    """The sweep as one dashed line through its points in rho order, each point's rho beside it."""
    xs, ys = [s["total_ratio_vs_full"] for _, s in points], [s[key] for _, s in points]
    questions = int(points[0][1]["questions"])
    (line,) = axis.plot(xs, ys, "--", color="grey", marker=".", zorder=1, label=f"CacheBlend rho sweep ({questions} q)")
    for (rho, _), x, y in zip(points, xs, ys):
        axis.annotate(f"rho={rho:g}", (x, y), xytext=(5, -10), textcoords="offset points", fontsize=7, color="dimgrey")
    return line


def frontier_figure(report: EvalReport) -> Figure:
    """The figure, not saved: a test reads its points, error bars and legend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    summary = report.summary()
    figure = Figure(figsize=(11, 5))
    FigureCanvasAgg(figure)
    em_axis, agree_axis = figure.subplots(1, 2)
    full = summary.get("full", {})
    full_s = full.get("total_median_s", math.nan)
    _axes(em_axis, "EM (bars: 95% interval of the difference from full)", full_s)
    _axes(agree_axis, "first token the same as full prefill's", full_s)
    em_axis.set_ylabel("EM (best subspan)")
    agree_axis.set_ylabel("first-token agreement")
    if "em" in full:
        em_axis.axhline(full["em"], color="C0", linestyle=":", linewidth=1)
    handles: list[Artist] = []
    named = [(name, stats) for name, stats in summary.items() if not name.startswith(SWEEP)]
    for i, (name, stats) in enumerate(named):
        style = dict(color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)], linestyle="none", markersize=7)
        x = stats["total_ratio_vs_full"]
        handles.append(em_axis.errorbar(x, stats["em"], yerr=_em_error(name, stats), capsize=3, label=name, **style))
        agree_axis.plot(x, stats["first_token_agreement"], zorder=2, **style)
    points = sweep_points(summary)
    if points:
        handles.append(_sweep(em_axis, points, "em"))
        _sweep(agree_axis, points, "first_token_agreement")
    columns = min(len(handles), 6)
    figure.legend(handles=handles, loc="lower center", ncol=columns, frameon=False, fontsize=9)
    settings = report.settings
    figure.suptitle(f"{settings.get('data', '')} k={settings.get('k', '')}, {int(full.get('questions', 0))} questions")
    figure.tight_layout(rect=(0, 0.02 + 0.05 * math.ceil(len(handles) / columns), 1, 1))
    return figure


def plot(report: EvalReport, path: Path) -> None:
    """The frontier as a PNG at `path`."""
    frontier_figure(report).savefig(path, dpi=120)
