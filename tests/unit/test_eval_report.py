"""The eval's report from made-up records, no model: the short table, the Markdown's layout and
what the frontier plot shows (a labelled point a variant, EM's intervals, a line a swept choice in
rho order)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.container import ErrorbarContainer

from kvboost_rag.eval.plot import frontier_figure, plot
from kvboost_rag.eval.report import (
    COLUMNS,
    ENOUGH_QUESTIONS,
    SHORT_COLUMNS,
    format_table,
    markdown,
    readable_settings,
    small_sample_note,
)
from kvboost_rag.eval.runner import EvalReport, Record

NAMED = ("full", "default", "plain", "none")
# Given out of rho order (and each with its own time): the plot must join them by rho, a line a choice.
SWEEP = {"cacheblend@0.5": 1.5, "cacheblend@1": 2.0, "cacheblend@0.05": 0.6, "cacheblend@0.3": 1.2}
QUERY_SWEEP = {"query@0.3": 0.9, "query@0.05": 0.4}


def _record(question: int, em: float, total_s: float, agrees: bool = True) -> Record:
    return Record(
        question, em, em, 100, total_s / 2, None, total_s, 1, 0.0, 0.5, 0.1, 0.1, agrees, agrees, 0.0, 1.0, "a"
    )


def _report() -> EvalReport:
    """Five questions: full right on 3; each variant's time a multiple of full's 1 s."""
    full_em = [1.0, 1.0, 1.0, 0.0, 0.0]
    report = EvalReport({"data": "qa.jsonl", "k": 5}, {"full": [_record(i, e, 1.0) for i, e in enumerate(full_em)]})
    for n, name in enumerate(NAMED[1:]):
        ems = [0.0 if i == n else e for i, e in enumerate(full_em)]
        report.records[name] = [_record(i, e, 0.5 + 0.1 * n, agrees=i != n) for i, e in enumerate(ems)]
    for name, time in {**SWEEP, **QUERY_SWEEP}.items():
        report.records[name] = [_record(i, full_em[i], time) for i in range(3)]
    return report


def test_the_terminal_table_is_short_unless_asked_for_every_column() -> None:
    report = _report()
    short_text, wide_text = format_table(report), format_table(report, full=True)
    rows = 1 + len(NAMED) + len(SWEEP) + len(QUERY_SWEEP)
    short, wide = short_text.splitlines()[:rows], wide_text.splitlines()[:rows]
    assert short[0].split()[0] == "variant" and "1st tok agree" in short[0] and "answer x full" in short[0]
    assert "decode tok/s" not in short[0] and "decode tok/s" in wide[0]
    assert all(line.split()[0] in report.records for line in short[1:] + wide[1:])
    assert "[" in short[2], "the EM diff carries its paired 95% interval"
    assert len(SHORT_COLUMNS) == 9 and len(COLUMNS) == 22
    legend = " ".join(short_text.splitlines()[rows:])
    assert "EM diff: paired against full prefill" in legend and "Retention:" in legend, "the columns explained"


def test_a_run_too_small_for_its_intervals_says_so_and_a_large_one_does_not() -> None:
    small = format_table(_report())
    assert "n=5: one question moves EM by 20 points" in " ".join(small.split())
    many = EvalReport(
        {}, {name: [_record(i, 1.0, 1.0) for i in range(ENOUGH_QUESTIONS)] for name in ("full", "default")}
    )
    assert small_sample_note(many) is None and "one question moves" not in format_table(many)
    assert "n/a" in format_table(EvalReport({}, {"full": [_record(0, 0.0, 1.0)]})), "retention of none right"


def test_the_settings_are_a_list_a_user_reads() -> None:
    settings = {"k": 5, "dtype": "torch.bfloat16", "repair": "RepairConfig(strategy='query', rho=0.08)"}
    assert readable_settings(settings) == ["- k: 5", "- dtype: bfloat16", "- repair: strategy query, rho 0.08"]
    assert "## Settings" in markdown(_report()).splitlines()


def test_markdown_puts_the_short_table_first_and_every_column_under_its_own_heading() -> None:
    text = markdown(_report())
    lines = text.splitlines()
    summary, every = lines.index("## Summary"), lines.index("## All columns")
    assert 0 < summary < every
    tables = [
        [line for line in lines[start:end] if line.startswith("| variant")]
        for start, end in ((summary, every), (every, len(lines)))
    ]
    assert [len(t) for t in tables] == [1, 1]
    assert tables[0][0].count("|") - 1 == 1 + len(SHORT_COLUMNS)
    assert tables[1][0].count("|") - 1 == 1 + len(COLUMNS)
    assert "| default | 5 | 40.0% | -20.0% [" in text


def test_the_plot_names_each_variant_once_with_em_intervals_and_a_line_a_choice_in_rho_order(tmp_path: Path) -> None:
    figure = frontier_figure(_report())
    em_axis, answer_axis, retention_axis = figure.axes
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend[: len(NAMED)] == list(NAMED) and len(legend) == len(NAMED) + 2
    assert legend[-2].startswith("cacheblend sweep") and legend[-1].startswith("query sweep")
    bars = [c for c in em_axis.containers if isinstance(c, ErrorbarContainer)]
    assert [c.has_yerr for c in bars] == [False, True, True, True], "every variant but full has its interval"
    for axis in (em_axis, answer_axis, retention_axis):
        assert "first-token time" in axis.get_xlabel()
        cacheblend, query = [line for line in axis.get_lines() if line.get_linestyle() == "--"]
        # x is TTFT over full prefill's (each made-up TTFT half its time, full prefill's 0.5 s)
        assert list(cacheblend.get_xdata()) == sorted(SWEEP.values()), "in rho order"
        assert list(query.get_xdata()) == sorted(QUERY_SWEEP.values())
        rhos = [t.get_text() for t in axis.texts if t.get_text().startswith("rho=")]
        assert rhos == ["rho=0.05", "rho=0.3", "rho=0.5", "rho=1", "rho=0.05", "rho=0.3"]
        ringed = [line for line in axis.get_lines() if line.get_markerfacecolor() == "none"]
        assert [list(line.get_xdata()) for line in ringed] == [[SWEEP["cacheblend@1"]]], "rho 1 ringed"
        assert axis.yaxis.get_major_formatter()(0.5, 0).startswith("50")
        assert axis.get_ylim() == (-0.02, 1.02), "every panel on one 0-100% axis"
    path = tmp_path / "frontier.png"
    plot(_report(), path)
    assert path.read_bytes()[:4] == b"\x89PNG"
