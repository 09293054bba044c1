"""EngineConfig: options by name, validation, and which fields a user chose."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from kvboost_rag.config import EngineConfig, ExactnessConfig, RepairConfig, check_option_names, engine_option_names


def test_from_options_builds_a_config() -> None:
    config = EngineConfig.from_options(chunk_size=64, match_window=8, mode="prefix", kv_quantization="int4")
    assert (config.chunk_size, config.match_window, config.mode, config.kv_quantization) == (64, 8, "prefix", "int4")
    assert EngineConfig.from_options() == EngineConfig()


def test_from_options_keeps_the_base_and_leaves_it_alone() -> None:
    base = EngineConfig(chunk_size=64, store="memory")
    config = EngineConfig.from_options(base, mode="full")
    assert (config.chunk_size, config.store, config.mode) == (64, "memory", "full")
    assert base.mode == "reuse"


@pytest.mark.parametrize(
    ("name", "hint"),
    [("chunk_sise", "chunk_size"), ("matchwindow", "match_window"), ("kv_quantisation", "kv_quantization")],
)
def test_an_unknown_option_is_named_with_the_closest_known_one(name: str, hint: str) -> None:
    with pytest.raises(TypeError) as error:
        EngineConfig.from_options(**{name: 1})
    message = str(error.value)
    assert message.startswith("unknown engine option:")
    assert repr(name) in message and f"did you mean {hint!r}?" in message


def test_several_unknown_options_are_all_named() -> None:
    with pytest.raises(TypeError, match=r"unknown engine options: 'modee' \(did you mean 'mode'\?\), 'zzzz'$"):
        EngineConfig.from_options(zzzz=1, modee="full", chunk_size=64)


def test_check_option_names_speaks_of_what_it_checks() -> None:
    check_option_names({"chunk_size": 1}, engine_option_names())
    with pytest.raises(TypeError, match="unknown server option: 'prot'"):
        check_option_names({"prot": 1}, {"port", "host"}, what="server option")
    with pytest.raises(TypeError, match=r"^unknown option: 'cache_dir' \(did you mean 'store'\?\)$"):
        check_option_names(["cache_dir"], engine_option_names(), "option", renamed={"cache_dir": "store"})
    assert {"chunk_size", "match_window", "store", "repair"} <= engine_option_names()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 12.5}, "chunk_size"),
        ({"chunking": "sentences"}, "chunking"),
        ({"adaptive_slack": 128}, "adaptive_slack"),
        ({"adaptive_slack": -1}, "adaptive_slack"),
        ({"match_window": 0}, "match_window"),
        ({"match_window": 129}, "match_window"),
        ({"chunk_size": 16, "adaptive_slack": 4, "match_window": 17}, "match_window"),
        ({"mode": "fast"}, "mode"),
        ({"kv_quantization": "int2"}, "kv_quantization"),
        ({"memory_budget_bytes": -1}, "memory_budget_bytes"),
        ({"disk_budget_bytes": -1}, "disk_budget_bytes"),
        ({"repair": "blend"}, "repair strategy"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_options(**options)


def test_a_warm_prefix_must_be_text() -> None:
    with pytest.raises(TypeError, match="warm_prefix"):
        EngineConfig(warm_prefix=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"strategy": "blend"},
        {"rho": 1.5},
        {"rho": -0.1},
        {"check_layer": -1},
        {"deviation": "query"},
        {"boundary_tokens": -1},
        {"tail_tokens": -1},
        {"min_reused_share": 2.0},
    ],
)
def test_bad_repair_values_are_refused(options: dict) -> None:
    with pytest.raises(ValueError):
        RepairConfig(**options)


def test_bad_verify_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="verify_margin"):
        ExactnessConfig(verify_margin=1.5)
    assert ExactnessConfig.off() == ExactnessConfig(verify_margin=0.0, refresh=False)


def test_values_are_normalized() -> None:
    assert EngineConfig(repair="boundary").repair == RepairConfig(strategy="boundary")
    assert EngineConfig.from_options(repair="none").repair.strategy == "none"
    assert EngineConfig(store=Path("/tmp/x")).store == "/tmp/x"  # type: ignore[arg-type]
    assert EngineConfig(store="memory").memory_only and not EngineConfig().memory_only


def test_a_config_is_frozen() -> None:
    """An engine given a config never changes it: a field cannot be assigned, only replaced."""
    config = EngineConfig(store="memory")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.mode = "full"  # type: ignore[misc]
    assert dataclasses.replace(config, mode="full").mode == "full" and config.mode == "reuse"
    assert hash(config) == hash(EngineConfig(store="memory"))


def test_settings_stand_on_nothing_above_them() -> None:
    """config.py imports no other module of the package, so every layer can read it."""
    import kvboost_rag.config

    tree = ast.parse(Path(kvboost_rag.config.__file__).read_text())
    imported = [(node.level, node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [(0, alias.name) for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert (0, "dataclasses") in imported, "the check reads the imports"
    assert [name for level, name in imported if level or name.startswith("kvboost_rag")] == []


def test_explicit_fields_are_those_off_their_defaults() -> None:
    assert EngineConfig().explicit_fields() == set()
    config = EngineConfig(chunk_size=64, mode="prefix", repair="boundary", store="/s")
    assert config.explicit_fields() == {"chunk_size", "mode", "repair", "store"}
    assert EngineConfig(chunk_size=128).explicit_fields() == set(), "a default value reads as not chosen"


def test_repair_with_strategy_overrides() -> None:
    repair = RepairConfig(rho=0.3)
    assert repair.with_strategy(None) is repair
    assert repair.with_strategy("boundary") == RepairConfig(strategy="boundary", rho=0.3)
    whole = RepairConfig(strategy="none")
    assert repair.with_strategy(whole) is whole


def test_exactness_defaults_save_work_and_checks_follow_verify_tokens() -> None:
    default = ExactnessConfig()
    assert not default.refresh, "refresh is opt-in: it costs a full prefill after the first token"
    assert default.checks(0) and not default.checks(1), "the first token only"
    every = ExactnessConfig(verify_tokens=None)
    assert every.checks(0) and every.checks(50)
    assert not ExactnessConfig(verify_tokens=0).checks(0) and not ExactnessConfig.off().checks(0)
    assert ExactnessConfig.exact_answer().refresh and ExactnessConfig.exact_answer().checks(0)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="verify_tokens"):
            ExactnessConfig(verify_tokens=bad)  # type: ignore[arg-type]
