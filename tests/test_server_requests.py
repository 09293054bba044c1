"""The server as curl, browsers and vLLM clients use it: bodies whatever their Content-Type,
CORS, no CDN-bound docs page, vLLM's top-level sampling fields, the server's default temperature
and sizes as the command line writes them. Over real HTTP, on a small random model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from kvboost_lab.http_server import serving_app
from kvboost_rag import EngineConfig, KVBoostRAG, SamplingParams
from kvboost_rag.server import Access, ServerSettings, create_app

KEY = "test-key"
ORIGIN = "http://app.example"
USER = [{"role": "user", "content": "Say something about the sea and the sea and the sea."}]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def serving(engine: KVBoostRAG, settings: ServerSettings) -> AbstractContextManager[str]:
    """The server on a free port until the block ends; yields its root URL."""
    return serving_app(create_app(engine, settings))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")


@pytest.fixture(scope="module")
def url(tiny: KVBoostRAG, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A disk store (so prune has something to prune), greedy by default, one allowed origin."""
    store = str(tmp_path_factory.mktemp("store"))
    engine = KVBoostRAG(tiny.model, tiny.tokenizer, EngineConfig(store=store), name="tiny")
    settings = ServerSettings(access=Access(api_keys=(KEY,)), temperature=0.0, neighbours=0, allowed_origins=(ORIGIN,))
    with serving(engine, settings) as root:
        yield root


def post(url: str, path: str, content: bytes | str, content_type: str | None, **headers: str) -> httpx.Response:
    """A POST with the body and Content-Type given (None: no such header), as curl or a page sends it."""
    sent = {"Authorization": f"Bearer {KEY}", **headers}
    if content_type is not None:
        sent["Content-Type"] = content_type
    return httpx.post(url + path, content=content, headers=sent, timeout=120)


def chat(url: str, **fields: object) -> httpx.Response:
    body = httpx.Request("POST", "/", json={"model": "tiny", "messages": USER, "max_tokens": 8, **fields}).content
    return post(url, "/v1/chat/completions", body, "application/json")


def greedy(tiny: KVBoostRAG, **sampling: float) -> str:
    fresh = KVBoostRAG(tiny.model, tiny.tokenizer, EngineConfig(store="memory"), name="tiny")
    return fresh.generate(USER, sampling=SamplingParams(max_new_tokens=8, **sampling)).text  # type: ignore[arg-type]


# bodies whatever the Content-Type -------------------------------------------------------------
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_a_json_body_is_read_whatever_the_content_type_says(url: str, content_type: str | None) -> None:
    """The README's `curl -d` (form-urlencoded), and clients that send text/plain or no header."""
    body = '{"documents": ["Paris\\nParis is the capital of France."], "pin": true}'
    warm = post(url, "/kvboost/warm", body, content_type)
    assert warm.status_code == 200, warm.text
    assert warm.json()["documents"] == 1
    body = '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    assert post(url, "/v1/chat/completions", body, content_type).status_code == 200


@pytest.mark.parametrize(
    ("content", "content_type", "says"),
    [
        ("documents=a&pin=true", "application/x-www-form-urlencoded", "not valid JSON (its Content-Type header says"),
        (b"\xff\xfe\x00", "text/plain", "(its Content-Type header says 'text/plain')"),
        ("{not json", None, "not valid JSON (it has no Content-Type header)"),
        ("[1, 2]", "text/plain", "must be a JSON object"),
        ("null", "application/json", "must be a JSON object"),
        ("", "application/x-www-form-urlencoded", "body is missing"),
    ],
)
def test_a_body_that_is_no_json_object_is_a_400_naming_the_content_type(
    url: str, content: str | bytes, content_type: str | None, says: str
) -> None:
    for path in ("/kvboost/warm", "/v1/chat/completions", "/v1/completions", "/kvboost/store/prune"):
        response = post(url, path, content, content_type)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert says in error["message"] and "None" not in error["message"], error


def test_a_page_of_another_origin_cannot_post_a_simple_request(url: str) -> None:
    """No CORS preflight guards a text/plain POST, so a page of an origin not allowed is refused
    (FastAPI's strict Content-Type rule) rather than read as JSON; an allowed origin's is read."""
    body = '{"documents": ["A page of another site tried to warm this."]}'
    refused = post(url, "/kvboost/warm", body, "text/plain", Origin="http://evil.example")
    assert refused.status_code == 400
    assert "Content-Type: application/json" in refused.json()["error"]["message"]
    allowed = post(url, "/kvboost/warm", body, "text/plain", Origin=ORIGIN)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN


def test_cors_preflights_answer_the_allowed_origins_only(url: str) -> None:
    asked = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = httpx.options(url + "/v1/chat/completions", headers={"Origin": ORIGIN, **asked})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    other = httpx.options(url + "/v1/chat/completions", headers={"Origin": "http://evil.example", **asked})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_no_cdn_bound_docs_page_but_the_schema(url: str) -> None:
    assert httpx.get(url + "/docs").status_code == 404 and httpx.get(url + "/redoc").status_code == 404
    schema = httpx.get(url + "/openapi.json")
    assert schema.status_code == 200 and "/v1/chat/completions" in schema.json()["paths"]


# sampling ---------------------------------------------------------------------------------------
def test_the_servers_default_temperature_applies_where_a_request_names_none(url: str, tiny: KVBoostRAG) -> None:
    response = chat(url)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == greedy(tiny)


def test_vllms_top_level_sampling_fields_reach_the_engine(url: str, tiny: KVBoostRAG) -> None:
    # below 1 the penalty favours the prompt's tokens: on a random model, a change surely seen
    plain, penalized = greedy(tiny), greedy(tiny, repetition_penalty=0.05)
    assert plain != penalized, "the penalty changes this greedy answer"
    answer = chat(url, repetition_penalty=0.05).json()["choices"][0]["message"]["content"]
    assert answer == penalized
    for only_the_top in ({"top_k": 1}, {"min_p": 1.0}, {"kvboost": {"min_p": 1.0}}):  # at temperature 1: greedy
        response = chat(url, temperature=1.0, **only_the_top)
        assert response.json()["choices"][0]["message"]["content"] == plain, only_the_top


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"min_p": 1.5}, "min_p must be in [0, 1]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be finite and > 0"),
        ({"top_k": "1"}, "top_k"),
        ({"top_k": 1, "kvboost": {"top_k": 2}}, "'top_k' is 1 at the top level but 2 under 'kvboost'"),
        ({"min_tokens": 2}, "Unrecognized request argument supplied: min_tokens"),  # vLLM's, not implemented
        ({"mirostat": 2}, "Unrecognized request argument supplied: mirostat"),  # llama-server's
    ],
)
def test_bad_or_unimplemented_sampling_fields_are_a_400(url: str, fields: dict[str, object], says: str) -> None:
    response = chat(url, **fields)
    assert response.status_code == 400 and says in response.json()["error"]["message"], response.text


# sizes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", ["2GiB", "500 MB", "1048576", 1048576])
def test_prune_takes_sizes_as_the_command_line_writes_them(url: str, budget: str | int) -> None:
    body = httpx.Request("POST", "/", json={"budget_bytes": budget}).content
    response = post(url, "/kvboost/store/prune", body, "application/json")
    assert response.status_code == 200 and response.json() == {"evicted_chunks": 0}, response.text


@pytest.mark.parametrize("budget", ["lots", "-1", -1, 1.5, True])
def test_prune_refuses_what_is_no_size(url: str, budget: object) -> None:
    body = httpx.Request("POST", "/", json={"budget_bytes": budget}).content
    response = post(url, "/kvboost/store/prune", body, "application/json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "budget_bytes", response.text
