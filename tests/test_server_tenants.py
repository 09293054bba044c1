"""Tenants on one server: a real HTTP server, the official `openai` client, a disk and a Redis tier.

What one tenant warmed or sent is never reused, counted, listed or continued for another; the shared
corpus (warmed with an API key) is read by all; store-wide routes take an API key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from kvboost_lab.http_server import serving_app
from kvboost_rag import KVBoostRAG
from kvboost_rag.server import Access, ServerSettings, create_app
from kvboost_rag.testing.redis_server import local_redis

ADMIN, KEY_A, KEY_B = "admin-key", "key-of-a", "key-of-b"
ACCESS = Access(api_keys=(ADMIN,), tenants={"team-a": (KEY_A,), "team-b": (KEY_B,)})
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def tenanted(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, KVBoostRAG]]:
    """A server of two tenants and an API key over memory, disk and Redis; its root URL."""
    with local_redis() as redis_server:
        store = f"{tmp_path_factory.mktemp('tenants') / 'store'},{redis_server.url}"
        engine = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store=store)
        settings = ServerSettings(model_name="tiny", access=ACCESS, temperature=0.0, neighbours=0)
        with serving_app(create_app(engine, settings)) as root:
            yield root, engine
        engine.store.close()


def client(root: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{root}/v1", api_key=key, max_retries=0, timeout=120)


def call(root: str, method: str, path: str, key: str, body: object = None) -> httpx.Response:
    return httpx.request(method, root + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def cached(root: str, key: str, prompt: str) -> int:
    answer = client(root, key).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=2
    )
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    return answer.usage.prompt_tokens_details.cached_tokens or 0


def question(*documents: str) -> str:
    return "\n\n".join(documents) + "\n\nQuestion: what are these about?"


def test_a_tenants_documents_are_no_other_tenants(tenanted: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    root, engine = tenanted
    warmed = call(root, "POST", "/kvboost/warm", KEY_A, {"documents": passages[:2]})
    assert warmed.status_code == 200 and warmed.json()["documents"] == 2
    assert cached(root, KEY_B, question(passages[1], passages[0])) == 0, "b finds none of a's documents"
    assert cached(root, KEY_A, question(passages[1], passages[0])) > 0
    mine, theirs = (call(root, "GET", "/kvboost/store", key).json() for key in (KEY_A, KEY_B))
    a_rows = [row for tier in mine["persistent"] for row in tier["models"]]
    assert {row["documents"] for row in a_rows} == {2} and len(a_rows) == 2, "a's documents in disk and Redis"
    assert all(tier["models"] == [] for tier in theirs["persistent"]), "b lists none of a's"
    assert mine["memory"]["entries"] > 0
    # b sent a prompt holding a's documents (kept by default) and warmed nothing: its own kept chunks only
    b_only = engine.store.stats(engine.namespace_fingerprints("team-b")).entries
    assert theirs["memory"]["entries"] == b_only and theirs["memory"]["documents"] <= 1
    everything = call(root, "GET", "/kvboost/store", ADMIN).json()
    assert everything["memory"]["entries"] == engine.store.stats().entries > mine["memory"]["entries"]


def test_a_sent_prompt_is_kept_for_its_tenant_only(tenanted: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    root, _ = tenanted
    prompt = question(passages[3], passages[4])
    head = cached(root, KEY_A, prompt)  # the chat template's opening, kept by a's earlier prompts
    assert cached(root, KEY_B, prompt) == cached(root, KEY_B, question(passages[5])), "a's prompt: b's head only"
    assert cached(root, KEY_A, prompt) > head


def test_the_shared_corpus_is_read_by_every_tenant(tenanted: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    root, _ = tenanted
    assert call(root, "POST", "/kvboost/warm", ADMIN, {"documents": passages[6:8]}).json()["documents"] == 2
    for key in (KEY_A, KEY_B):  # more than the tenant's own kept head: the documents too
        assert cached(root, key, question(passages[7], passages[6])) > cached(root, key, question(passages[8])) + 50
    # an API key's own prompts are not kept beside tenants: every tenant would read them
    private = question(passages[9], passages[10])
    cached(root, ADMIN, private)
    assert cached(root, ADMIN, private) == 0
    assert cached(root, KEY_B, private) == cached(root, KEY_B, question(passages[11])), "b's head only"


def test_a_conversation_is_continued_by_its_tenant_only(tenanted: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    root, _ = tenanted
    first = client(root, KEY_A).responses.create(model="tiny", input=question(passages[12]), max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client(root, KEY_B).responses.create(
            model="tiny", input="And then?", previous_response_id=first.id, max_output_tokens=2
        )
    assert refused.value.code == "previous_response_not_found"
    again = client(root, KEY_A).responses.create(
        model="tiny", input="And then?", previous_response_id=first.id, max_output_tokens=2
    )
    assert again.usage is not None and again.usage.input_tokens_details.cached_tokens > 0


def test_store_wide_routes_take_an_api_key(tenanted: tuple[str, KVBoostRAG], passages: list[str]) -> None:
    root, _ = tenanted
    cached(root, KEY_A, question(passages[14]))
    for path, method, body in (("/metrics", "GET", None), ("/kvboost/store/prune", "POST", {"budget_bytes": 2**40})):
        refused = call(root, method, path, KEY_B)
        if body is not None:
            refused = call(root, method, path, KEY_B, body)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error", path
        assert call(root, method, path, ADMIN, body).status_code == 200, path
    page = call(root, "GET", "/metrics", ADMIN).text
    assert 'kvboost:generation_tokens_total{tenant="team-a"}' in page
    assert call(root, "GET", "/v1/models", "not-a-key").status_code == 401
    assert httpx.get(root + "/metrics").status_code == 401


def test_access_from_flags_and_a_file(tmp_path: Path) -> None:
    keys = tmp_path / "tenants.json"
    keys.write_text(json.dumps({"tenants": {"team-a": ["k1", "k2"], "team-b": "k3"}, "api_keys": ["root"]}))
    access = Access.of(["admin"], ["team-c=k4", "team-a=k5"], keys)
    assert access.tenants == {"team-c": ("k4",), "team-a": ("k5", "k1", "k2"), "team-b": ("k3",)}
    assert access.api_keys == ("admin", "root")
    assert access.caller("k2") is not None and access.caller("k2").namespace == "team-a"  # type: ignore[union-attr]
    admin = access.caller("root")
    assert admin is not None and admin.admin and not admin.keeps_prompts and admin.namespace == ""
    assert access.caller("k") is None
    for bad, message in (
        ((["a"], ["team-a=a"], None), "given twice"),
        (([], ["team-a"], None), "NAME=KEY"),
        (([], ["bad name=k"], None), "namespace"),
        (([], ["team-a="], None), "non-empty"),
    ):
        with pytest.raises(ValueError, match=message):
            Access.of(*bad)  # type: ignore[arg-type]
    keys.write_text('{"tenants": {"team-a": 7}}')
    with pytest.raises(ValueError, match="a string or a list of strings"):
        Access.of(file=keys)
    keys.write_text("{not json")
    with pytest.raises(ValueError, match="tenants file"):
        Access.of(file=keys)
