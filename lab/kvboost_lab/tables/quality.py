"""Tables of the prefill and quality benchmarks: TTFT, attention, dtypes, evals, selection,
verification, where the error sits, multi-turn chat."""

from __future__ import annotations

from typing import Any

from kvboost_rag.eval.report import COLUMNS

from .format import Column, columns_table, em_diff_with_interval, get, ms, settings_line, table

TTFT: list[Column] = [
    ("k", get("k"), "{}"),
    ("prompt tokens", get("prompt_tokens", "median"), "{:,.0f}"),
    ("variant", get("variant"), "{}"),
    ("TTFT median (mean)", get("ttft_s"), ms),
    ("TTFT speedup", get("speedup_median"), "{:.2f}x"),
    ("2nd token", get("second_token_s"), ms),
    ("answer median (mean)", get("total_s"), ms),
    ("answer x full", get("total_ratio_vs_full"), "{:.2f}x"),
    ("reused", get("reuse_share", "mean"), "{:.0%}"),
    ("repaired", get("repair_share", "mean"), "{:.0%}"),
    ("floor", get("floor_s"), ms),
    ("1st token = full's", get("first_token_agreement_vs_full"), "{:.0%}"),
    ("answer = full's", get("answer_agreement_vs_full"), "{:.0%}"),
    ("1st token verified", get("verified_first_token_share"), "{:.0%}"),
]
ATTENTION: list[Column] = [
    ("attention", get("attention"), "{}"),
    ("repair", get("repair"), "{}"),
    ("median prefill", lambda r: r["median_s"] * 1000, "{:,.0f} ms"),
    ("1st token = full's", get("first_token_agreement"), "{:.1%}"),
    ("1st-token KL", get("first_token_kl_mean"), "{:.4f}"),
]
SELECTION: list[Column] = [
    ("selection", get("name"), "{}"),
    ("1st-token KL", get("first_token_kl_mean"), "{:.4f}"),
    ("1st token = full's", get("first_token_agreement"), "{:.1%}"),
]
VERIFY: list[Column] = [
    ("margin", lambda t: f"{t['margin']:g}" + (" + refresh" if t["refresh"] else ""), "{}"),
    ("1st token = full's", get("first_token_agreement"), "{:.1%}"),
    ("answer = full's", get("answer_agreement"), "{:.1%}"),
    ("EM diff (points)", lambda t: t["em_diff_vs_full"] * 100, "{:+.1f}"),
    ("1st token verified", get("verified_first_token_share"), "{:.0%}"),
    ("answer recomputed", get("recomputed_answer_share"), "{:.0%}"),
    ("unknown", get("unknown_continuations"), "{}"),
    ("TTFT x full median (mean)", lambda t: f"{t['ttft_median_ratio']:.2f}x ({t['ttft_mean_ratio']:.2f})", "{}"),
    ("answer time x full", get("answer_time_median_ratio"), "{:.2f}x"),
]


def ttft(data: dict[str, Any]) -> str:
    rows = [
        {"k": k, "prompt_tokens": entry["prompt_tokens"], "variant": name, **e}
        for k, entry in data["k"].items()
        for name, e in entry.items()
        if name != "prompt_tokens"
    ]
    tokens = data.get("max_new_tokens", 1)
    notes = f"{data['questions']} questions, {data['dtype']}, " + (
        "first token only" if tokens == 1 else f"answers of up to {tokens} tokens"
    )
    return notes + "\n\n" + columns_table(TTFT, rows)


def attention(data: dict[str, Any]) -> str:
    return settings_line(data["settings"]) + "\n\n" + columns_table(ATTENTION, data["rows"])


def dtype(data: dict[str, Any]) -> str:
    prefills = {key for d in data["dtypes"].values() for key in d if key.startswith("prefill_")}
    prefills = sorted(prefills, key=lambda key: -int(key.split("_")[1]))
    columns: list[Column] = [("dtype", get("dtype"), "{}")]
    columns += [(f"prefill {key.split('_')[1]} tokens", get(key), "{:.2f} s") for key in prefills]
    columns += [
        ("median TTFT", get("median_ttft_s"), "{:.2f} s"),
        ("decode", get("decode_tokens_per_s"), "{:.0f} tok/s"),
        ("NQ EM", get("em"), "{:.1%}"),
    ]
    agreement = data["agreement"]
    notes = (
        f"{data['questions']} questions, {data['docs_per_prompt']} passages each; the second dtype against the first:"
        f" first token the same on {agreement['first_token']:.1%}, whole answer on {agreement['whole_answer']:.1%}"
    )
    return notes + "\n\n" + columns_table(columns, [{"dtype": name, **d} for name, d in data["dtypes"].items()])


def eval_summary(data: dict[str, Any]) -> str:
    """An eval's summary (`kvboost-rag eval`, explore_repair), with the columns this result has."""
    summary = data["summary"]
    columns: list[Column] = [("variant", get("variant"), "{}")]
    for key, title, spec in COLUMNS:
        if any(key in stats for stats in summary.values()):
            value = em_diff_with_interval if key == "em_diff_vs_full" else get(key)
            columns.append((title, value, "{}" if key == "em_diff_vs_full" else spec))
    rows = [{"variant": name, **stats} for name, stats in summary.items()]
    return settings_line(data["settings"]) + "\n\n" + columns_table(columns, rows)


def selection(data: dict[str, Any]) -> str:
    rows = [{"name": name, **s} for name, s in data["summary"].items()]
    return settings_line(data["settings"]) + "\n\n" + columns_table(SELECTION, rows)


def verify(data: dict[str, Any]) -> str:
    return settings_line(data["settings"]) + "\n\n" + columns_table(VERIFY, data["table"])


def where(data: dict[str, Any]) -> str:
    parts = [f"{data['questions']} questions, k={data['k']}: relative deviation of reused K/V from full prefill's"]
    for key, title in (("by_offset", "offset in its run"), ("by_document_rank", "document (1: next to the question)")):
        labels = list(data[key]["key"])
        rows = [[kind] + [f"{data[key][kind][label]:.3f}" for label in labels] for kind in ("key", "value")]
        parts.append(table([title] + labels, rows))
    layers = [[kind, " ".join(f"{x:.2f}" for x in data["by_layer"][kind])] for kind in ("key", "value")]
    parts.append(table(["by layer", "layers 0, 1, ..."], layers))
    return "\n\n".join(parts)


def multiturn(data: dict[str, Any]) -> str:
    """Per turn of each conversation shape: TTFT of full, prefix and the default, reuse shares,
    the default's agreement with full prefill."""
    summary, parts = data["summary"], []
    for shape, title in (("plain", "plain chat"), ("rag", "conversational RAG (passages at the head)")):
        full, prefix, default = (summary[f"{shape}/{v}"] for v in ("full", "prefix", "default"))
        rows = [
            {"turn": f["turn"], "tokens": f["prompt_tokens"], "full": f, "prefix": p, "default": d}
            for f, p, d in zip(full, prefix, default)
        ]
        columns: list[Column] = [
            ("turn", get("turn"), "{}"),
            ("prompt tokens", get("tokens"), "{:,.0f}"),
            ("TTFT full", lambda r: r["full"]["ttft_s"] * 1000, "{:,.0f} ms"),
            ("TTFT prefix", lambda r: r["prefix"]["ttft_s"] * 1000, "{:,.0f} ms"),
            ("TTFT default", lambda r: r["default"]["ttft_s"] * 1000, "{:,.0f} ms"),
            ("answer default x full", lambda r: r["default"]["total_s"] / r["full"]["total_s"], "{:.2f}"),
            ("reused prefix", lambda r: r["prefix"]["reuse_share"], "{:.0%}"),
            ("reused default", lambda r: r["default"]["reuse_share"], "{:.0%}"),
            ("history reused default", lambda r: r["default"]["history_reuse_share"], "{:.0%}"),
            ("1st token = full's", lambda r: r["default"]["first_token_agreement"], "{:.0%}"),
            ("answer = full's", lambda r: r["default"]["answer_agreement"], "{:.0%}"),
        ]
        parts.append(f"{title}:\n\n" + columns_table(columns, rows))
    return "\n\n".join(parts)
