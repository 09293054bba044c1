"""`kvboost-rag serve`: the OpenAI-compatible server, tested over real HTTP with real clients.

Each server runs uvicorn in a thread on a free loopback port. The official `openai` client,
LangChain's `ChatOpenAI` and LlamaIndex's `OpenAILike` talk to it as they would to OpenAI.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from kvboost_lab.http_server import free_port, serving_app
from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.server import Access, ServerSettings, create_app
from kvboost_rag.testing.engines import on_empty_store
from kvboost_rag.testing.redis_server import local_redis

KEY = "test-key"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@contextmanager
def serving(engine: KVBoostRAG, settings: ServerSettings) -> Iterator[str]:
    """The server on a free port until the block ends; yields its /v1 base URL."""
    with serving_app(create_app(engine, settings)) as root:
        yield f"{root}/v1"


def new_engine(model: KVBoostRAG) -> KVBoostRAG:
    return KVBoostRAG(model.model, model.tokenizer, EngineConfig(store="memory"), name=model.name)


@pytest.fixture(scope="module")
def server(engine: KVBoostRAG) -> Iterator[tuple[str, KVBoostRAG]]:
    """The default model behind an API key."""
    served = new_engine(engine)
    with serving(served, ServerSettings(model_name="smollm", access=Access(api_keys=(KEY,)))) as url:
        yield url, served


@pytest.fixture(scope="module")
def client(server: tuple[str, KVBoostRAG]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0], api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")


def metric(text: str, name: str) -> float:
    """One sample's value from a /metrics page."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, f"{name} not in /metrics once"
    return values[0]


def raw(url: str, path: str, body: object, key: str | None = KEY) -> httpx.Response:
    """A POST as any HTTP client could send it (bytes as given, not validated by a client)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"} if key else {}
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url.removesuffix("/v1") + path, content=content, headers=headers, timeout=120)


# the official client ---------------------------------------------------------------------
def test_chat_completion_as_openai_shapes_it(client: openai.OpenAI, engine: KVBoostRAG) -> None:
    messages = [{"role": "user", "content": "Name a primary colour."}]
    response = client.chat.completions.create(model="smollm", messages=messages, temperature=0, max_tokens=6)
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and 0 < usage.completion_tokens <= 6
    expected = new_engine(engine).generate(messages, max_new_tokens=6)
    assert choice.message.content == expected.text, "greedy: the engine's own answer"
    assert usage.prompt_tokens == expected.prompt_tokens
    extra = response.model_extra["kvboost"]
    assert extra["ttft_s"] > 0 and "repair_tokens" in extra


def test_warmed_documents_are_reused_and_counted_as_cached(
    client: openai.OpenAI, server: tuple[str, KVBoostRAG], passages: list[str]
) -> None:
    documents = passages[:4]
    warmed = raw(server[0], "/kvboost/warm", {"documents": documents, "pin": True})
    assert warmed.status_code == 200 and warmed.json()["documents"] == 4
    again = raw(server[0], "/kvboost/warm", {"documents": documents})
    assert again.json()["skipped_documents"] == 4, "warm twice: no model work"
    shuffled = documents[::-1]
    response = client.chat.completions.create(
        model="smollm", messages=rag_messages("what is the first passage about?", shuffled), temperature=0, max_tokens=4
    )
    usage = response.usage
    assert usage.prompt_tokens_details.cached_tokens > 0.7 * usage.prompt_tokens
    stats = httpx.get(server[0].removesuffix("/v1") + "/kvboost/store", headers={"Authorization": f"Bearer {KEY}"})
    assert stats.status_code == 200 and stats.json()["memory"]["pinned"] > 0


def test_warm_places_documents_among_their_nearest_of_the_request_and_of_those_warmed_before(
    server: tuple[str, KVBoostRAG], passages: list[str]
) -> None:
    from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, groups_among, nearest_texts
    from kvboost_rag.plan.keys import content_hash
    from kvboost_rag.store.entry import ALONE, WarmedAfter

    url, engine = server

    def first_chunk(document: str) -> bytes:
        ids = np.asarray(engine.tokenizer(document, add_special_tokens=False).input_ids, np.int64)
        return content_hash(engine.keys.document, ids[: engine.boundaries(ids)[1]])

    def warmed_after(document: str) -> WarmedAfter:
        entry = engine.store.get_content(first_chunk(document))
        assert entry is not None
        return entry.warmed_after

    together, alone, later = passages[8:13], passages[13:15], passages[15]
    assert raw(url, "/kvboost/warm", {"documents": together}).status_code == 200
    by_text = dict(zip(together, nearest_texts(together, DEFAULT_NEIGHBOURS)))
    for group in groups_among(together, by_text.__getitem__):  # by default among its nearest
        assert all((warmed_after(d).context_tokens > 0) == (len(group) > 1) for d in group), group
    assert raw(url, "/kvboost/warm", {"documents": alone, "neighbours": 0}).status_code == 200
    assert [warmed_after(d) for d in alone] == [ALONE, ALONE]
    assert raw(url, "/kvboost/warm", {"documents": [later]}).status_code == 200
    record = warmed_after(later)
    assert len(record.neighbours) == DEFAULT_NEIGHBOURS, "a lone document: its nearest among those warmed before"
    assert all(engine.store.get_content(first) is not None for first in record.neighbours)
    assert record.found_by == f"all-MiniLM-L6-v2, {DEFAULT_NEIGHBOURS} nearest"


def test_streamed_chat_equals_the_whole_answer(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Count from one to five."}]
    whole = client.chat.completions.create(model="smollm", messages=messages, temperature=0, max_tokens=10)
    chunks = list(
        client.chat.completions.create(
            model="smollm",
            messages=messages,
            temperature=0,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2, "deltas as tokens come"


def test_completions_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="smollm", prompt="The capital of France is", temperature=0, max_tokens=5)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason in ("stop", "length")
    streamed = client.completions.create(
        model="smollm", prompt="The capital of France is", temperature=0, max_tokens=5, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text


def test_stream_ends_with_done(server: tuple[str, KVBoostRAG]) -> None:
    body = {"model": "smollm", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST", server[0] + "/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_models_unknown_model_and_wrong_key(client: openai.OpenAI, server: tuple[str, KVBoostRAG]) -> None:
    assert [m.id for m in client.models.list()] == ["smollm"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "model_not_found"
    stranger = openai.OpenAI(base_url=server[0], api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.chat.completions.create(model="smollm", messages=[{"role": "user", "content": "hi"}])
    assert raw(server[0], "/v1/chat/completions", {"model": "smollm"}, key=None).status_code == 401
    assert httpx.get(server[0].removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_our_options_reach_the_engine(client: openai.OpenAI, server: tuple[str, KVBoostRAG]) -> None:
    """The `kvboost` object takes the option table's call options, by the same names."""
    messages = [{"role": "user", "content": "Name a colour."}]
    ours = {"mode": "full", "store_prompt": False, "timeout_s": 60, "top_k": 1, "repair": "none", "refresh": True}
    response = client.chat.completions.create(
        model="smollm", messages=messages, temperature=0.7, max_tokens=4, extra_body={"kvboost": ours}
    )
    extra = response.model_extra["kvboost"]
    assert response.usage.prompt_tokens_details.cached_tokens == 0 and extra["repair_tokens"] == 0, "full prefill"
    expected = new_engine(server[1]).generate(messages, max_new_tokens=4, mode="full")  # top_k 1 is greedy
    assert response.choices[0].message.content == expected.text


def test_prompt_over_the_context_window(client: openai.OpenAI, engine: KVBoostRAG) -> None:
    long_text = "word " * (engine.max_context + 100)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="smollm", messages=[{"role": "user", "content": long_text}])
    assert error.value.code == "context_length_exceeded"


USER = [{"role": "user", "content": "hi"}]
BAD_BODIES = [
    ("n", {"messages": USER, "n": 2}),
    ("logprobs", {"messages": USER, "logprobs": True}),
    ("tools", {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}),
    ("response_format", {"messages": USER, "response_format": {"type": "json_object"}}),
    ("presence_penalty", {"messages": USER, "presence_penalty": 0.5}),
    ("frequency_penalty", {"messages": USER, "frequency_penalty": -1}),
    ("logit_bias", {"messages": USER, "logit_bias": {"50256": -100}}),
    ("content[0]", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ("messages", {"messages": []}),
    ("messages", {}),
    ("max_tokens", {"messages": USER, "max_tokens": "ten"}),
    ("max_tokens", {"messages": USER, "max_tokens": 0}),
    ("temperature", {"messages": USER, "temperature": 3}),
    ("frobnicate", {"messages": USER, "frobnicate": 1}),
    ("stream_options", {"messages": USER, "stream_options": {"include_usage": True}}),
    ("role", {"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}),
    ("stop", {"messages": USER, "stop": [""]}),
    ("top_k", {"messages": USER, "kvboost": {"top_k": -1}}),
    ("timeout_s", {"messages": USER, "kvboost": {"timeout_s": "1"}}),  # JSON's types: no number in a string
    ("timeout_s", {"messages": USER, "kvboost": {"timeout_s": 0}}),
    ("mode", {"messages": USER, "kvboost": {"mode": "fastest"}}),
    ("store_prompt_prefixes", {"messages": USER, "kvboost": {"store_prompt_prefixes": False}}),
]
BAD_COMPLETIONS = [
    ("echo", {"prompt": "x", "echo": True}),
    ("best_of", {"prompt": "x", "best_of": 2}),
    ("suffix", {"prompt": "x", "suffix": "y"}),
    ("prompt", {"prompt": ["a", "b"]}),
    ("prompt", {"prompt": [1, 2, 3]}),
]


@pytest.mark.parametrize(("param", "body"), BAD_BODIES + BAD_COMPLETIONS, ids=lambda x: x if isinstance(x, str) else "")
def test_bad_input_is_a_4xx_in_openais_shape(server: tuple[str, KVBoostRAG], param: str, body: dict) -> None:
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    response = raw(server[0], path, {"model": "smollm", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert param in error["message"] or param in (error["param"] or ""), error


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]", "null"])
def test_malformed_json_is_a_400(server: tuple[str, KVBoostRAG], body: bytes) -> None:
    response = raw(server[0], "/v1/chat/completions", body)
    assert response.status_code == 400 and "error" in response.json()


def test_warm_and_prune_refuse_bad_input(server: tuple[str, KVBoostRAG]) -> None:
    assert raw(server[0], "/kvboost/warm", {"documents": []}).status_code == 400
    assert raw(server[0], "/kvboost/warm", {"documents": ["ok", 3]}).status_code == 400
    assert raw(server[0], "/kvboost/warm", {"documents": "one text"}).status_code == 400
    assert raw(server[0], "/kvboost/warm", {"documents": ["ok"], "pin": "yes"}).status_code == 400
    assert raw(server[0], "/kvboost/warm", {"documents": ["ok"], "neighbours": -1}).status_code == 400
    assert raw(server[0], "/kvboost/warm", {"documents": ["a", "\ud800"]}).status_code == 400
    response = raw(server[0], "/kvboost/store/prune", {"budget_bytes": 0})
    assert response.status_code == 400 and "memory only" in response.json()["error"]["message"]


# a conversation ------------------------------------------------------------------------------
def test_the_next_turn_reuses_the_history(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Tell me something about the moon and about tides on the coast."},
    ]
    shares = []
    for turn in range(3):
        response = client.chat.completions.create(model="smollm", messages=messages, temperature=0, max_tokens=16)
        usage = response.usage
        shares.append(usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens)
        messages += [
            {"role": "assistant", "content": response.choices[0].message.content},
            {"role": "user", "content": f"Tell me one more thing, number {turn + 2}."},
        ]
    assert shares[0] == 0.0 and min(shares[1:]) > 0.6, shares


# frameworks pointed at the server --------------------------------------------------------------
def test_langchain_chat_openai_in_an_lcel_rag_chain(server: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from langchain_openai import ChatOpenAI

    raw(server[0], "/kvboost/warm", {"documents": passages[4:8]})
    llm = ChatOpenAI(base_url=server[0], api_key=KEY, model="smollm", temperature=0, max_tokens=8, max_retries=0)
    retriever = RunnableLambda(lambda question: "\n\n".join(reversed(passages[4:8])))
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Answer from the documents."), ("user", "{context}\n\n{question}")]
    )
    chain = {"context": retriever, "question": RunnablePassthrough()} | prompt | llm
    message = chain.invoke("What are these documents about?")
    assert message.content and message.usage_metadata["input_token_details"]["cache_read"] > 0
    streamed = "".join(
        (prompt | llm | StrOutputParser()).stream({"context": "Paris is in France.", "question": "Where?"})
    )
    assert streamed


def test_llama_index_openai_like_in_a_query_engine(server: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        api_base=server[0],
        api_key=KEY,
        model="smollm",
        is_chat_model=True,
        context_window=8192,
        max_tokens=8,
        temperature=0,
        max_retries=0,
    )
    index = VectorStoreIndex.from_documents(
        [Document(text=p) for p in passages[8:12]], embed_model=MockEmbedding(embed_dim=8)
    )
    response = index.as_query_engine(llm=llm, similarity_top_k=2).query("What is the first document about?")
    assert str(response).strip() and len(response.source_nodes) == 2


# one model, many clients -----------------------------------------------------------------------
def test_full_queue_is_a_429_and_a_disconnect_frees_the_model(tiny_engine: KVBoostRAG) -> None:
    with serving(
        on_empty_store(tiny_engine, EngineConfig(store="memory", max_running=1)), ServerSettings(max_waiting=0)
    ) as url:
        model = tiny_engine.name
        body = {"model": model, "messages": USER, "max_tokens": 1500, "temperature": 0, "stream": True}
        health = url.removesuffix("/v1") + "/health"
        with httpx.stream("POST", url + "/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines), next(lines)  # the stream is running
            busy = httpx.post(url + "/chat/completions", json={**body, "stream": False}, timeout=60)
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "rate_limit_exceeded"
        # the client went away: its generation stops after the current token
        deadline = time.monotonic() + 10
        while httpx.get(health).json()["active_requests"]:
            assert time.monotonic() < deadline, "the abandoned stream still holds the model"
            time.sleep(0.02)
        started = time.monotonic()
        done = httpx.post(url + "/chat/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=60)
        assert done.status_code == 200 and time.monotonic() - started < 5


def test_a_disconnect_frees_its_row_while_the_others_decode(tiny_engine: KVBoostRAG) -> None:
    expected = tiny_engine.generate(USER, max_new_tokens=1500).text
    with serving(
        on_empty_store(tiny_engine, EngineConfig(store="memory", max_running=4)), ServerSettings(max_waiting=0)
    ) as url:
        root, body = url.removesuffix("/v1"), {"model": tiny_engine.name, "messages": USER, "temperature": 0}
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        staying: list[str] = []
        ready = threading.Event()

        def stay() -> None:
            stream = client.chat.completions.create(**body, max_tokens=1500, stream=True)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    staying.append(chunk.choices[0].delta.content)
                    ready.set()

        thread = threading.Thread(target=stay)
        thread.start()
        assert ready.wait(30)
        with httpx.stream("POST", url + "/chat/completions", json={**body, "max_tokens": 1500, "stream": True}) as gone:
            lines = gone.iter_lines()
            next(lines), next(lines)
            assert metric(httpx.get(root + "/metrics").text, "kvboost:num_requests_running") == 2
        deadline = time.monotonic() + 5
        while metric(httpx.get(root + "/metrics").text, "kvboost:num_requests_running") != 1:
            assert time.monotonic() < deadline and thread.is_alive(), "the disconnected request kept its row"
            time.sleep(0.01)
        assert thread.is_alive()  # freed while the other still decodes
        thread.join(timeout=120)
    assert "".join(staying) == expected


def test_past_max_running_a_request_waits_for_a_place(tiny_engine: KVBoostRAG) -> None:
    """One decodes, one waits (it does not start until the first ends), the next is a 429."""
    with serving(
        on_empty_store(tiny_engine, EngineConfig(store="memory", max_running=1)), ServerSettings(max_waiting=1)
    ) as url:
        body = {"model": tiny_engine.name, "messages": USER, "max_tokens": 1500, "temperature": 0, "stream": True}
        waiting: dict[str, object] = {}

        def second() -> None:
            short = {**body, "stream": False, "max_tokens": 2}
            response = httpx.post(url + "/chat/completions", json=short, timeout=60)
            waiting.update(status=response.status_code, done=time.monotonic())

        with httpx.stream("POST", url + "/chat/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines), next(lines)  # the first request is decoding
            thread = threading.Thread(target=second)
            thread.start()
            health = url.removesuffix("/v1") + "/health"
            deadline = time.monotonic() + 10
            while httpx.get(health).json()["active_requests"] < 2:
                assert time.monotonic() < deadline, "the second request was not admitted"
                time.sleep(0.02)
            time.sleep(0.5)
            assert "done" not in waiting, "the second request ran beside the first"
            third = httpx.post(url + "/chat/completions", json={**body, "stream": False}, timeout=60)
            assert third.status_code == 429
            released = time.monotonic()
        thread.join(timeout=30)
        assert waiting["status"] == 200 and waiting["done"] >= released


def test_eight_streaming_clients_200_requests(tiny_engine: KVBoostRAG) -> None:
    """0 errors, nothing lost or cut short, and greedy answers equal the sequential ones."""
    prompts = [[{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}] for i in range(20)]
    alone = [tiny_engine.generate(p, max_new_tokens=8) for p in prompts]
    expected = [result.text for result in alone]
    with serving(
        on_empty_store(tiny_engine, EngineConfig(store="memory", max_running=8)), ServerSettings(max_waiting=8)
    ) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        order = [i % len(prompts) for i in range(200)]
        random.Random(0).shuffle(order)
        lock, failures, ttfts, rates = threading.Lock(), [], [], []

        def worker(mine: list[int]) -> None:
            for i in mine:
                started = time.perf_counter()
                try:
                    stream = client.chat.completions.create(
                        model=tiny_engine.name, messages=prompts[i], max_tokens=8, temperature=0, stream=True
                    )
                    text, first, finish = "", None, None
                    for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta.content:
                            first = first or time.perf_counter() - started
                            text += chunk.choices[0].delta.content
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    elapsed = time.perf_counter() - started
                    with lock:
                        if text != expected[i] or finish is None:
                            failures.append((i, text, expected[i], finish))
                        ttfts.append(first or elapsed)
                        rates.append(8 / elapsed)
                except Exception as error:  # noqa: BLE001 - every failure is counted, then asserted
                    with lock:
                        failures.append((i, repr(error)))

        threads = [threading.Thread(target=worker, args=(order[k::8],)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=600)
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10).text
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert failures == [] and len(ttfts) == 200
    # every answer counted, the clients' steps ran together, nothing left running or queued
    assert metric(metrics, 'kvboost:requests_total{route="/v1/chat/completions",status="200"}') == 200
    assert metric(metrics, 'kvboost:generation_tokens_total{tenant=""}') == sum(alone[i].new_tokens for i in order)
    rows_total, steps = (
        metric(metrics, "kvboost:decode_step_rows_sum"),
        metric(metrics, "kvboost:decode_step_rows_count"),
    )
    assert steps > 0 and rows_total / steps > 2
    assert metric(metrics, "kvboost:num_requests_running") == 0 and metric(metrics, "kvboost:num_requests_waiting") == 0
    p50, p95 = statistics.median(ttfts), statistics.quantiles(ttfts, n=20)[18]
    print(
        f"\n200 streamed requests, 8 clients: TTFT p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
        f"{statistics.median(rates):.1f} tokens/s per request"
    )


def test_cli_serve_reads_its_settings_from_the_environment_and_shares_a_redis_store(tiny_model_dir: Path) -> None:
    port = free_port()
    with local_redis() as redis_server:
        env = {
            **os.environ,
            "KVBOOST_RAG_PORT": str(port),
            "KVBOOST_RAG_STORE": redis_server.url,
            "KVBOOST_RAG_API_KEY": KEY,
            "KVBOOST_RAG_TENANT": "team-a=key-a team-b=key-b",  # a list: space-separated
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "kvboost_rag.cli", "serve", "--model", str(tiny_model_dir), "--dtype", "float32"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while True:
                assert process.poll() is None, process.stdout.read() if process.stdout else ""
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "kvboost-rag serve did not come up"
                time.sleep(0.2)
            headers = {"Authorization": f"Bearer {KEY}"}
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers)
            assert models.status_code == 200 and models.json()["data"][0]["id"]
            document = {"documents": ["Redis keeps what one worker warmed for every other worker."]}
            warmed = httpx.post(f"http://127.0.0.1:{port}/kvboost/warm", json=document, headers=headers, timeout=60)
            assert warmed.status_code == 200 and warmed.json()["chunks_stored"] == 1
            assert redis_server.client().dbsize() > 0, "warmed into the shared Redis store"
            stats = httpx.get(f"http://127.0.0.1:{port}/kvboost/store", headers=headers).json()
            assert [(t["tier"], t["models"][0]["documents"]) for t in stats["persistent"]] == [("RedisStore", 1)]
            tenant = {"Authorization": "Bearer key-b"}
            mine = httpx.get(f"http://127.0.0.1:{port}/kvboost/store", headers=tenant).json()
            assert mine["persistent"] == [{"tier": "RedisStore", "models": []}], "b lists nothing of the shared warm"
            assert httpx.get(f"http://127.0.0.1:{port}/metrics", headers=tenant).status_code == 403
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_the_readmes_openai_client_example_runs_against_the_server(
    server: tuple[str, KVBoostRAG], capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "OpenAI(" in b)
    url, engine = server
    pointed = block.replace("http://localhost:8000/v1", url).replace('"secret"', repr(KEY))
    exec(compile(pointed.replace('"SmolLM2-135M-Instruct"', '"smollm"'), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip(), "it printed the streamed answer"


def test_metrics_count_reused_prompt_tokens_and_store_hits(tiny_engine: KVBoostRAG, passages: list[str]) -> None:
    fresh = KVBoostRAG(tiny_engine.model, tiny_engine.tokenizer, EngineConfig(store="memory"), name=tiny_engine.name)
    with serving(fresh, ServerSettings()) as url:
        root = url.removesuffix("/v1")
        page = httpx.get(root + "/metrics")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
        assert "kvboost:store_hits" in page.text and "kvboost:generation_tokens_total{" not in page.text
        assert httpx.post(root + "/kvboost/warm", json={"documents": passages[:2], "neighbours": 0}).status_code == 200
        content = f"{passages[1]}\n\n{passages[0]}\n\nWhat are these about?"
        answer = httpx.post(
            url + "/completions", json={"model": fresh.name, "prompt": content, "max_tokens": 4}, timeout=60
        )
        assert answer.status_code == 200
        text = httpx.get(root + "/metrics").text
    reused = metric(text, 'kvboost:prompt_tokens_total{kind="reused_approximate",tenant=""}')
    computed = metric(text, 'kvboost:prompt_tokens_total{kind="computed",tenant=""}')
    assert reused > computed > 0 and reused + computed == answer.json()["usage"]["prompt_tokens"]
    assert metric(text, 'kvboost:store_hits_total{tier="memory"}') >= 2
    assert metric(text, "kvboost:time_to_first_token_seconds_count") == 1
    assert metric(text, 'kvboost:requests_total{route="/kvboost/warm",status="200"}') == 1


def test_ignore_eos_answers_max_tokens_as_vllm_does(tiny_engine: KVBoostRAG) -> None:
    with serving(tiny_engine, ServerSettings()) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        fixed = client.completions.create(
            model=tiny_engine.name, prompt="Hi", max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
        )
        refused = raw(url, "/v1/completions", {"model": tiny_engine.name, "prompt": "Hi", "ignore_eos": "yes"})
    assert (
        fixed.usage is not None and fixed.usage.completion_tokens == 40 and fixed.choices[0].finish_reason == "length"
    )
    assert refused.status_code == 400


# the Responses API ------------------------------------------------------------------------------
def test_responses_create_with_the_official_client_streaming_and_not(
    tiny_engine: KVBoostRAG, passages: list[str]
) -> None:
    """`client.responses.create`: text and message input, instructions, max_output_tokens, usage
    with cached tokens, streamed events, and a conversation continued by previous_response_id."""
    served = on_empty_store(tiny_engine, EngineConfig(store="memory"))
    reference = on_empty_store(tiny_engine, EngineConfig(store="memory", store_prompt=False))
    instructions, question = "Answer briefly.", f"{passages[0]}\n\nWhat is this about?"
    asked = [{"role": "system", "content": instructions}, {"role": "user", "content": question}]
    expected = reference.generate(asked, max_new_tokens=8, ignore_eos=True)
    with serving(served, ServerSettings()) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        common = dict(model=served.name, instructions=instructions, max_output_tokens=8, temperature=0)
        first = client.responses.create(input=question, **common, extra_body={"ignore_eos": True})
        assert first.object == "response" and first.id.startswith("resp")
        assert first.output_text == expected.text and first.status == "incomplete"  # stopped at max_output_tokens
        assert first.incomplete_details is not None and first.incomplete_details.reason == "max_output_tokens"
        usage = first.usage
        assert usage is not None and (usage.input_tokens, usage.output_tokens) == (expected.prompt_tokens, 8)
        assert usage.total_tokens == usage.input_tokens + usage.output_tokens
        parts = [{"role": "user", "content": [{"type": "input_text", "text": question}]}]
        events = list(client.responses.create(input=parts, stream=True, **common, extra_body={"ignore_eos": True}))
        kinds = [event.type for event in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-1] == "response.incomplete" and "response.output_text.done" in kinds
        streamed = "".join(event.delta for event in events if event.type == "response.output_text.delta")
        assert streamed == expected.text == events[-1].response.output_text
        assert [event.sequence_number for event in events] == list(range(len(events)))
        # the conversation goes on from the first response: its history kept, its KV reused
        follow = "And in one word?"
        second = client.responses.create(input=follow, previous_response_id=first.id, **common)
        history = [*asked, {"role": "assistant", "content": first.output_text}, {"role": "user", "content": follow}]
        again = reference.generate(history, max_new_tokens=8)
        assert second.output_text == again.text and second.usage.input_tokens == again.prompt_tokens
        assert second.usage.input_tokens_details.cached_tokens > expected.prompt_tokens // 2, "the kept turn reused"
        with pytest.raises(openai.BadRequestError, match="not found"):
            client.responses.create(input=follow, previous_response_id="resp-unknown", **common)
        tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
        with pytest.raises(openai.BadRequestError, match="tools"):
            client.responses.create(input=follow, tools=[tool], **common)  # type: ignore[list-item]
        image = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]
        for bad in ({"input": image}, {"input": 42}, {"input": "x", "max_output_tokens": 0}, {}):
            refused = httpx.post(url + "/responses", json={"model": served.name, **bad}, timeout=30)
            assert refused.status_code == 400 and refused.json()["error"]["message"], (bad, refused.text)
