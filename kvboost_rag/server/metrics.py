"""What a serving user scrapes at `/metrics`, in Prometheus' text format (prometheus-client).

Names follow vLLM's where one exists (`kvboost:` in place of `vllm:`): requests by status, the
queue and the running batch, time to first token, decode steps, prompt tokens by how they were
served, and the store's hits and errors per tier. One registry per app, so apps do not share counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine import KVBoostRAG
from ..engine.result import GenerationResult

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/kvboost/warm", "/kvboost/store")
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_STEPS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
_ROWS = (1, 2, 4, 8, 16, 32, 64)


class ServingMetrics:
    """The server's metrics; `scrape()` is the `/metrics` body."""

    def __init__(self, engine: KVBoostRAG) -> None:
        self.registry = registry = CollectorRegistry()
        reg = registry
        self.requests = Counter("kvboost:requests", "HTTP answers by route, status", ["route", "status"], registry=reg)
        self.ttft = Histogram("kvboost:time_to_first_token_seconds", "To first token", buckets=_SECONDS, registry=reg)
        self.latency = Histogram("kvboost:e2e_request_latency_seconds", "To last token", buckets=_SECONDS, registry=reg)
        self.steps = Histogram("kvboost:decode_step_seconds", "A step of the batch", buckets=_STEPS, registry=reg)
        self.step_rows = Histogram("kvboost:decode_step_rows", "Requests in one step", buckets=_ROWS, registry=reg)
        self.prompt_tokens = Counter(
            "kvboost:prompt_tokens", "Prompt tokens by how served, by tenant", ["kind", "tenant"], registry=reg
        )
        self.completion_tokens = Counter(
            "kvboost:generation_tokens", "Tokens generated, by tenant", ["tenant"], registry=reg
        )
        self.drafted_tokens = Counter(
            "kvboost:draft_tokens", "Tokens drafted from prompts, by whether answers took them", ["taken"], registry=reg
        )
        waiting = Gauge("kvboost:num_requests_waiting", "Requests queued for a place in the batch", registry=reg)
        waiting.set_function(lambda: engine.batcher.waiting)
        running = Gauge("kvboost:num_requests_running", "Requests decoding now (the batch)", registry=reg)
        running.set_function(lambda: engine.batcher.running)
        registry.register(_StoreCollector(engine))
        engine.batcher.listeners.append(self._step)

    def _step(self, rows: int, seconds: float) -> None:
        self.steps.observe(seconds)
        self.step_rows.observe(rows)

    def finished(self, result: GenerationResult, tenant: str = "") -> None:
        """A generation's figures, once it is done; `tenant`: its namespace ("": the shared one)."""
        self.ttft.observe(result.ttft_s)
        self.latency.observe(result.total_s)
        self.completion_tokens.labels(tenant).inc(result.new_tokens)
        self.drafted_tokens.labels("yes").inc(result.accepted_tokens)
        self.drafted_tokens.labels("no").inc(result.drafted_tokens - result.accepted_tokens)
        kinds = {
            "reused_exact": result.reused_exact_tokens,
            "reused_approximate": result.reused_approximate_tokens,
            "computed": result.computed_tokens,
            "repaired": result.repair_tokens,
        }
        for kind, tokens in kinds.items():
            self.prompt_tokens.labels(kind, tenant).inc(tokens)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)


class CountAnswers:
    """ASGI middleware counting each HTTP answer by route and status: plain ASGI, reading the
    status as it is sent, so streams and disconnects pass through untouched."""

    def __init__(self, app: ASGIApp, metrics: ServingMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, sending)


class _StoreCollector:
    """The store's hit and error counts per tier, read when scraped."""

    def __init__(self, engine: KVBoostRAG) -> None:
        self.store = engine.store

    def collect(self) -> Iterator[Metric]:
        hits, errors = self.store.counts()
        yield _by_tier("kvboost:store_hits", "Chunks found, by the tier that held them", hits.items())
        yield _by_tier("kvboost:store_errors", "Store calls that failed and were served without", errors.items())

    def describe(self) -> Iterable[Any]:
        return []


def _by_tier(name: str, documentation: str, counts: Iterable[tuple[str, int]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["tier"])
    for tier, count in sorted(counts):
        family.add_metric([tier], count)
    return family
