"""Namespaces: what one tenant warmed or sent is never reused, counted or listed for another."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvboost_rag import KVBoostRAG


def open_engine(model_dir: Path, store: Path | str) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(model_dir, dtype="float32", store=str(store))


def reused(engine: KVBoostRAG, prompt: str, namespace: str) -> int:
    plan = engine.plan(prompt, namespace=namespace)
    return plan.tokens("exact") + plan.tokens("approximate")


def test_a_namespace_finds_its_own_documents_and_the_shared_ones_only(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    engine = open_engine(tiny_model_dir, tmp_path / "store")
    engine.warm(passages[0], namespace="team-a")
    engine.warm(passages[1])  # the shared corpus
    own = f"{passages[0]}\n\nQuestion: what is this about?"
    public = f"{passages[1]}\n\nQuestion: what is this about?"
    assert reused(engine, own, "team-a") > 0
    assert reused(engine, own, "team-b") == 0, "another namespace's document is a miss"
    assert reused(engine, own, "") == 0, "the shared namespace does not read a tenant's"
    assert reused(engine, public, "team-b") > 0 and reused(engine, public, "team-a") > 0
    assert engine.warm(passages[0], namespace="team-b").skipped_documents == 0, "warm for b: encoded, not found"
    assert engine.warm(passages[0], namespace="team-a").skipped_documents == 1


def test_a_sent_prompt_is_kept_for_its_namespace_only(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    engine = open_engine(tiny_model_dir, "memory")
    prompt = f"{passages[2]}\n\n{passages[3]}\n\nQuestion: which one is first?"
    engine.generate(prompt, max_new_tokens=2, namespace="team-a")  # prompts are kept by default
    assert reused(engine, prompt, "team-a") > 0
    assert reused(engine, prompt, "team-b") == 0
    other = engine.generate(prompt, max_new_tokens=2, namespace="team-b")
    assert other.reused_exact_tokens == other.reused_approximate_tokens == 0


def test_a_namespace_is_apart_in_every_tier_for_a_later_process(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    writer = open_engine(tiny_model_dir, store)
    writer.warm(passages[4:6], namespace="team-a")
    writer.store.close()
    reader = open_engine(tiny_model_dir, store)  # a new memory tier: only the disk holds them
    prompt = f"{passages[5]}\n\n{passages[4]}\n\nQuestion: which one?"
    assert reused(reader, prompt, "team-b") == 0
    assert reused(reader, prompt, "team-a") > 0
    rows = {row.model: row for tier in reader.store.tiers for row in tier.stats()}
    assert rows[f"{reader.name} [team-a]"].documents == 2, rows
    assert reader.name not in rows, "nothing was warmed into the shared namespace"


@pytest.mark.parametrize(
    ("namespace", "error"), [("a b", ValueError), ("-a", ValueError), ("x" * 65, ValueError), (7, TypeError)]
)
def test_a_bad_namespace_is_refused_before_any_work(
    tiny_model_dir: Path, passages: list[str], namespace: object, error: type[Exception]
) -> None:
    engine = open_engine(tiny_model_dir, "memory")
    with pytest.raises(error, match="namespace"):
        engine.warm(passages[0], namespace=namespace)  # type: ignore[arg-type]
    with pytest.raises(error, match="namespace"):
        engine.stream("Hello", namespace=namespace)  # type: ignore[arg-type]
    assert engine.store.stats().entries == 0
