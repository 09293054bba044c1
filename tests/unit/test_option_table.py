"""The option table drives every front-end: the same names, defaults and docs in the engine's
config, the command line's flags and the server's `kvboost` fields; the engine's errors as it
words them."""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

import pytest
import typer
from typer.testing import CliRunner

from kvboost_rag import EngineConfig, SamplingParams
from kvboost_rag.cli import app
from kvboost_rag.cli.options import FORMER_FLAGS, table_options
from kvboost_rag.options import (
    CALL_OPTIONS,
    ENGINE_OPTIONS,
    OPTIONS,
    OPTIONS_BY_NAME,
    check_options,
    known_options,
    stream_options,
)
from kvboost_rag.server.options import stream_arguments
from kvboost_rag.server.schemas import OPENAI_OPTIONS, ChatCompletionRequest, KVBoostOptions


def test_the_engine_options_are_the_config_fields() -> None:
    assert [o.name for o in ENGINE_OPTIONS] == [f.name for f in fields(EngineConfig)]
    assert all(o.default is None for o in ENGINE_OPTIONS), "None: the engine's default, or the store's"


def test_call_options_become_stream_arguments_by_the_engines_names() -> None:
    arguments = stream_options({"max_tokens": 8, "temperature": 0.5}, {"top_k": 3, "store_prompt": False}, "\n")
    sampling = arguments.pop("sampling")
    assert sampling == SamplingParams(max_new_tokens=8, temperature=0.5, top_k=3, stop=["\n"])
    assert arguments == {"mode": None, "repair": None, "exactness": None, "store_prompt": False, "timeout_s": None}
    with pytest.raises(TypeError, match=r"'max_new_tokens' \(did you mean 'max_tokens'\?\)"):
        stream_options({}, {"max_new_tokens": 3})
    with pytest.warns(DeprecationWarning, match="'timeout' is now 'timeout_s'"):
        assert stream_options({}, {"timeout": 2.0})["timeout_s"] == 2.0


def test_the_server_defaults_are_a_column_of_the_table() -> None:
    """A request that leaves an option out gets the table's default, OpenAI's where its clients expect them."""
    differing = {o.name: (o.default, o.server_default) for o in OPTIONS if o.server_default != o.default}
    assert differing == {"temperature": (0.0, 1.0), "max_tokens": (256, 512)}
    bare = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert stream_arguments(bare)["sampling"] == SamplingParams(max_new_tokens=512, temperature=1.0)
    assert stream_arguments(bare, temperature=0.0)["sampling"].temperature == 0.0  # serve --temperature
    given = bare.model_copy(update={"max_tokens": 7, "temperature": 0.3})
    assert stream_arguments(given)["sampling"] == SamplingParams(max_new_tokens=7, temperature=0.3)


def test_the_engines_errors_come_through_unchanged() -> None:
    with pytest.raises(ValueError, match="^max_new_tokens must be an integer >= 1, got 0$"):
        check_options({"max_tokens": 0})
    with pytest.raises(ValueError, match="^timeout_s must be > 0, got -1$"):
        check_options({"timeout_s": -1})
    with pytest.raises(TypeError, match=r"^unknown engine option: 'store_prompt_prefixes' \(did you mean 'store_pro"):
        EngineConfig.from_options(store_prompt_prefixes=False)
    with pytest.raises(TypeError, match="former name"):
        known_options({"timeout": 1, "timeout_s": 2}, {"timeout_s"})
    with pytest.raises(ValueError, match="^store names at most one directory and one Redis URL"):
        check_options({"store": "/one,/two"})  # at construction, not once the model is loaded


# the command line ----------------------------------------------------------------------------
def _flags(command: str) -> dict[str, Any]:
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in click_command.params}


def test_serve_takes_every_option_a_flag_can_carry_by_its_table_name_and_doc() -> None:
    flags = _flags("serve")
    expressible = {o.name for o in OPTIONS_BY_NAME.values()} - {"exactness", "sparse_decode"}
    expressible -= {o.name for o in CALL_OPTIONS if o.name not in ("mode", "repair", "store_prompt")}
    assert expressible <= set(flags)
    for name in expressible:
        assert flags[name].help == OPTIONS_BY_NAME[name].doc
        assert f"--{name.replace('_', '-')}" in flags[name].opts
        assert f"KVBOOST_RAG_{name.upper()}" in flags[name].envvar
    assert "--quantization" in flags["kv_quantization"].opts, "the former flag still works"
    assert _flags("warm")["kv_quantization"].opts == ["--kv-quantization", "--quantization"]


def test_a_command_gets_the_given_options_by_their_table_names() -> None:
    seen: dict[str, Any] = {}
    cli = typer.Typer()

    @cli.command()
    @table_options("kv_quantization", "memory_budget_bytes", "store_prompt", "repair", defaults={"repair": "none"})
    def command(name: Annotated[str, typer.Argument()], *, options: dict[str, Any]) -> None:
        seen.update(options, name=name)

    given = ["doc", "--quantization", "int4", "--memory-budget-bytes", "2GiB", "--no-store-prompt"]
    assert CliRunner().invoke(cli, given).exit_code == 0
    expected = {"kv_quantization": "int4", "memory_budget_bytes": 2 * 2**30, "store_prompt": False, "repair": "none"}
    assert seen == {**expected, "name": "doc"}
    refused = CliRunner().invoke(cli, ["doc", "--kv-quantization", "int2"])
    assert refused.exit_code == 2 and "int2" in refused.output
    assert set(FORMER_FLAGS) <= set(OPTIONS_BY_NAME)


def test_warm_refuses_a_bad_option_in_the_engines_words(tmp_path: Any) -> None:
    (tmp_path / "doc.txt").write_text("Paris is the capital of France.")
    result = CliRunner().invoke(app, ["warm", str(tmp_path), "--store", str(tmp_path / "s"), "--chunk-size", "0"])
    assert result.exit_code == 2 and "chunk_size must be an integer >= 1, got 0" in result.output


# the server ----------------------------------------------------------------------------------
def test_the_kvboost_request_fields_are_the_tables_call_options() -> None:
    ours = set(KVBoostOptions.model_fields) - {"refresh"}  # refresh: the JSON form of `exactness`
    assert ours | OPENAI_OPTIONS == {o.name for o in CALL_OPTIONS} - {"exactness"}
    for name in ours:
        assert KVBoostOptions.model_fields[name].description == OPTIONS_BY_NAME[name].doc


def _request(**fields: Any) -> ChatCompletionRequest:
    messages = [{"role": "user", "content": "hi"}]
    return ChatCompletionRequest.model_validate({"model": "m", "messages": messages, **fields})


def test_a_request_becomes_the_engines_arguments() -> None:
    ours = {"top_k": 2, "mode": "full", "store_prompt": False, "timeout_s": 3, "refresh": True}
    arguments = stream_arguments(_request(max_tokens=7, stop="\n", kvboost=ours))
    assert arguments.pop("sampling") == SamplingParams(max_new_tokens=7, temperature=1.0, top_k=2, stop=["\n"])
    assert arguments.pop("exactness").refresh
    assert arguments == {"mode": "full", "repair": None, "store_prompt": False, "timeout_s": 3.0}
    plain = stream_arguments(_request())
    assert plain["sampling"].max_new_tokens == 512 and plain["store_prompt"] is None and plain["exactness"] is None
    with pytest.raises(ValueError, match="^top_k must be an integer >= 0, got -1$"):  # the 400's message
        stream_arguments(_request(kvboost={"top_k": -1}))
