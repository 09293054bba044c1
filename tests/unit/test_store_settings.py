"""Key settings recorded by a store, and how an engine's config is reconciled with them; the model
names it records for stats."""

from __future__ import annotations

import json

import pytest
import torch

from kvboost_rag.config import EngineConfig
from kvboost_rag.store.chunk_store import ChunkStore
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.disk.recovery import rebuild_index
from kvboost_rag.store.open import open_store, record_settings
from kvboost_rag.store.settings import KeySettings, StoreSettingsError, reconcile

SEMANTIC = KeySettings(chunking="semantic", chunk_size=64, adaptive_slack=8, kv_quantization="int4", warm_prefix="Doc:")


def test_key_settings_json_round_trip() -> None:
    for settings in (SEMANTIC, KeySettings.of(EngineConfig())):
        text = settings.to_json()
        assert KeySettings.from_json(text) == settings
        assert list(json.loads(text)) == sorted(json.loads(text)), "stable text: keys sorted"
    assert KeySettings.of(EngineConfig()) == KeySettings("fixed", 128, 16, "int8", "")
    assert KeySettings.of(EngineConfig()).to_json() == KeySettings("fixed", 128, 16, "int8", "").to_json()


def test_differences_name_each_setting_with_both_values() -> None:
    default = KeySettings.of(EngineConfig())
    assert default.differences(default) == {}
    assert default.differences(SEMANTIC) == {
        "chunking": ("fixed", "semantic"),
        "chunk_size": (128, 64),
        "adaptive_slack": (16, 8),
        "kv_quantization": ("int8", "int4"),
        "warm_prefix": ("", "Doc:"),
    }


def test_a_new_store_passes_the_config_through() -> None:
    config = EngineConfig(chunk_size=64, match_window=8)
    assert reconcile(config, [], None, "s") is config


def test_the_recorded_settings_are_adopted_where_the_config_is_at_defaults() -> None:
    config = EngineConfig(mode="prefix")
    adopted = reconcile(config, [SEMANTIC], 8, "s")
    assert KeySettings.of(adopted) == SEMANTIC
    assert adopted.match_window == 8
    assert adopted.mode == "prefix", "other settings are the config's"
    assert config.chunk_size == 128, "the config itself is left alone"


def test_an_explicit_value_equal_to_the_recorded_one_still_adopts_the_rest() -> None:
    adopted = reconcile(EngineConfig(chunk_size=64, kv_quantization="int4"), [SEMANTIC], None, "s")
    assert KeySettings.of(adopted) == SEMANTIC


def test_matching_settings_pass_through() -> None:
    config = EngineConfig(chunk_size=64)
    recorded = [KeySettings.of(EngineConfig()), KeySettings.of(config)]
    assert reconcile(config, recorded, 16, "s") is config


@pytest.mark.parametrize(
    ("option", "value"),
    [("chunk_size", 256), ("chunking", "adaptive"), ("kv_quantization", "int4"), ("warm_prefix", "Passage:")],
)
def test_an_explicit_other_value_fails_naming_the_setting(option: str, value) -> None:
    config = EngineConfig(**{option: value})
    with pytest.raises(StoreSettingsError, match=option) as error:
        reconcile(config, [KeySettings.of(EngineConfig())], 16, "/some/store")
    assert "/some/store" in str(error.value)
    assert f"{option}={value!r}" in str(error.value), "the engine's value"
    default = getattr(EngineConfig(), option)
    assert f"{option}={default!r}" in str(error.value), "and the store's"


def test_an_explicit_match_window_other_than_the_stores_fails() -> None:
    with pytest.raises(StoreSettingsError, match="match_window") as error:
        reconcile(EngineConfig(match_window=8), [], 16, "s")
    assert "16" in str(error.value) and "match_window=8" in str(error.value)
    assert reconcile(EngineConfig(match_window=16), [], 16, "s").match_window == 16


def test_a_default_match_window_adopts_the_stores() -> None:
    assert reconcile(EngineConfig(), [], 4, "s").match_window == 4


def test_two_adoptable_recorded_settings_are_ambiguous() -> None:
    other = KeySettings("fixed", 256, 16, None, "")
    with pytest.raises(StoreSettingsError, match="chunk_size=64.*chunk_size=256"):
        reconcile(EngineConfig(), [SEMANTIC, other], None, "s")


def test_open_store_adopts_what_an_earlier_engine_recorded(fakes, tmp_path) -> None:
    root = str(tmp_path / "store")
    first_config = EngineConfig(store=root, chunk_size=64, match_window=8, chunking="semantic")
    store, config = open_store(first_config, fakes.model_fp, torch.device("cpu"))
    assert config is first_config and len(store.tiers) == 1 and store.match_window == 8
    record_settings(store, fakes.keys.model, fakes.keys, config)
    store.tiers[0].close()

    store, config = open_store(EngineConfig(store=root), fakes.model_fp, torch.device("cpu"))
    assert (config.chunk_size, config.chunking, config.match_window) == (64, "semantic", 8)
    assert store.match_window == 8 and store.tiers[0].window == 8
    store.tiers[0].close()

    with pytest.raises(StoreSettingsError, match="chunk_size"):
        open_store(EngineConfig(store=root, chunk_size=32), fakes.model_fp, torch.device("cpu"))
    store, config = open_store(EngineConfig(store=root), fakes.doc_fp, torch.device("cpu"))
    assert config.match_window == 8, "the window belongs to the store, whatever the model"
    assert config.chunk_size == 128, "another model's documents: nothing recorded for it"
    store.tiers[0].close()


def test_a_memory_only_store_has_no_tier() -> None:
    config = EngineConfig(store="memory", match_window=8)
    store, returned = open_store(config, b"m" * 32, torch.device("cpu"))
    assert store.tiers == [] and returned is config and store.match_window == 8
    assert store.budget_bytes == config.memory_budget_bytes


def test_record_settings_reaches_every_tier(fakes, tmp_path) -> None:
    disks = [DiskStore(tmp_path / name, match_window=4) for name in "ab"]
    store = ChunkStore(1 << 20, 4, tiers=disks)
    record_settings(
        store, fakes.keys.model, fakes.keys, EngineConfig(chunk_size=32, match_window=4), name="unit-test-model"
    )
    for disk in disks:
        assert disk.recorded_settings(fakes.model_fp) == [KeySettings("fixed", 32, 16, "int8", "")]
        assert disk.index.model_names() == {fakes.model_fp: "unit-test-model", fakes.doc_fp: "unit-test-model"}
        disk.close()


def test_model_names_label_stats_and_survive_an_index_rebuild(fakes, tmp_path) -> None:
    disk = DiskStore(tmp_path / "store", match_window=4)
    document = fakes.document(32, band=1)
    for entry in document.entries:
        disk.put(entry)
    disk.put_document(document.record)
    assert [row.model for row in disk.stats()] == [""], "no name recorded yet"
    disk.record_names([fakes.model_fp, fakes.doc_fp], "first")
    disk.record_names([fakes.doc_fp], "renamed")
    assert [(row.fingerprint, row.model) for row in disk.stats()] == [(fakes.doc_fp.hex()[:16], "renamed")]
    disk.close()
    (disk.root / "index.sqlite").unlink()
    rebuild_index(disk.root)
    rebuilt = DiskStore(disk.root)
    assert rebuilt.index.model_names() == {fakes.model_fp: "first", fakes.doc_fp: "renamed"}
    assert [row.model for row in rebuilt.stats()] == ["renamed"]
    rebuilt.close()
