"""Markdown tables from the benchmarks' JSON results, so no README holds a number typed by hand.

One renderer per benchmark, chosen by the JSON file's name; `render_all` renders every result
found under a folder, `replace_section` puts that text between two markers of a README. A
value an older result lacks is left blank.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import RepairConfig
from .report import COLUMNS

BEGIN, END = "<!-- tables:begin -->", "<!-- tables:end -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline:begin -->", "<!-- headline:end -->"
# The eval results the top-level README's headline table reads: the engine's defaults at k=5, k=10
# on 500 questions, each beside the same with neighbour-aware warming (nb4), then the frontier runs
# (more variants, fewer questions) up to long documents.
HEADLINE_FILES = (
    "frontier/eval_k5_n500.json",
    "frontier/eval_k5_n500_nb4.json",
    "frontier/eval_k5_n500_nb4_rho005.json",
    "frontier/eval_k10_n500.json",
    "frontier/eval_k10_n500_nb4_rho005.json",
    "frontier/eval_k10_n100.json",
    "frontier/eval_k10_n100_nb4.json",
    "frontier/eval_k5_n30.json",
    "frontier/eval_k10_n20.json",
    "frontier/eval_k20_n24.json",
    "frontier/eval_k20_n24_nb4.json",
    "frontier/eval_k10_n5_docs4.json",
)
HEADLINE_VARIANTS = ("full", "cacheblend", "default", "exact")
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
STORE: list[Column] = [
    ("chunk format", get("format"), "{}"),
    ("bytes/token", get("bytes_per_token"), "{:,.0f}"),
    ("timed chunk tokens", get("timed_chunk_tokens"), "{:.0f}"),
    ("ready from memory", get("load_memory_ms_per_chunk"), "{:.3f} ms"),
    ("from disk", get("load_disk_ms_per_chunk"), "{:.1f} ms"),
    ("recompute", get("recompute_ms_per_chunk"), "{:,.0f} ms"),
    ("EM full", get("em_full"), "{:.1%}"),
    ("EM reuse", get("em_reuse"), "{:.1%}"),
    ("1st token = full's", get("first_token_agreement"), "{:.1%}"),
    ("1st-token KL", get("first_token_kl"), "{:.3f}"),
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


def store(data: dict[str, Any]) -> str:
    rows = [{"format": name, **f} for name, f in data["formats"].items()]
    return f"{data['questions']} questions, k={data['k']}, times per chunk\n\n" + columns_table(STORE, rows)


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


def em_diff_with_interval(stats: dict[str, Any]) -> str:
    text = f"{stats['em_diff_vs_full']:+.1%}"
    if stats["variant"] != "full" and "em_diff_ci95_low" in stats and not math.isnan(stats["em_diff_ci95_low"]):
        text += f" [{stats['em_diff_ci95_low']:+.1%}, {stats['em_diff_ci95_high']:+.1%}]"
    return text


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


def budget(data: dict[str, Any]) -> str:
    columns: list[Column] = [
        ("memory budget", get("budget"), "{}"),
        ("MiB", lambda r: r["budget_bytes"] / 2**20, "{:.1f}"),
        ("reuse share, 1st pass", get("first_pass_share_mean"), "{:.2f}"),
        ("2nd pass", get("second_pass_share_mean"), "{:.2f}"),
        ("2nd pass min", get("second_pass_share_min"), "{:.2f}"),
        ("evictions", get("evictions"), "{}"),
    ]
    notes = (
        f"{data['questions']} NQ prompts of k={data['k']} passages over a disk store; one prompt's chunks: "
        f"{data['one_prompt_bytes'] / 2**20:.1f} MiB ({data['dtype']})"
    )
    return notes + "\n\n" + columns_table(columns, data["rows"])


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


def redis_tier(data: dict[str, Any]) -> str:
    """The Redis tier: one chunk made ready from each place; a fresh worker answering from Redis
    against full prefill; warm throughput by worker count."""
    load = data["chunk_load"]
    places = table(
        ["one chunk made ready from", "median"],
        [
            [place, f"{load[f'{key}_ms']:,.2f} ms"]
            for place, key in (
                ("memory", "memory"),
                ("disk", "disk"),
                ("Redis (loopback)", "redis"),
                ("recompute", "recompute"),
            )
        ],
    )
    a = data["answers"]
    answers = table(
        [
            "prompts",
            "tokens",
            "TTFT full",
            "TTFT from Redis",
            "x full",
            "TTFT from memory",
            "x full",
            "answer from Redis x full",
            "reused",
            "= full's answer",
            "warmed tokens recomputed (no repair)",
        ],
        [
            [
                f"{a['prompts']}",
                f"{a['prompt_tokens_median']:,.0f}",
                f"{a['full_ttft_ms']:,.0f} ms",
                f"{a['redis_ttft_ms']:,.0f} ms",
                f"{a['redis_ttft_ratio']:.2f}",
                f"{a['memory_ttft_ms']:,.0f} ms",
                f"{a['memory_ttft_ratio']:.2f}",
                f"{a['redis_total_ratio']:.2f}",
                f"{a['reused_share_median']:.0%}",
                f"{a['same_answer_as_full']:.0%}",
                f"{a['unrepaired_recomputed_tokens_total']}",
            ]
        ],
    )
    columns: list[Column] = [
        ("workers", get("workers"), "{}"),
        ("threads each", get("threads_each"), "{}"),
        ("documents", get("documents"), "{}"),
        ("seconds", get("seconds"), "{:.1f}"),
        ("tokens/s", get("tokens_per_s"), "{:,.0f}"),
        ("chunks checked", get("chunks_checked"), "{}"),
        ("dropped", get("chunks_dropped"), "{}"),
    ]
    warm = data["warm"]
    notes = (
        f"{data['corpus_documents']} NQ passages ({data.get('corpus_tokens', 0):,} tokens) warmed by "
        f"`kvboost-rag warm --store redis://...` in {warm['seconds']:.0f} s; Redis held "
        f"{warm['redis_used_memory_bytes'] / 2**30:.2f} GiB. Medians over a fresh process's prompts, each "
        f"with an empty memory tier."
    )
    return "\n\n".join(
        [notes, places, answers, "warm throughput:\n\n" + columns_table(columns, data["warm_throughput"])]
    )


def decode(data: dict[str, Any]) -> str:
    """Decode step against prompt length: ours, transformers' generate, retrieval, the floor."""
    columns: list[Column] = [
        ("prompt tokens", get("prompt_tokens"), "{:,}"),
        ("ours", get("ours_step_ms"), "{:.0f} ms"),
        ("tokens/s", get("ours_tokens_per_s"), "{:.1f}"),
        ("floor", get("floor_step_ms"), "{:.0f} ms"),
        ("ours x floor", get("ours_x_floor"), "{:.2f}"),
        ("transformers generate", get("transformers_step_ms"), "{:.0f} ms"),
        ("= ours", get("transformers_same_tokens"), lambda x: "yes" if x else "no"),
        ("retrieval", get("retrieval_step_ms"), "{:.0f} ms"),
        ("speedup", get("retrieval_speedup"), "{:.2f}x"),
        ("selection", get("retrieval_select_ms_per_step"), "{:.1f} ms"),
        ("attention", get("retrieval_attend_ms_per_step"), "{:.1f} ms"),
        ("corrected heads", get("retrieval_corrected_share"), "{:.0%}"),
        ("= dense", get("retrieval_same_tokens"), lambda x: "yes" if x else "no"),
    ]
    notes = (
        f"{data['max_new_tokens']} new tokens, greedy; floor: weights ({data['weights_bytes'] / 1e6:.0f} MB) plus "
        f"{data['kv_bytes_per_token'] / 1e3:.0f} KB of KV a token over {data['read_bandwidth_gb_s']:.1f} GB/s "
        "(numpy sum here); selection and attention are retrieval's, per step (all layers)."
    )
    return notes + "\n\n" + columns_table(columns, data["rows"])


def retrieval_nq(data: dict[str, Any]) -> str:
    """Decode attentions against dense attention on long NQ prompts: retrieval, and dense attention
    through sdpa's kernel (the noise floor of "equal"). An older result held retrieval alone."""
    attentions = data.get("attentions") or [
        {
            "attention": "retrieval",
            "same_tokens_share": data["same_tokens_share"],
            "same_first_line_share": data["same_first_line_share"],
            "em": data["em_retrieval"],
            "decode_speedup_median": data["decode_speedup_median"],
        }
    ]
    columns: list[Column] = [
        ("attention", get("attention"), "{}"),
        (f"same {data.get('max_new_tokens', 32)} tokens", get("same_tokens_share"), "{:.0%}"),
        ("same answer line", get("same_first_line_share"), "{:.0%}"),
        ("EM", get("em"), "{:.1%}"),
        ("right only with dense / only with it", lambda r: f"{r['em_only_dense']} / {r['em_only_this']}", "{}"),
        ("decode speedup", get("decode_speedup_median"), "{:.2f}x"),
        ("corrected heads", get("corrected_share_median"), "{:.0%}"),
    ]
    notes = (
        f"{data['questions']} questions, k={data['k']}, median {data['prompt_tokens_median']:,.0f} prompt tokens; "
        f"dense attention's EM {data['em_dense']:.1%}."
    )
    return notes + "\n\n" + columns_table(columns, attentions)


def retrieval_ceiling(data: dict[str, Any]) -> str:
    """Decode steps with attention to a free window, retrieval and none, against dense."""
    columns: list[Column] = [
        ("prompt tokens", get("prompt_tokens"), "{:,}"),
        ("attention", get("mode"), "{}"),
        ("step", get("step_ms"), "{:.1f} ms"),
        ("x dense", get("speedup"), "{:.2f}x"),
        ("selection", get("select_ms"), "{:.1f} ms"),
        ("attention to the selection", get("attend_ms"), "{:.1f} ms"),
        ("corrected heads", get("corrected_share"), "{:.0%}"),
    ]
    notes = (
        f"Median decode step of {data['rounds']} alternating rounds of {data['steps']} steps, one prefilled "
        "prompt per length; free window: the last budget tokens as views (no selection, no copy); retrieval t: "
        "correction threshold t (-1: never corrected); selection and attention are per step (all layers)."
    )
    rows = [{"prompt_tokens": row["prompt_tokens"], **mode} for row in data["rows"] for mode in row["modes"]]
    return notes + "\n\n" + columns_table(columns, rows)


def retrieval_choice(data: dict[str, Any]) -> str:
    """Decode attentions teacher-forced along dense attention's answers: how good a page choice is."""
    columns: list[Column] = [
        ("attention", get("attention"), "{}"),
        ("answers = dense", lambda r: f"{r['answers_equal']:.0f} / {data['questions']}", "{}"),
        ("next token = dense", get("agreement"), "{:.1%}"),
        ("KL a step", get("kl_mean"), "{:.4f}"),
    ]
    notes = f"{data['questions']} questions, k={data['k']}, {data['max_new_tokens']} tokens teacher-forced."
    return notes + "\n\n" + columns_table(columns, data["attentions"])


def step_rows(data: dict[str, Any]) -> str:
    """A pass over a RAG prompt's cache against its query rows: the price of repair on decode steps."""
    columns: list[Column] = [
        ("query rows", get("rows"), "{}"),
        ("pass", get("pass_ms"), "{:.1f} ms"),
        ("each row past the first", get("extra_row_ms"), "{:.2f} ms"),
    ]
    notes = (
        f"{data['questions']} NQ prompts, k={data['k']}, median {data['prompt_tokens_median']:,.0f} tokens; "
        f"full prefill costs {data['prefill_ms_per_token']:.2f} ms a prompt token."
    )
    return notes + "\n\n" + columns_table(columns, data["rows"])


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "bench_multiturn": multiturn,
    "bench_step_rows": step_rows,
    "bench_decode": decode,
    "bench_retrieval_nq": retrieval_nq,
    "bench_retrieval_ceiling": retrieval_ceiling,
    "retrieval_choice": retrieval_choice,
    "bench_redis": redis_tier,
    "bench_budget": budget,
    "bench_ttft": ttft,
    "bench_store": store,
    "bench_attention": attention,
    "bench_dtype": dtype,
    "explore_repair": eval_summary,
    "eval_": eval_summary,
    "selection_ceiling": selection,
    "verify_margin": verify,
    "where_error_sits": where,
}


def provenance(data: dict[str, Any]) -> str:
    run = data.get("run")
    if not run:
        return "Where and at which commit: not recorded (the earlier machine, see above)."
    machine = f"{run['cpu']}, {run['cpu_count']} CPUs, AVX-512 {'yes' if run['avx512'] else 'no'}"
    return f"Measured {run['date']} at commit {run['commit']} ({machine}, torch {run['torch']}): `{run['command']}`"


def render_file(path: Path, root: Path) -> str | None:
    """The section of one result file, or None when no renderer knows its name."""
    renderer = next((r for prefix, r in RENDERERS.items() if path.stem.startswith(prefix)), None)
    if renderer is None:
        return None
    data = json.loads(path.read_text())
    return f"### `{path.relative_to(root).as_posix()}`\n\n{provenance(data)}\n\n{renderer(data)}"


def render_all(results: Path) -> str:
    """Every known result under `results`: the folder's own files first, then each subfolder's."""
    paths = sorted(results.rglob("*.json"), key=lambda p: (len(p.relative_to(results).parts), p.as_posix()))
    return "\n\n".join(s for s in (render_file(p, results.parent) for p in paths) if s is not None)


def replace_section(text: str, generated: str, begin: str = BEGIN, end_marker: str = END) -> str:
    """`text` with what lies between the markers replaced by `generated`."""
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"no {begin} ... {end_marker} section")
    return text[: start + len(begin)] + "\n" + generated + "\n" + text[end:]


def _prompts(data: dict[str, Any]) -> str:
    """What a headline row's prompts hold: k documents (of how many passages), tokens, questions."""
    settings, full = data["settings"], data["summary"]["full"]
    joined = settings.get("passages_per_document", 1)
    documents = f"k={settings['k']}" + (f" x {joined} passages" if joined > 1 else "")
    neighbours = settings.get("warm_neighbours", 0)
    documents += f", warmed after {neighbours} neighbours" if neighbours else ""
    rho = re.search(r"rho=([0-9.]+)", str(settings.get("repair", "")))
    documents += f", rho {rho.group(1)}" if rho and float(rho.group(1)) != RepairConfig().rho else ""
    dtype = _dtype(data)
    return f"{documents}, ~{full.get('prompt_tokens_median', 0):,.0f} tok, n={full['questions']:.0f}" + (
        f", {dtype}" if dtype else ""
    )


def _dtype(data: dict[str, Any]) -> str:
    """The dtype an eval ran in, as its settings record it ("bf16", "fp32"; "" if not recorded)."""
    dtype = str(data["settings"].get("dtype", "")).removeprefix("torch.")
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype)


def _machine(data: dict[str, Any]) -> str:
    """The dtype and CPU an eval ran on, as its JSON records them."""
    dtype = _dtype(data)
    run = data.get("run")
    if not run:
        return dtype
    return f"{dtype} on a {run['cpu_count']}-core {'AVX-512' if run['avx512'] else 'AVX2'} CPU"


def render_headline(results: Path) -> str:
    """One table for the top-level README: full prefill, CacheBlend alone and the default, per k."""
    rows, machines = [], set()
    for name in HEADLINE_FILES:
        path = results / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        machines.add(_machine(data))
        for variant in HEADLINE_VARIANTS:
            stats = data["summary"].get(variant)
            if stats is not None:
                rows.append({"prompts": _prompts(data), "variant": variant, **stats})
    columns: list[Column] = [
        ("prompts", get("prompts"), "{}"),
        ("variant", get("variant"), "{}"),
        ("EM", get("em"), "{:.1%}"),
        ("EM vs full [95%]", em_diff_with_interval, "{}"),
        ("1st token = full's", get("first_token_agreement"), "{:.1%}"),
        ("TTFT x full", get("ttft_ratio_vs_full"), "{:.2f}"),
        ("answer time x full", get("total_ratio_vs_full"), "{:.2f}"),
        ("recomputed", get("recomputed_share"), "{:.0%}"),
    ]
    source = ", ".join(f"[`{n}`](benchmarks/results/{n})" for n in HEADLINE_FILES if (results / n).exists())
    note = (
        "NQ-Open, FAISS top-k, passages shuffled and warmed, greedy 16-token answers, every variant paired "
        f"against full prefill on the same questions in one run, {'; '.join(sorted(machines))} ({source}). "
        "Recomputed: tokens computed again though a cache held them (repair, verification, refresh), per "
        "prompt token. One question moves EM by 100/n points (n in the first column)."
    )
    return note + "\n\n" + columns_table(columns, rows)
