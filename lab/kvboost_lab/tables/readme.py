"""Markdown tables from the benchmarks' JSON results, so no README holds a number typed by hand.

One renderer per benchmark, chosen by the JSON file's name; `render_all` renders every result
found under a folder, `replace_section` puts that text between two markers of a README, and
`render_headline` is the top-level README's one table. A value an older result lacks is left blank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvboost_rag.config import RepairConfig

from .decode import (
    alone_vs_batched,
    batch_step,
    decode,
    decode_ab,
    decode_peers,
    first_look,
    retrieval_ceiling,
    retrieval_nq,
    sparse_decode_choice,
    step_numerics,
    step_rows,
)
from .format import Column, columns_table, em_diff_with_interval, get
from .quality import attention, dtype, eval_summary, multiturn, selection, ttft, verify, where
from .serving import memory_under_load, server_limits, serving, tenants
from .tiers import budget, redis_tier, store, store_scale, warming

BEGIN, END = "<!-- tables:begin -->", "<!-- tables:end -->"
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline:begin -->", "<!-- headline:end -->"
# The eval results the top-level README's headline table reads: what users get today at k=5 (500
# questions), on questions no setting was chosen on (seed 2), beside the same engine keeping its
# warmed KV dense, in one run. The earlier headline runs are in benchmarks/README.md.
HEADLINE_FILES = ("issue55/heldout_seed2/eval_k5_n500.json",)
HEADLINE_VARIANTS = (
    "full",
    "together",
    "default",
    "dense",
    "deviation",
    "strangers",
    "strangers-as-alone",
    "nearest",
    "plain",
)
HEADLINE_ORDER = ("full", "default", "dense", "query", "strangers-as-alone", "nearest", "plain")  # by today's names

RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "bench_multiturn": multiturn,
    "bench_serving": serving,
    "bench_server_limits": server_limits,
    "bench_memory_under_load": memory_under_load,
    "bench_tenants": tenants,
    "bench_store_scale": store_scale,  # before "bench_store": the first matching prefix renders
    "bench_batch_step": batch_step,
    "alone_vs_batched": alone_vs_batched,
    "decode_ab": decode_ab,
    "step_numerics": step_numerics,
    "eval_first_look": first_look,  # before "eval_": the first matching prefix renders
    "bench_step_rows": step_rows,
    "bench_decode_peers": decode_peers,  # before "bench_decode": the first matching prefix renders
    "bench_decode": decode,
    "bench_sparse_decode_nq": retrieval_nq,
    "bench_sparse_decode_ceiling": retrieval_ceiling,
    "sparse_decode_choice": sparse_decode_choice,
    "bench_redis": redis_tier,
    "bench_budget": budget,
    "bench_warm": warming,
    "bench_ttft": ttft,
    "bench_store": store,
    "bench_attention": attention,
    "bench_dtype": dtype,
    "explore_repair": eval_summary,
    "eval_": eval_summary,
    "selection_ceiling": selection,
    "query_choice": selection,
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
    if neighbours and (settings.get("warming") == "groups" or "together" in data["summary"]):
        documents += f", warmed in groups of {neighbours} nearest"
    elif neighbours:
        documents += f", warmed after {neighbours} neighbours"
    documents += ", warmed alone" if _warmed_alone(data) else ""
    repair = str(settings.get("repair", ""))
    rho = re.search(r"rho=([0-9.]+)", repair)
    by_query = "strategy='query'" in repair  # its rho is the query variant's, named in each row
    documents += f", rho {rho.group(1)}" if rho and float(rho.group(1)) != RepairConfig().rho and not by_query else ""
    dtype = _dtype(data)
    return f"{documents}, ~{full.get('prompt_tokens_median', 0):,.0f} tok, n={full['questions']:.0f}" + (
        f", {dtype}" if dtype else ""
    )


def _variant_now(data: dict[str, Any], variant: str) -> str:
    """A recorded variant by today's name: a `default` of documents warmed alone is `plain` now, one
    of documents each warmed after its own nearest (before groups became the default) `nearest`,
    `together` (groups, then a variant) today's `default`; of groups, a `default` repaired before
    chunks warmed among strangers had a share of their own is `strangers-as-alone` now, and
    `strangers` (that share, then a variant) today's `default`; in a run whose default was the
    query-guided repair (issue 51's), that `default` is `query` and its `deviation` today's `default`."""
    if "strategy='query'" in str(data["settings"].get("repair", "")):
        return {"default": "query", "deviation": "default"}.get(variant, variant)
    if variant == "default" and _warmed_alone(data):
        return "plain"
    if variant == "strangers":
        return "default"
    if variant == "together" or (variant == "default" and data["settings"].get("warming") == "groups"):
        return "default" if _strangers_share(data) else "strangers-as-alone"
    if variant == "default" and data["settings"].get("warm_neighbours"):
        return "nearest"
    return variant


def _strangers_share(data: dict[str, Any]) -> bool:
    """Whether the run's repair gave chunks warmed among documents the prompt lacks their own share."""
    return re.search(r"rho_among_strangers=[0-9.]+", str(data["settings"].get("repair", ""))) is not None


def _warmed_alone(data: dict[str, Any]) -> bool:
    settings = data["settings"]
    return not settings.get("warm_neighbours", 0) and settings.get("retrieval") == "faiss"


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
    """One table for the top-level README: full prefill, the default and the named alternatives, per k."""
    rows, machines = [], set()
    for name in HEADLINE_FILES:
        path = results / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        machines.add(_machine(data))
        found = [(_variant_now(data, v), data["summary"][v]) for v in HEADLINE_VARIANTS if v in data["summary"]]
        for variant, stats in sorted(found, key=lambda row: HEADLINE_ORDER.index(row[0])):
            rows.append({"prompts": _prompts(data), "variant": variant, **stats})
    columns: list[Column] = [
        ("prompts", get("prompts"), "{}"),
        ("variant", get("variant"), "{}"),
        ("EM", get("em"), "{:.1%}"),
        ("EM vs full [95%]", em_diff_with_interval, "{}"),
        ("1st token = full's", get("first_token_agreement"), "{:.1%}"),
        ("answer = full's", get("answer_agreement"), "{:.1%}"),
        ("retention", get("retention"), "{:.1%}"),
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
