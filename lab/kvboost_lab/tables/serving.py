"""The table of the serving benchmark: ours and the peers under 1, 4, 8 concurrent clients."""

from __future__ import annotations

from typing import Any

from .format import Column, columns_table, get


def serving(data: dict[str, Any]) -> str:
    """Aggregate and per-request figures per server and client count, then the load test."""
    rows = []
    for server, label in (("ours", "kvboost-rag serve"), ("llama_cpp", "llama-server --parallel")):
        one = data.get(server, {}).get("1")
        for clients, row in data.get(server, {}).items():
            rows.append(
                {
                    "server": label,
                    "clients": int(clients),
                    "x": row["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"] if one else None,
                }
                | row
            )
    batch = data.get("transformers_generate_batch")
    if batch:
        rows.append({"server": "transformers generate_batch (no server)", "clients": batch["requests"]} | batch)
    seconds = lambda s: f"{s * 1000:,.0f} ms"  # noqa: E731
    columns: list[Column] = [
        ("server", get("server"), "{}"),
        ("clients", get("clients"), "{}"),
        ("tokens/s, all", get("aggregate_tokens_per_s"), "{:.1f}"),
        ("x one client", get("x"), "{:.2f}x"),
        ("TTFT p50", get("ttft_p50_s"), seconds),
        ("TTFT p95", get("ttft_p95_s"), seconds),
        ("decode tokens/s a request, p50", get("decode_tokens_per_s_p50"), "{:.1f}"),
        ("slowest 5%", get("decode_tokens_per_s_p95_low"), "{:.1f}"),
        ("first chunk = 1 client", get("same_first_chunk"), "{:.0%}"),
        ("answer = 1 client", get("same_answer"), "{:.0%}"),
        ("text before parting, p50", get("text_before_parting_p50"), "{:.0%}"),
        ("errors", get("errors"), "{}"),
    ]
    load = data.get("load_test", {})
    notes = (
        f"{data['prompts']} NQ prompts (k={data['k']}, documents warmed), {data['max_tokens']} tokens each "
        f"(ignore_eos), greedy; the official openai client, streaming. Full prefill alone: "
        f"{data['full_prefill_s'] * 1000:,.0f} ms to the first token. Load test: {load.get('requests')} requests "
        f"from 8 clients, {load.get('hung_up')} hung up after two chunks: {load.get('errors')} errors, "
        f"{load.get('truncated')} truncated, {load.get('running_after'):.0f} running and "
        f"{load.get('waiting_after'):.0f} waiting after. Text before parting: the share of an answer's text "
        f"before it parts from the one-client answer"
        + (
            "."
            if all(row.get("same_answer") == 1 for row in data["ours"].values())
            else " (a batched row rounded its attention apart from a lone step before issue 53)."
        )
    )
    return notes + "\n\n" + columns_table(columns, rows)


def server_limits(data: dict[str, Any]) -> str:
    """A body past the limit against `kvboost-rag serve`: how soon refused, how soon others answered."""
    refused = ", ".join(f"{s * 1000:.0f}" for s in data["refused_s"])
    return (
        f"A {data['body_mb']:g} MB chat body: 413 in {data['refused_s_median'] * 1000:.0f} ms (median; rounds: "
        f"{refused} ms); the slowest `/health` answer meanwhile {data['health_during_refusal_max_s'] * 1000:.0f} ms. "
        f"A body just under the limit (tokenized in a worker thread, then a {data['fitting_body_status']}) took "
        f"{data['fitting_body_s']:.2f} s; the slowest `/health` answer meanwhile "
        f"{data['health_during_fitting_max_s'] * 1000:.0f} ms."
    )


def memory_under_load(data: dict[str, Any]) -> str:
    """The server's RSS under streaming clients beside the memory budget it was given."""
    gib = 2**30
    tenths = ", ".join(f"{b / gib:.2f}" for b in data["rss_tenths_bytes"])
    return (
        f"`kvboost-rag serve --memory-budget-bytes {data['budget_bytes'] / gib:.2f}GiB`, {data['clients']} streaming "
        f"clients, {data['requests']} requests ({data['errors']} errors, prompts kept): RSS "
        f"{data['rss_start_bytes'] / gib:.2f} GiB at start (the model), {data['rss_after_warm_bytes'] / gib:.2f} after "
        f"warming, peak {data['rss_peak_bytes'] / gib:.2f}, last {data['rss_last_bytes'] / gib:.2f}; the memory tier "
        f"held {data['memory_tier_bytes'] / gib:.2f} GiB ({data['memory_tier_entries']} chunks). RSS at each tenth "
        f"of the run (GiB): {tenths}."
    )


def tenants(data: dict[str, Any]) -> str:
    """Tenant B asking the prompts of documents tenant A warmed, beside tenant C who never saw them."""
    median = data["median_s"]
    return (
        f"{data['questions']} NQ prompts (k={data['k']}), one token each, asked by tenants B and C in alternating "
        f"order; tenant A warmed their documents. Median time: B {median['b']:.3f} s, C {median['c']:.3f} s, "
        f"A {median['a']:.3f} s (A / C {data['a_over_c']:.2f}x). B - C paired: median "
        f"{data['b_minus_c_median_s'] * 1000:+.1f} ms, standard deviation {data['b_minus_c_stdev_s'] * 1000:.1f} ms, "
        f"B faster on {data['b_faster_than_c']} of {data['questions']} (Wilcoxon p = {data['wilcoxon_p']:.2f}, "
        f"Kolmogorov-Smirnov p = {data['ks_p']:.2f}). Cached tokens B had beyond C's: "
        f"{data['cached_tokens_b_beyond_c']} (medians: A {data['cached_tokens_median']['a']:.0f}, "
        f"B {data['cached_tokens_median']['b']:.0f}, C {data['cached_tokens_median']['c']:.0f}: each tenant's own "
        "template head)."
    )
