"""The pieces every table is made of: a column (title, value of a row, format), a cell that is
blank where an older result lacks the value, and the table itself."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Format = str | Callable[[Any], str]
Column = tuple[str, Callable[[dict[str, Any]], Any], Format]  # title, value of a row, format


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def cell(row: dict[str, Any], value: Callable[[dict[str, Any]], Any], spec: Format) -> str:
    try:
        x = value(row)
    except (KeyError, TypeError):  # an older result without this value
        return ""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return spec(x) if callable(spec) else spec.format(x)


def columns_table(columns: list[Column], rows: list[dict[str, Any]]) -> str:
    """The columns some row has a value for (older results lack the newer ones)."""
    cells = [[cell(row, value, spec) for _, value, spec in columns] for row in rows]
    kept = [i for i in range(len(columns)) if any(row[i] for row in cells)]
    return table([columns[i][0] for i in kept], [[row[i] for i in kept] for row in cells])


def ms(summary: dict[str, float]) -> str:
    """A {median, mean} of seconds as "median ms (mean)"."""
    return f"{summary['median'] * 1000:,.0f} ms ({summary['mean'] * 1000:,.0f})"


def settings_line(settings: dict[str, Any]) -> str:
    skip = ("out", "rows", "repair", "exactness")
    return "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k not in skip and v is not None)


def get(*keys: str) -> Callable[[dict[str, Any]], Any]:
    """The value at a path of keys."""

    def value(row: dict[str, Any]) -> Any:
        for key in keys:
            row = row[key]
        return row

    return value


def em_diff_with_interval(stats: dict[str, Any]) -> str:
    text = f"{stats['em_diff_vs_full']:+.1%}"
    if stats["variant"] != "full" and "em_diff_ci95_low" in stats and not math.isnan(stats["em_diff_ci95_low"]):
        text += f" [{stats['em_diff_ci95_low']:+.1%}, {stats['em_diff_ci95_high']:+.1%}]"
    return text
