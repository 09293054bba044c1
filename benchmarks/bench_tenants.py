"""Two tenants on one `kvboost-rag serve`: can tenant B tell which documents tenant A warmed?

The server runs as users start it (its own process, the default model, a memory store) with three
tenants. A warms the documents of --questions NQ questions (k each). Then, per question, B and C
ask the same prompt (A's documents, B and C never warmed or sent them) in alternating order, and A
asks it too. A leak would show as B faster than C, or as cached tokens B has and C has not; A's
times show how large the difference reuse makes is. Each request is one token long (its time is
its time to first token) and is timed around the HTTP call. Whether B's and C's times differ:
Wilcoxon's signed-rank test on the pairs and the two-sample Kolmogorov-Smirnov test (scipy).

JSON: benchmarks/results/bench_tenants.json (or --out).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import httpx
import openai
from bench_serving import server

from kvboost_lab import harness
from kvboost_lab.http_server import free_port

KEYS = {"a": "key-of-a", "b": "key-of-b", "c": "key-of-c"}


def ask(url: str, key: str, model: str, messages: Any) -> tuple[float, int]:
    """(seconds to the one-token answer, its cached prompt tokens)."""
    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=600)
    started = time.perf_counter()
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0)
    elapsed = time.perf_counter() - started
    details = answer.usage.prompt_tokens_details if answer.usage else None
    return elapsed, (details.cached_tokens or 0) if details else 0


def main() -> None:
    p = harness.parser(__doc__, questions=50, k=5, seed=7, out="bench_tenants.json", dtype=False)
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions + 2, args.k, args.seed)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
    port = free_port()
    command = [sys.executable, "-m", "kvboost_rag.cli", "serve", "--store", "memory", "--port", str(port)]
    for name, key in KEYS.items():
        command += ["--tenant", f"team-{name}={key}"]
    if args.model:
        command += ["--model", args.model]
    rows: list[dict[str, Any]] = []
    with server(command, port) as url:
        root = url.removesuffix("/v1")
        model = httpx.get(url + "/models", headers={"Authorization": f"Bearer {KEYS['a']}"}).json()["data"][0]["id"]
        documents = list(dict.fromkeys(d for i in range(args.questions) for d in nq.passages_for(i, args.k)))
        headers = {"Authorization": f"Bearer {KEYS['a']}"}
        warmed = httpx.post(root + "/kvboost/warm", json={"documents": documents}, headers=headers, timeout=3600)
        print("a warmed:", warmed.json())
        for tenant in "abc":  # first-call costs, and each tenant's template head kept, on prompts not measured
            for messages in prompts[-2:]:
                ask(url, KEYS[tenant], model, messages)
        for i in range(args.questions):
            order = "bc" if i % 2 == 0 else "cb"
            row: dict[str, Any] = {"question": i}
            for tenant in [*order, "a"]:
                row[f"{tenant}_s"], row[f"{tenant}_cached"] = ask(url, KEYS[tenant], model, prompts[i])
            rows.append(row)
            print(row)
    from scipy import stats

    differences = [row["b_s"] - row["c_s"] for row in rows]
    b_times, c_times = [row["b_s"] for row in rows], [row["c_s"] for row in rows]
    spread = statistics.pstdev(differences)
    report = {
        "questions": len(rows),
        "k": args.k,
        "seed": args.seed,
        "median_s": {tenant: statistics.median(row[f"{tenant}_s"] for row in rows) for tenant in "abc"},
        "b_minus_c_median_s": statistics.median(differences),
        "b_minus_c_stdev_s": spread,
        "b_faster_than_c": sum(d < 0 for d in differences),
        "wilcoxon_p": float(stats.wilcoxon(b_times, c_times).pvalue),
        "ks_p": float(stats.ks_2samp(b_times, c_times).pvalue),
        "cached_tokens_b_beyond_c": sum(row["b_cached"] - row["c_cached"] for row in rows),
        "cached_tokens_median": {
            tenant: statistics.median(row[f"{tenant}_cached"] for row in rows) for tenant in "abc"
        },
        "a_over_c": statistics.median(row["a_s"] / row["c_s"] for row in rows),
        "rows": rows,
    }
    print({key: value for key, value in report.items() if key != "rows"})
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
