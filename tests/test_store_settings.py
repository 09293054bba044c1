"""A store knows how it was written: an engine adopts its settings or names the difference."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kvboost_rag import KVBoostRAG, StoreSettingsError
from kvboost_rag.store.disk.index import INDEX_SCHEMA_VERSION, DiskIndex, StoreVersionError


def open_engine(model_dir: Path, store: Path, **options: object) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(model_dir, dtype="float32", store=str(store), **options)


def test_defaults_adopt_what_the_store_was_written_with(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    writer = open_engine(tiny_model_dir, store, chunk_size=64, kv_quantization="int8", warm_prefix="Doc:")
    writer.warm(passages[:2])
    reader = open_engine(tiny_model_dir, store)  # every setting left at its default
    assert (reader.config.chunk_size, reader.config.kv_quantization, reader.config.warm_prefix) == (64, "int8", "Doc:")
    assert reader.document_fingerprint == writer.document_fingerprint
    assert reader.warm(passages[:2]).skipped_documents == 2, "the warmed documents are found, not rewarmed"
    prompt = f"{passages[1]}\n\n{passages[0]}\n\nQuestion: which one?"
    assert reader.generate(prompt, max_new_tokens=1, store_prompt=False).reused_approximate_tokens > 0


def test_a_quantized_store_adopted_with_no_settings_says_so_and_is_never_exact(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Quantized KV is not what full prefill computes: warmed documents, moved or in place, are
    APPROXIMATE to an engine that adopted the store's int4, and its first token is checked."""
    from kvboost_rag.engine.decode import DecodeObserver

    store = tmp_path / "store"
    writer = open_engine(tiny_model_dir, store, kv_quantization="int4")
    writer.warm(passages[:3])
    with caplog.at_level("WARNING", logger="kvboost_rag.store.settings"):
        reader = open_engine(tiny_model_dir, store)
    assert reader.config.kv_quantization == "int4"
    assert [r.getMessage() for r in caplog.records if "adopts" in r.getMessage()] == [
        f"kvboost-rag: store {store} was written with kv_quantization='int4': this engine adopts them "
        "(pass them, or use another store, to choose otherwise)"
    ]

    checked: list[int] = []

    class Watch(DecodeObserver):
        def lead(self, request: object) -> float:
            checked.append(1)
            return super().lead(request)  # type: ignore[arg-type]

    prompt = f"{passages[0]}\n\n{passages[2]}\n\nQuestion: which one is first?"
    first = reader.generate(prompt, max_new_tokens=3, store_prompt=False, observer=Watch())
    assert first.reused_approximate_tokens > 0 and first.reused_exact_tokens == 0 and first.exact_chunks == 0
    assert checked, "the first token on quantized KV went through the near-tie check"
    plan = reader.plan(passages[0] + "\n\nAnd?")  # the first document where it was warmed: in place
    assert plan.tokens("exact") == 0 and plan.tokens("approximate") > 0
    from typer.testing import CliRunner

    from kvboost_rag.cli import app

    stats = CliRunner().invoke(app, ["cache", "stats", "--store", str(store)])
    assert stats.exit_code == 0, stats.output
    assert [line for line in stats.output.splitlines() if line.startswith("written with")] == [
        f"written with ({tiny_model_dir}): chunking='fixed', chunk_size=128, adaptive_slack=16, "
        "kv_quantization='int4', warm_prefix=''"
    ]
    dense = open_engine(tiny_model_dir, tmp_path / "dense", kv_quantization="dense")  # the same without quantization
    dense.warm(passages[:3])
    assert dense.plan(passages[0] + "\n\nAnd?").tokens("exact") > 0, "dense chunks in place stay EXACT"


def test_an_explicit_other_setting_is_an_error_naming_it(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    open_engine(tiny_model_dir, store, chunk_size=64).warm(passages[:1])
    with pytest.raises(StoreSettingsError, match="chunk_size=64"):
        open_engine(tiny_model_dir, store, chunk_size=32)
    with pytest.raises(StoreSettingsError, match="match_window"):
        open_engine(tiny_model_dir, store, match_window=8)
    assert open_engine(tiny_model_dir, store, chunk_size=64).config.chunk_size == 64  # the same: fine


def test_memory_only_is_an_explicit_choice(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KVBOOST_RAG_CACHE_DIR", str(tmp_path / "cache"))
    # the model folder is given, so nothing is converted into this cache dir; the store goes there
    default = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32")
    assert [Path(t.root) for t in default.store.tiers] == [tmp_path / "cache" / "chunks"]
    memory = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")
    assert memory.store.tiers == []


def test_unknown_options_are_named(tiny_model_dir: Path) -> None:
    with pytest.raises(TypeError, match="'chunksize' \\(did you mean 'chunk_size'\\?\\)"):
        KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory", chunksize=64)


def test_the_index_records_its_schema_and_refuses_a_newer_one(tmp_path: Path) -> None:
    index = DiskIndex(tmp_path / "index.sqlite")
    assert index.meta("schema_version") == str(INDEX_SCHEMA_VERSION)
    index.close()
    with sqlite3.connect(tmp_path / "index.sqlite") as db:
        db.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(INDEX_SCHEMA_VERSION + 1),))
    with pytest.raises(StoreVersionError, match="upgrade"):
        DiskIndex(tmp_path / "index.sqlite")
