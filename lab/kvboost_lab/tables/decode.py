"""Tables of the decode benchmarks: the step against its floor, sparse decode's accuracy, cost
and page choice, and the price of extra query rows."""

from __future__ import annotations

from typing import Any

from .format import Column, columns_table, get


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


def sparse_decode_choice(data: dict[str, Any]) -> str:
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


def decode_peers(data: dict[str, Any]) -> str:
    """Decode speed beside transformers' generate and llama.cpp, one row per prompt length and peer."""
    rows = []
    for row in data["rows"]:
        base = row["transformers"]["tokens_per_s"]
        for peer, values in row.items():
            if isinstance(values, dict):
                rows.append(
                    {"prompt_tokens": row["prompt_tokens"], "peer": peer, "x": values["tokens_per_s"] / base} | values
                )
    columns: list[Column] = [
        ("prompt tokens", get("prompt_tokens"), "{:,}"),
        ("peer", get("peer"), "{}"),
        ("weights", get("weights"), "{}"),
        ("decode tokens/s", get("tokens_per_s"), "{:.1f}"),
        ("x transformers", get("x"), "{:.2f}x"),
        ("tokens from drafts", get("drafted_share"), "{:.0%}"),
        ("full prefill", get("prefill_s"), lambda s: f"{s * 1000:,.0f} ms"),
        ("first token, shuffled prompt warmed", get("ttft_reuse_s"), lambda s: f"{s * 1000:,.0f} ms"),
        ("tokens computed there", get("reuse_computed_tokens"), "{:,.0f}"),
    ]
    notes = (
        f"{data['max_new_tokens']} new tokens, greedy, {data['dtype']}, medians; llama.cpp: llama-server on the same "
        "GGUF, its own timings; its reuse is its prefix cache after the prompt in its first order. Ours: the "
        "prompt's passages warmed, then given shuffled; tokens computed there count the repair and, where the "
        "first token was a near-tie, the exact prefill that verified it (raw text without a question often is one)."
    )
    if any("drafted_share" in row for row in rows):
        notes += (
            " Drafts: tokens looked up in the prompt, verified in one pass (ours: the same answer as without; "
            "llama.cpp's `--spec-type ngram-simple`)."
        )
    return notes + "\n\n" + columns_table(columns, rows)


def batch_step(data: dict[str, Any]) -> str:
    """One decode step for many rows at once against one step each: what continuous batching saves."""
    columns: list[Column] = [
        ("rows", get("rows"), "{}"),
        ("one step each, in turn", get("one_step_each_ms"), "{:.1f} ms"),
        ("one batched step", get("batched_step_ms"), "{:.1f} ms"),
        ("speedup", get("speedup"), "{:.2f}x"),
        ("largest logit difference", get("max_logit_difference"), "{:.3g}"),
    ]
    drafts = sorted(data["rows"][0].get("draft_step_ms", {}), key=int)
    for draft in drafts:  # a step whose rows each verify a draft (recorded since issue 53)
        columns.append((f"rows of 1 + {draft} drafted", lambda r, d=draft: r["draft_step_ms"][d], "{:.1f} ms"))
        columns.append((f"{draft} drafted pays from", lambda r, d=draft: r["draft_break_even"][d], "{:.2f} tokens"))
    notes = (
        f"Every row {data['prompt_tokens']:,} prompt tokens, {data['weights']} weights, {data['dtype']}, "
        f"{data['threads']} threads."
        + (
            " A draft pays where a row takes more tokens a pass than the pass costs in one-token steps."
            if drafts
            else ""
        )
    )
    return notes + "\n\n" + columns_table(columns, data["rows"])


def alone_vs_batched(data: dict[str, Any]) -> str:
    """NQ answers alone and batched: equal whole, and tokens/s both ways."""
    parted = [i for i in data["first_differing_token"] if i is not None]
    where = f"; the others part at tokens {sorted(parted)}" if parted else ""
    return (
        f"{data['prompts']} NQ prompts (k={data['k']}), {data['max_new_tokens']} greedy tokens, {data['dtype']}: "
        f"**{data['equal_answers']} of {data['prompts']}** answers equal alone and {data['max_running']} at a "
        f"time{where}. {data['alone_tokens_per_s']:.1f} tokens/s one at a time, "
        f"{data['together_tokens_per_s']:.1f} together."
        + (
            f" Alone, drafts of {data['draft_tokens']} tokens: {data['alone_accepted_tokens']} of "
            f"{data['alone_drafted_tokens']} drafted tokens taken, {data['alone_tokens_per_pass']:.2f} tokens a pass."
            if "alone_tokens_per_pass" in data
            else ""
        )
    )


def decode_ab(data: dict[str, Any]) -> str:
    """One checkout's decode speed (an A/B's one side)."""
    lengths = ", ".join(f"{int(n):,} tokens {rate:.1f}" for n, rate in data["decode"].items())
    return (
        f"Checkout {data['checkout']}, {data['dtype']}. Decode tokens/s after a full prefill of {lengths}; "
        f"{data['prompts']} NQ prompts: {data['one_at_a_time_tokens_per_s']:.1f} tokens/s one at a time, "
        f"{data['together_tokens_per_s']:.1f} together, {data['equal_answers']} of {data['prompts']} answers equal."
    )


def step_numerics(data: dict[str, Any]) -> str:
    """Which operators give a row the numbers it gets alone (0 differing: they do)."""
    rows = [
        {"case": name.replace("_", " "), "differing": value["differing"], "cases": value["cases"]}
        for name, value in data.items()
        if isinstance(value, dict) and "differing" in value
    ]
    columns: list[Column] = [
        ("operator", get("case"), "{}"),
        ("differ", get("differing"), "{}"),
        ("of", get("cases"), "{}"),
    ]
    return f"CPU capability {data['cpu_capability']}.\n\n" + columns_table(columns, rows)


def first_look(data: dict[str, Any]) -> str:
    """`kvboost-rag eval` on a fresh process: load and the rest, medians of the runs."""
    medians = data["medians"]
    return (
        f"`kvboost-rag eval --limit {data['settings']['limit']} --k {data['settings']['k']}`, "
        f"{len(data['runs'])} runs: median {medians['load_s']:.1f} s to load, {medians['after_load_s']:.1f} s after, "
        f"{medians['total_s']:.1f} s in all."
    )
