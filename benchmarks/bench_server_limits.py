"""A 10 MB request body against `kvboost-rag serve` (its defaults): how soon it is refused, and how
soon `/health` answers another client meanwhile (issue 54's targets: < 0.5 s and < 0.2 s).

The server runs as users start it, in its own process. Each round posts a chat body of --mb MB
(one user message) while a second thread polls `/health` every 20 ms; per round, the time to the
413 and the slowest `/health` answer during it. Then one prompt just under the body limit (it is
tokenized, in a worker thread) with the same polling: the slowest `/health` answer while it was.

JSON: benchmarks/results/bench_server_limits.json (or --out).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import httpx
from bench_serving import server

from kvboost_lab import harness
from kvboost_lab.http_server import free_port


def timed_with_health(root: str, post: dict) -> tuple[int, float, float]:
    """(status, seconds to the answer, slowest /health answer meanwhile)."""
    done, slowest = threading.Event(), [0.0]

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                started = time.perf_counter()
                client.get(root + "/health")
                slowest[0] = max(slowest[0], time.perf_counter() - started)
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.1)
    started = time.perf_counter()
    status = httpx.post(root + "/v1/chat/completions", timeout=120, **post).status_code
    elapsed = time.perf_counter() - started
    done.set()
    poller.join()
    return status, elapsed, slowest[0]


def main() -> None:
    p = harness.parser(__doc__, questions=0, k=0, seed=0, out="bench_server_limits.json", dtype=False)
    p.add_argument("--mb", type=float, default=10.0, help="size of the refused body")
    p.add_argument("--rounds", type=int, default=5)
    args = harness.parse(p)
    port = free_port()
    command = [sys.executable, "-m", "kvboost_rag.cli", "serve", "--store", "memory", "--port", str(port)]
    with server(command, port) as url:
        root = url.removesuffix("/v1")
        model = httpx.get(url + "/models").json()["data"][0]["id"]
        text = "word " * int(args.mb * 1e6 / 5)
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
        rounds = [timed_with_health(root, {"json": body}) for _ in range(args.rounds)]
        assert all(status == 413 for status, _, _ in rounds), rounds
        fitting = {"model": model, "messages": [{"role": "user", "content": "word " * 380_000}], "max_tokens": 1}
        status, elapsed, slowest = timed_with_health(root, {"json": fitting})
    report = {
        "body_mb": args.mb,
        "refused_s": [r[1] for r in rounds],
        "refused_s_median": statistics.median(r[1] for r in rounds),
        "health_during_refusal_max_s": max(r[2] for r in rounds),
        "fitting_body_status": status,  # a 400: 380k words are past the window, found once tokenized
        "fitting_body_s": elapsed,
        "health_during_fitting_max_s": slowest,
    }
    print(report)
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
