"""Tables of the store benchmarks: chunk formats, memory budgets, the Redis tier, warming."""

from __future__ import annotations

from typing import Any

from .format import Column, columns_table, get, table

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


def store(data: dict[str, Any]) -> str:
    rows = [{"format": name, **f} for name, f in data["formats"].items()]
    return f"{data['questions']} questions, k={data['k']}, times per chunk\n\n" + columns_table(STORE, rows)


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


def warming(data: dict[str, Any]) -> str:
    """Plain against neighbour-aware warming of one corpus: time and throughput."""
    columns: list[Column] = [
        ("warming", get("name"), "{}"),
        ("seconds", get("seconds"), "{:.1f}"),
        ("documents/s", get("documents_per_s"), "{:.1f}"),
        ("document tokens/s", get("document_tokens_per_s"), "{:,.0f}"),
        ("encoded tokens/s", get("encoded_tokens_per_s"), "{:,.0f}"),
    ]
    notes = (
        f"{data['documents']} NQ passages ({data['document_tokens']:,} tokens), {data['dtype']}; warming in "
        f"{data['groups']} groups of mutual neighbours ({data['groups_of_one']} of one; the default) took "
        f"{data['together_x_plain_time']:.2f}x plain warming's time, "
        f"{data.get('together_with_finding_x_plain_time', data['together_x_plain_time']):.2f}x with finding the "
        f"neighbours ({data['finding_neighbours_s']:.1f} s); each document after its own nearest took "
        f"{data['aware_x_plain_time']:.2f}x."
    )
    if data.get("repeats", 1) > 1:
        turns = ", ".join(f"{r:.2f}x" for r in data["together_x_plain_time_by_turn"])
        notes += (
            f" Times are medians of {data['repeats']} runs, plain and grouped taking turns (each turn's ratio: "
            f"{turns}; the tokens encoded: {data['together_x_plain_tokens']:.2f}x plain's); the slowest way ran once."
        )
    return notes + "\n\n" + columns_table(columns, [{"name": name, **row} for name, row in data["rows"].items()])


STORE_SCALE: list[Column] = [
    ("documents", get("documents"), "{:,}"),
    ("written/s", get("fill_documents_per_s"), "{:,.0f}"),
    ("lookup p50", get("lookup_ms_p50"), "{:.1f} ms"),
    ("lookup p99", get("lookup_ms_p99"), "{:.1f} ms"),
    ("warm again", get("rewarm_ms_per_document"), "{:.2f} ms/doc"),
    ("warm new", get("warm_new_ms_per_document"), "{:.2f} ms/doc"),
    ("`cache stats`", get("stats", "s"), "{:.2f} s"),
    ("its RSS", lambda row: row["stats"]["peak_rss_bytes"] / 2**20, "{:,.0f} MiB"),
    ("`verify`", get("verify", "s"), "{:.1f} s"),
    ("its RSS", lambda row: row["verify"]["peak_rss_bytes"] / 2**20, "{:,.0f} MiB"),
    ("`prune` 1%", get("prune", "s"), "{:.1f} s"),
    ("its RSS", lambda row: row["prune"]["peak_rss_bytes"] / 2**20, "{:,.0f} MiB"),
    ("index", lambda row: row["index_bytes"] / 2**20, "{:,.0f} MiB"),
    ("chunk files", lambda row: row["chunk_file_bytes"] / 2**20, "{:,.0f} MiB"),
]


def store_scale(data: dict[str, Any]) -> str:
    """The store's own costs as the corpus grows (`bench_store_scale.py`)."""
    return f"A {data['store']} store, {data['model']}; each row the same store grown\n\n" + columns_table(
        STORE_SCALE, data["rows"]
    )
