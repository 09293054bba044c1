"""The server's memory under load: does the process stay within the memory budget it was given
plus a fixed overhead (the model, the decode buffer, Python)? Issue 54 measured RSS growing from
1.2 to 3.7 GB under 8 streaming clients with a 0.72 GB memory tier.

`kvboost-rag serve` runs as users start it (`--memory-budget-bytes`, prompts kept, as by default),
in its own process; NQ documents are warmed through `/kvboost/warm`, then --clients clients send
--requests streamed requests over --questions different prompts (every answer kept, so the memory
tier fills with prompts too). The server's RSS is sampled every 0.25 s from /proc: at start, after
warming, its peak and its last value under load, beside the budget and what the memory tier holds
(`/kvboost/store`).

JSON: benchmarks/results/bench_memory_under_load.json (or --out).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from bench_serving import clients_run

from kvboost_lab import harness
from kvboost_lab.http_server import free_port
from kvboost_rag.sizes import parse_size


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    p = harness.parser(__doc__, questions=64, k=5, seed=0, out="bench_memory_under_load.json", max_new_tokens=16)
    p.add_argument("--budget", default="512MiB", help="the server's --memory-budget-bytes")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=800, help="requests in all")
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
    port = free_port()
    command = [sys.executable, "-m", "kvboost_rag.cli", "serve", "--store", "memory", "--port", str(port)]
    command += ["--memory-budget-bytes", args.budget, "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root, samples, done = f"http://127.0.0.1:{port}", [], threading.Event()
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(root + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        started_rss = rss_bytes(process.pid)
        documents = nq.all_documents(args.k)
        for start in range(0, len(documents), 256):  # the server's --max-warm-documents a request
            batch = {"documents": documents[start : start + 256]}
            warmed = httpx.post(root + "/kvboost/warm", json=batch, timeout=3600)
            assert warmed.status_code == 200, warmed.text
        warmed_rss = rss_bytes(process.pid)

        def sample() -> None:
            while not done.is_set():
                samples.append(rss_bytes(process.pid))
                time.sleep(0.25)

        sampler = threading.Thread(target=sample)
        sampler.start()
        many = [prompts[i % len(prompts)] for i in range(args.requests)]
        model = httpx.get(root + "/v1/models").json()["data"][0]["id"]
        records, wall_s = clients_run(
            root + "/v1", model, many, args.clients, args.max_new_tokens, extra={"kvboost": {"store_prompt": True}}
        )
        done.set()
        sampler.join()
        store = httpx.get(root + "/kvboost/store").json()["memory"]
    finally:
        done.set()
        process.terminate()
        process.wait(timeout=30)
    budget = parse_size(args.budget)
    report = {
        "budget_bytes": budget,
        "clients": args.clients,
        "requests": len(records),
        "errors": sum(r["error"] is not None for r in records),
        "wall_s": wall_s,
        "rss_start_bytes": started_rss,
        "rss_after_warm_bytes": warmed_rss,
        "rss_peak_bytes": max(samples),
        "rss_last_bytes": samples[-1],
        "memory_tier_bytes": store["bytes"],
        "memory_tier_entries": store["entries"],
        "overhead_over_budget_bytes": max(samples) - budget,
        # RSS at each tenth of the run: whether it levels off
        "rss_tenths_bytes": [samples[min(len(samples) - 1, i * len(samples) // 10)] for i in range(10)] + [samples[-1]],
    }
    print({k: (f"{v / 2**30:.2f} GiB" if k.endswith("bytes") and isinstance(v, int) else v) for k, v in report.items()})
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
